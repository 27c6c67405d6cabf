"""Labelled bracketing scores exactly as ``evalb -p COLLINS.prm gold test`` computes them.

This re-implements the EVALB program (Sekine & Collins, 1997; the 2013 release) for trees in
memory, so that the Table 4 F1 needs neither the C program nor files. Its rules, from the
source of ``evalb.c`` with the parameters of ``COLLINS.prm``:

* A sentence is read as EVALB reads one line. A preterminal whose tag is a DELETE_LABEL
  (``,`` ``:`` `````` ``''`` ``.`` ``-NONE-``; compared as written) is removed with its word
  *before* words are numbered, so spans are counted over the remaining words only.
* The length used for the ``len<=40`` cut is the gold sentence's number of preterminals
  except DELETE_LABEL_FOR_LENGTH (``-NONE-``): punctuation *does* count there.
* Each constituent gives a bracket (label, start, end) over those word indices; preterminals
  are not brackets. A bracket that covers no word is dropped; the label is cut at its first
  ``-`` or ``=`` (``NP-SBJ`` -> ``NP``); a bracket whose label is then a DELETE_LABEL (``TOP``)
  is dropped. Unary chains and repeated brackets all count: two ``NP`` over the same span
  are two brackets.
* Gold and test brackets are matched one-to-one on (start, end) and label, ADVP and PRT being
  equal (EQ_LABEL), so the number matched is a multiset intersection.
* A test sentence with no words left is *skipped*; one whose remaining words differ in number
  or spelling from the gold is an *error* ("Length unmatch", "Words unmatch"). Both count in
  "Number of sentence" but add no brackets. EVALB exits without a summary at its 12th error
  (MAX_ERROR 10); ``evalb_score`` raises ``EvalbAborted`` there, or never with
  ``max_error=None``.
* A sentence is a complete match when gold, test and matched bracket counts are equal. The
  crossing count is per test bracket that crosses some gold bracket. Tagging accuracy
  compares the tags of the remaining words.
* Recall = matched / gold brackets, precision = matched / test brackets, summed over valid
  sentences (a micro average), in percent; F = 2PR / (P + R).

Not reproduced: EVALB reads lines of at most 5000 bytes and at most 200 words or brackets
per sentence; QUOTE_LABEL and EQ_WORD (unused by COLLINS.prm); and different numbers of gold
and test sentences, which here raise ``ValueError``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import UserError
from .trees import Leaf, Tree

__all__ = [
    "EvalbParams",
    "COLLINS",
    "EvalbAborted",
    "SentenceScore",
    "EvalbTotals",
    "EvalbResult",
    "evalb_score",
]


@dataclass(frozen=True)
class EvalbParams:
    """An EVALB parameter file; the defaults are ``COLLINS.prm``.

    ``eq_labels`` pairs are treated as equivalence classes, which is exactly EVALB's
    pairwise test for COLLINS.prm's single pair.
    """

    delete_labels: frozenset[str] = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
    delete_labels_for_length: frozenset[str] = frozenset({"-NONE-"})
    eq_labels: tuple[tuple[str, str], ...] = (("ADVP", "PRT"),)
    cutoff_len: int = 40
    max_error: int | None = 10


COLLINS = EvalbParams()


class EvalbAborted(RuntimeError):
    """Raised where the EVALB program would exit after too many errors."""


@dataclass(frozen=True)
class SentenceScore:
    """One sentence's line of the EVALB table. ``status``: 0 valid, 1 error, 2 skip."""

    length: int
    status: int
    matched: int = 0
    gold_brackets: int = 0
    test_brackets: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0


