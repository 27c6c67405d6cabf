"""Glossaries: a term list whose terms, where their source occurs in a sentence, become that
sentence's lexical constraints (``decode.constraints``: the output must hold the target).

The file is one ``source<TAB>target`` pair a line, UTF-8 (``aiayn.files``' rule); blank lines
are skipped. The matching rules, chosen so that a term never fires inside another word or on
text its author did not write:

* on the sentence as given (detokenised text, not subwords: a glossary is written by people);
* case-sensitive ("Apple" is not "apple": a company is not a fruit); list each form wanted;
* whole words: a match may not start or end inside a word (``\\w``, Unicode-aware), so "cat"
  does not fire in "category"; runs of spaces in a term match any run of white space;
* leftmost-longest and without overlaps: of "New York" and "New York City", the longer wins
  where both start; a term that occurs twice is one constraint (the output holds it once).

A source given twice with two targets is refused, as are a line without exactly one tab and a
side that is blank; a target the vocabulary cannot spell (it would encode to the unknown
piece, which any output holding it would "meet") is refused by ``spelled``, naming the line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from ..errors import UserError, UserTypeError


@dataclass(frozen=True)
class Term:
    """One pair; ``where`` names it in errors ("g.tsv: line 3", "glossary[2]"); ``ids``: the
    target's pieces once ``Glossary.spelled``."""

    source: str
    target: str
    where: str
    ids: tuple[int, ...] = ()

    def pair(self) -> tuple[str, str]:
        return self.source, self.target


@dataclass(frozen=True)
class Glossary:
    """Terms (sources unique), and ``origin``, what messages call the glossary."""

    terms: tuple[Term, ...]
    origin: str = "glossary"

    @classmethod
    def read(cls, path: str | os.PathLike) -> Glossary:
        """The glossary file ``path`` (``source<TAB>target`` a line), or a one-line
        ``UserError`` naming its line."""
        from ..files import read_lines

        terms = []
        for n, line in enumerate(read_lines(path), start=1):
            if not line.strip():
                continue
            where = f"{path}: line {n}"
            if line.count("\t") != 1:
                raise UserError(
                    f"{where}: {line.count(chr(9))} tabs: a glossary line is source<TAB>target"
                )
            source, target = line.split("\t")
            terms.append(_term(source, target, where))
        return cls(_unique(terms, str(path)), str(path))

    @classmethod
    def of(cls, pairs: Mapping[str, str] | Sequence[Sequence[str]], name: str) -> Glossary:
        """Terms given as data: ``{source: target}`` or ``[[source, target], ...]`` (the
        server's ``glossary`` field, Python's ``glossary=``); ``name`` names its items."""
        if isinstance(pairs, Mapping):
            items: Iterable[Any] = ([s, t] for s, t in pairs.items())
        elif isinstance(pairs, Sequence) and not isinstance(pairs, (str, bytes)):
            items = pairs
        else:
            raise UserTypeError(
                f"{name} must be a file, {{source: target}} or [[source, target], ...], not "
                f"{type(pairs).__name__}"
            )
        terms = []
        for i, item in enumerate(items):
            where = f"{name}[{i}]"
            if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
                raise UserError(f"{where}: a term is a pair [source, target], not {item!r}")
            if not all(isinstance(side, str) for side in item):
                raise UserTypeError(f"{where}: source and target must be str, not {item!r}")
            terms.append(_term(item[0], item[1], where))
        return cls(_unique(terms, name), name)

    def merged(self, other: Glossary) -> Glossary:
        """These terms and ``other``'s, ``other``'s target winning for a source in both (a
        request's own over the server's)."""
        theirs = {t.source for t in other.terms}
        kept = tuple(t for t in self.terms if t.source not in theirs)
        return Glossary(kept + other.terms, f"{self.origin} and {other.origin}")

    def spelled(self, tokenizer: Any) -> Glossary:
        """This glossary with each target's pieces (``tokenizer.encode_target``), or a one-line
        ``UserError`` naming the first target the vocabulary cannot spell."""
        encode, unk_id = tokenizer.encode_target, tokenizer.unk_id  # the output side's pieces
        terms = []
        for term in self.terms:
            ids = encode(term.target)
            if unk_id in ids:
                unknown = "".join(dict.fromkeys(c for c in term.target if unk_id in encode(c)))
                raise UserError(
                    f"{term.where}: the target {term.target!r} has characters the vocabulary "
                    f"cannot spell ({unknown!r}): leave the term out"
                )
            terms.append(replace(term, ids=tuple(ids)))
        return replace(self, terms=tuple(terms))

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        # longest first: at one position the alternation takes the first that matches
        sources = sorted((t.source for t in self.terms), key=len, reverse=True)
        spelled = (r"\s+".join(map(re.escape, s.split())) for s in sources)
        return re.compile(r"(?<!\w)(?:" + "|".join(spelled) + r")(?!\w)")

    @cached_property
    def _by_source(self) -> dict[str, Term]:
        return {t.source: t for t in self.terms}

    def matches(self, sentence: str) -> tuple[Term, ...]:
        """The terms whose source occurs in ``sentence`` (the rules above), each once, in the
        order they first occur."""
        if not self.terms:
            return ()
        found = self._pattern.finditer(sentence)
        return tuple(dict.fromkeys(self._by_source[" ".join(m.group().split())] for m in found))


def _term(source: str, target: str, where: str) -> Term:
    for side, text in (("source", source), ("target", target)):
        if not text.strip():
            raise UserError(f"{where}: the {side} is blank: a glossary line is source<TAB>target")
    return Term(" ".join(source.split()), " ".join(target.split()), where)


def _unique(terms: list[Term], origin: str) -> tuple[Term, ...]:
    """``terms`` with each source once; a source given again with another target is refused."""
    seen: dict[str, Term] = {}
    for term in terms:
        first = seen.setdefault(term.source, term)
        if first.target != term.target:
            raise UserError(
                f"{term.where}: {term.source!r} again, with another target ({first.where} gives "
                f"{first.target!r}): give each source one target"
            )
    if not seen:
        raise UserError(f"{origin}: no terms (a glossary line is source<TAB>target)")
    return tuple(seen.values())


def load_glossary(given: Any, name: str) -> Glossary | None:
    """``given`` as a ``Glossary``: None, a ``Glossary``, a file's path, or terms as data
    (``Glossary.of``); ``name`` is what messages call the option."""
    if given is None or isinstance(given, Glossary):
        return given
    if isinstance(given, (str, os.PathLike)):
        if not os.path.isfile(given):
            raise UserError(f"{name} {given}: no such file")
        return Glossary.read(given)
    return Glossary.of(given, name)
