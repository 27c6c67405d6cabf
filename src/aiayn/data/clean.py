"""Cleaning parallel text as it streams by: each filter drops the pairs it is named after and
counts them, so that ``meta.json`` says exactly what became of every line read.

The filters, in the order a pair meets them (a pair is counted by the first that drops it):
``invalid_utf8`` (either side not UTF-8), ``empty`` (either side blank), ``too_long_words``
(over ``max_words`` whitespace words), ``ratio`` (Moses ``clean-corpus-n.perl -ratio``: one
side has more than ``ratio`` times the other's whitespace words), ``copy`` (source == target:
an untranslated line teaches the model to copy), ``language`` (opt-in: ``langid``), then,
for training pairs only, ``overlap`` (the pair or its source is in valid or test, exactly or
after ``normalise``) and ``duplicate`` (the exact pair was kept before).

Duplicates are found by hashing: one 8-byte BLAKE2b digest per kept pair, held as a Python
int in a set: 70 to 90 bytes a pair with the int's object and the set's slack (the table
doubles as it grows), about 450 MB for 5M pairs, the only memory that grows with the corpus;
it is freed before the vocabulary is trained, whose sample is prepare's peak. Two different pairs share a digest with probability about
n^2 / 2^65 (1e-6 for 5M pairs), which would drop one pair too many.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import UserError

FILTERS = (
    "invalid_utf8",
    "empty",
    "too_long_words",
    "ratio",
    "copy",
    "language",
    "overlap",
    "duplicate",
)
RATIO = 9.0  # clean-corpus-n.perl's own default; fairseq's recipes pass -ratio 1.5


@dataclass(frozen=True)
class Cleaning:
    """Which filters run; ``None`` or ``False`` turns one off."""

    ratio: float | None = RATIO
    max_words: int | None = None
    copies: bool = True
    duplicates: bool = True
    remove_overlap: bool = True  # False: overlap is counted and reported, the pairs kept
    langid: bool = False

    def __post_init__(self) -> None:
        # a ratio below 1 or max_words below 1 drop every pair: a mistake, not data's fault
        if self.ratio is not None and not (math.isfinite(self.ratio) and self.ratio >= 1):
            raise UserError(f"--ratio must be a number >= 1 (0: off), got {self.ratio}")
        if self.max_words is not None and not (
            isinstance(self.max_words, int) and self.max_words >= 1
        ):
            raise UserError(f"--max-words must be a number of words >= 1, got {self.max_words}")

    @classmethod
    def off(cls) -> Cleaning:
        """Only what cannot be trained on (empty, invalid): a curated corpus as it is."""
        return cls(ratio=None, copies=False, duplicates=False, remove_overlap=False)


def language_identifier(langs: tuple[str | None, str | None]) -> Callable[[str, str, str], bool]:
    """``fits(text, own, other)``: whether ``text`` may be in language ``own`` on a side whose
    pair is in ``other``, by py3langid (its model ships inside the package: nothing is
    downloaded). A side fails when ``other`` ranks above ``own`` (the sides swapped, or
    untranslated text: crawled corpora's usual fault) or ``own`` is not among the two most
    likely languages (a third language). Plain top-1 agreement drops good short sentences of
    close languages (Spanish taken for Galician); docs/data.md has both rules measured."""
    if None in langs:
        raise UserError("--langid checks each side's language: give --src-lang and --tgt-lang")
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise UserError("--langid needs py3langid: pip install py3langid") from None
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)

    def fits(text: str, own: str, other: str) -> bool:
        ranked = [lang for lang, _ in identifier.rank(text)]
        if own not in ranked:
            raise UserError(f"--langid: py3langid does not know the language {own!r}")
        rank = ranked.index(own)
        return rank < 2 and (other not in ranked or rank < ranked.index(other))

    return fits


def digest(*texts: str) -> int:
    """An 8-byte hash of ``texts`` (joined by a tab) as an int: what the duplicate set holds."""
    h = hashlib.blake2b("\t".join(texts).encode("utf-8"), digest_size=8)
    return int.from_bytes(h.digest(), "little")


_NOT_WORD = re.compile(r"[^\w\s]+")  # punctuation and symbols: neither letter, digit nor space


def normalise(text: str) -> str:
    """``text`` as the overlap check compares it: case folded, punctuation (and symbols)
    removed, runs of spaces made one (so "Hello, World!" and "hello world" are the same)."""
    return " ".join(_NOT_WORD.sub("", text.casefold()).split())


class HeldOut:
    """The valid and test pairs the training pairs are checked against: their pairs and
    sources, exactly and normalised, and which of them were found in train. Held as strings
    (held-out splits are small), so a match is never a hash's accident."""

    KINDS = ("pair", "source", "normalised_pair", "normalised_source")

    def __init__(self) -> None:
        self.keys: dict[str, dict[str, list[tuple[str, int]]]] = {k: {} for k in self.KINDS}
        self.sizes: dict[str, int] = {}
        self.found: dict[str, set[int]] = {}  # split -> indices of its pairs seen in train

    def add(self, split: str, pairs: Iterable[tuple[str, str]]) -> None:
        n = 0
        for i, (src, tgt) in enumerate(pairs):
            n_src = normalise(src)
            for kind, key in zip(self.KINDS, _keys(src, tgt, n_src)):
                self.keys[kind].setdefault(key, []).append((split, i))
            n += 1
        self.sizes[split] = n
        self.found[split] = set()

    def match(self, src: str, tgt: str) -> str | None:
        """The first kind of overlap of training pair (``src``, ``tgt``), if any, noting the
        held-out pairs it matches."""
        n_src = normalise(src)
        if n_src not in self.keys["normalised_source"]:  # every kind of match implies this one
            return None
        hit = None
        for kind, key in zip(self.KINDS, _keys(src, tgt, n_src)):
            for split, i in self.keys[kind].get(key, ()):
                self.found[split].add(i)
                hit = hit or kind
        return hit

    def report(self) -> dict[str, dict[str, int]]:
        """Per held-out split: its pairs, and how many of them were found in train."""
        return {
            s: {"pairs": self.sizes[s], "found_in_train": len(self.found[s])} for s in self.sizes
        }


def _keys(src: str, tgt: str, n_src: str) -> tuple[str, str, str, str]:
    return f"{src}\t{tgt}", src, f"{n_src}\t{normalise(tgt)}", n_src


class Cleaner:
    """Applies ``Cleaning`` to a stream of pairs, counting each filter's drops in ``counts``
    (training pairs are also checked against ``held_out``, and for duplicates)."""

    def __init__(
        self,
        cleaning: Cleaning,
        *,
        training: bool,
        held_out: HeldOut | None = None,
        language_fits: Callable[[str, str, str], bool] | None = None,
        langs: tuple[str | None, str | None] = (None, None),
    ) -> None:
        self.cleaning, self.training, self.held_out = cleaning, training, held_out
        self.language_fits, self.langs = language_fits, langs
        self.counts = {"read": 0, "kept": 0, **{f: 0 for f in FILTERS}}
        self.overlap = {k: 0 for k in HeldOut.KINDS}
        self._seen: set[int] = set()

    def keep(self, src: str | None, tgt: str | None) -> bool:
        """Whether the pair is kept; if not, the filter that dropped it is counted."""
        self.counts["read"] += 1
        reason = self._reason(src, tgt)
        if reason is None:
            self.counts["kept"] += 1
            return True
        self.counts[reason] += 1
        return False

    def _reason(self, src: str | None, tgt: str | None) -> str | None:
        c = self.cleaning
        if src is None or tgt is None:
            return "invalid_utf8"
        if not src or not tgt:
            return "empty"
        n_src, n_tgt = len(src.split()), len(tgt.split())
        if c.max_words is not None and max(n_src, n_tgt) > c.max_words:
            return "too_long_words"
        if c.ratio is not None and (n_src > c.ratio * n_tgt or n_tgt > c.ratio * n_src):
            return "ratio"
        if c.copies and src == tgt:
            return "copy"
        if c.langid and self.language_fits is not None and not self._languages_match(src, tgt):
            return "language"
        if self.training and self.held_out is not None:
            kind = self.held_out.match(src, tgt)
            if kind is not None:
                self.overlap[kind] += 1
                if c.remove_overlap:
                    return "overlap"
        if self.training and c.duplicates:
            key = digest(src, tgt)
            if key in self._seen:
                return "duplicate"
            self._seen.add(key)
        return None

    def forget_seen(self) -> None:
        """Free the digests of the pairs kept so far (the end of a duplicate-checked pass)."""
        self._seen = set()

    def _languages_match(self, src: str, tgt: str) -> bool:
        fits, (src_lang, tgt_lang) = self.language_fits, self.langs
        assert fits is not None and src_lang and tgt_lang  # set only with both languages known
        return fits(src, src_lang, tgt_lang) and fits(tgt, tgt_lang, src_lang)

    def summary(self, name: str) -> str:
        """One line: what was read, kept, and dropped by each filter that dropped any."""
        dropped = ", ".join(f"{self.counts[f]} {f}" for f in FILTERS if self.counts[f])
        return f"{name}: {self.counts['kept']} of {self.counts['read']} pairs kept" + (
            f"; dropped {dropped}" if dropped else ""
        )