@dataclass
class EvalbTotals:
    """Sums over a set of sentences, and the summary figures EVALB prints for them."""

    sentences: int = 0
    errors: int = 0
    skipped: int = 0
    matched: int = 0
    gold_brackets: int = 0
    test_brackets: int = 0
    complete: int = 0
    crossing: int = 0
    no_crossing: int = 0
    two_or_less_crossing: int = 0
    words: int = 0
    correct_tags: int = 0

    def add(self, s: SentenceScore) -> None:
        self.sentences += 1
        if s.status == 1:
            self.errors += 1
            return
        if s.status == 2:
            self.skipped += 1
            return
        self.matched += s.matched
        self.gold_brackets += s.gold_brackets
        self.test_brackets += s.test_brackets
        self.complete += s.gold_brackets == s.test_brackets == s.matched
        self.crossing += s.crossing
        self.no_crossing += s.crossing == 0
        self.two_or_less_crossing += s.crossing <= 2
        self.words += s.words
        self.correct_tags += s.correct_tags

    @property
    def valid(self) -> int:
        return self.sentences - self.errors - self.skipped

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold_brackets if self.gold_brackets else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test_brackets if self.test_brackets else 0.0

    @property
    def f1(self) -> float:
        """2PR/(P+R) in percent; 0.0 where EVALB prints ``-nan`` (no matched bracket)."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def complete_match(self) -> float:
        return 100.0 * self.complete / self.valid if self.valid else 0.0

    def summary_lines(self) -> list[str]:
        """The block EVALB prints under ``-- All --`` or ``-- len<=40 --``."""
        n = self.valid
        p, r = self.precision, self.recall
        f = f"{2 * p * r / (p + r):6.2f}" if p + r else "  -nan"  # C's 0.0/0.0 on x86-64
        return [
            f"Number of sentence        = {self.sentences:6d}",
            f"Number of Error sentence  = {self.errors:6d}",
            f"Number of Skip  sentence  = {self.skipped:6d}",
            f"Number of Valid sentence  = {n:6d}",
            f"Bracketing Recall         = {r:6.2f}",
            f"Bracketing Precision      = {p:6.2f}",
            f"Bracketing FMeasure       = {f}",
            f"Complete match            = {self.complete_match:6.2f}",
            f"Average crossing          = {(self.crossing / n if n else 0.0):6.2f}",
            f"No crossing               = {(100.0 * self.no_crossing / n if n else 0.0):6.2f}",
            "2 or less crossing        = "
            f"{(100.0 * self.two_or_less_crossing / n if n else 0.0):6.2f}",
            "Tagging accuracy          = "
            f"{(100.0 * self.correct_tags / self.words if self.words else 0.0):6.2f}",
        ]


@dataclass
class EvalbResult:
    """EVALB's two summaries: every sentence, and those of gold length <= ``cutoff_len``."""

    all: EvalbTotals
    short: EvalbTotals
    cutoff_len: int
    sentences: list[SentenceScore] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.all.precision

    @property
    def recall(self) -> float:
        return self.all.recall

    @property
    def f1(self) -> float:
        return self.all.f1

    @property
    def complete_match(self) -> float:
        return self.all.complete_match

    @property
    def n_sentences(self) -> int:
        return self.all.sentences

    @property
    def n_skipped(self) -> int:
        return self.all.skipped

    @property
    def n_errors(self) -> int:
        return self.all.errors

    def format_report(self) -> str:
        """The summary EVALB prints, from ``=== Summary ===`` on, character for character."""
        lines = [
            "=== Summary ===",
            "",
            "-- All --",
            *self.all.summary_lines(),
            "",
            f"-- len<={self.cutoff_len} --",
            *self.short.summary_lines(),
        ]
        return "\n".join(lines) + "\n"


@dataclass
class _Sentence:
    """What EVALB's ``read_line`` keeps of a tree."""

    words: list[str]
    tags: list[str]
    brackets: list[tuple[str, int, int]]  # (label after cutting and EQ_LABEL, start, end)
    length: int  # for the len<=40 cut: all preterminals but DELETE_LABEL_FOR_LENGTH


def _canonical_labels(params: EvalbParams) -> dict[str, str]:
    """Map every label of an EQ_LABEL class to one representative."""
    rep: dict[str, str] = {}
    for a, b in params.eq_labels:
        ra, rb = rep.get(a, a), rep.get(b, b)
        for label, r in list(rep.items()):
            if r == rb:
                rep[label] = ra
        rep[a], rep[b] = ra, ra
    return rep


def _cut_label(label: str) -> str:
    """EVALB's ``modify_label``: cut at the first ``-`` or ``=`` (``-NONE-`` -> empty)."""
    for i, ch in enumerate(label):
        if ch in "-=":
            return label[:i]
    return label


def _read(tree: Tree, params: EvalbParams, canon: dict[str, str]) -> _Sentence:
    sent = _Sentence([], [], [], 0)
    deleted = {canon.get(label, label) for label in params.delete_labels}

    def walk(node: Tree | Leaf) -> None:
        if isinstance(node, Leaf):
            sent.length += node.tag not in params.delete_labels_for_length
            if node.tag not in params.delete_labels:
                sent.words.append(node.word)
                sent.tags.append(canon.get(node.tag, node.tag))
            return
        start = len(sent.words)
        for child in node.children:
            walk(child)
        label = _cut_label(node.label)
        label = canon.get(label, label)
        if start < len(sent.words) and label not in deleted:
            sent.brackets.append((label, start, len(sent.words)))

    walk(tree)
    return sent


def _crossing(gold: list[tuple[str, int, int]], test: list[tuple[str, int, int]]) -> int:
    """Test brackets that cross at least one gold bracket (EVALB counts by test bracket)."""
    return sum(
        any(gs < ts < ge < te or ts < gs < te < ge for _, gs, ge in gold) for _, ts, te in test
    )


def _score(gold: _Sentence, test: _Sentence | None) -> tuple[SentenceScore, bool]:
    """One sentence's score, and whether EVALB reported an error for it."""
    if test is None or not test.words:
        return SentenceScore(gold.length, status=2), False
    if gold.words != test.words:
        return SentenceScore(gold.length, status=1), True
    matched = sum((Counter(gold.brackets) & Counter(test.brackets)).values())
    return SentenceScore(
        length=gold.length,
        status=0,
        matched=matched,
        gold_brackets=len(gold.brackets),
        test_brackets=len(test.brackets),
        crossing=_crossing(gold.brackets, test.brackets),
        words=len(gold.words),
        correct_tags=sum(g == t for g, t in zip(gold.tags, test.tags)),
    ), False


def evalb_score(
    gold_trees: Sequence[Tree],
    test_trees: Sequence[Tree | None],
    params: EvalbParams = COLLINS,
) -> EvalbResult:
    """Score ``test_trees`` against ``gold_trees`` as EVALB would score the two files of
    ``to_bracketed`` lines. ``None`` stands for a blank test line (a skipped sentence).

    Trees are taken as given: run ``preprocess`` on treebank trees first, and give test trees
    the gold tags (see ``delinearize``) or punctuation will not line up.
    """
    if len(gold_trees) != len(test_trees):
        raise UserError(f"{len(gold_trees)} gold trees but {len(test_trees)} test trees")
    canon = _canonical_labels(params)
    result = EvalbResult(EvalbTotals(), EvalbTotals(), params.cutoff_len)
    errors = 0
    for i, (gold, test) in enumerate(zip(gold_trees, test_trees), start=1):
        score, error = _score(
            _read(gold, params, canon), None if test is None else _read(test, params, canon)
        )
        errors += error
        if params.max_error is not None and errors > params.max_error + 1:
            raise EvalbAborted(
                f"sentence {i}: error {errors} (words differ from the gold); "
                f"EVALB exits after MAX_ERROR {params.max_error} + 1 errors"
            )
        result.sentences.append(score)
        result.all.add(score)
        if score.length <= params.cutoff_len:
            result.short.add(score)
    return result
