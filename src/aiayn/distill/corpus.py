"""The distilled corpus: of each source's n-best, the teacher's best or the one closest to the
reference by a sentence-level metric (as Bergamot's pipeline keeps the best of 8 by chrF), and
then the filter, on the teacher's own scores of what it wrote. Torch-free.

The filter drops a pair whose output is empty, was cut by the length limit (no eos: a
run-on), or that the teacher itself found unlikely: a perplexity per subword over
``max_ppl``, or among the ``drop_worst`` share with the lowest log-probability per subword.
These are the numbers ``aiayn score`` prints for the pair (forced decoding), which the search
already computed, so the filter costs no decoding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..metrics.significance import sentence_scores

SELECT = ("model", "chrf", "bleu")  # the teacher's own best, or the best by that metric


def best_by_metric(candidates: Sequence[str], reference: str, metric: str) -> int:
    """The index of the candidate with the highest sentence ``metric`` (chrf or bleu,
    ``sentence_scores``) against ``reference``; on a tie the first, the teacher's better."""
    scores = sentence_scores(list(candidates), [reference] * len(candidates), metric)
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def choose(nbest: Sequence[dict[str, Any]], reference: str, select: str) -> dict[str, Any] | None:
    """The hypothesis kept of one source's ``nbest`` (best first): the first for "model",
    else the best by that metric; None when there is none (a blank source)."""
    if select not in SELECT:
        raise UserError(f"select must be one of {', '.join(SELECT)}, not {select!r}")
    if not nbest:
        return None
    if select == "model" or len(nbest) == 1:
        return nbest[0]
    return nbest[best_by_metric([h["text"] for h in nbest], reference, select)]


def ppl(hypothesis: dict[str, Any]) -> float:
    """exp(-log P / |Y|): the teacher's perplexity per subword of its output (``Score.ppl``)."""
    return math.exp(-hypothesis["log_prob"] / max(hypothesis["length"], 1))


@dataclass(frozen=True)
class Filter:
    """What the filter drops beside empty and cut outputs: a perplexity per subword over
    ``max_ppl`` (None: no limit), and the ``drop_worst`` share (0 to 1) of what is left with
    the lowest log-probability per subword."""

    max_ppl: float | None = None
    drop_worst: float = 0.0

    def __post_init__(self) -> None:
        if self.max_ppl is not None and not self.max_ppl >= 1.0:
            raise UserError(f"--max-ppl is a perplexity, at least 1: got {self.max_ppl}")
        if not 0.0 <= self.drop_worst < 1.0:
            raise UserError(f"--drop-worst is a share from 0 to below 1: got {self.drop_worst}")


def distil(
    sources: Sequence[str],
    references: Sequence[str],
    nbest: Sequence[Sequence[dict[str, Any]]],
    select: str = "model",
    keep: Filter = Filter(),
) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The (source, teacher output) pairs kept, in the sources' order, and how many each rule
    dropped: ``empty`` (a blank source or output), ``cut``, ``max_ppl``, ``drop_worst``."""
    if not len(sources) == len(references) == len(nbest):
        raise UserError(
            f"{len(sources)} sources, {len(references)} references and {len(nbest)} n-best "
            "lists: the teacher's output does not match the training data"
        )
    counts = {"read": len(sources), "empty": 0, "cut": 0, "max_ppl": 0, "drop_worst": 0}
    kept: list[tuple[int, dict[str, Any]]] = []
    for i, (ref, hyps) in enumerate(zip(references, nbest)):
        hyp = choose(hyps, ref, select)
        if hyp is None or not hyp["text"].strip():
            counts["empty"] += 1
        elif hyp.get("cut", False):
            counts["cut"] += 1
        elif keep.max_ppl is not None and ppl(hyp) > keep.max_ppl:
            counts["max_ppl"] += 1
        else:
            kept.append((i, hyp))
    worst = int(len(kept) * keep.drop_worst)
    if worst:
        by_likelihood = sorted(kept, key=lambda ih: (-ppl(ih[1]), ih[0]))  # least likely first
        dropped = {i for i, _ in by_likelihood[:worst]}
        kept = [(i, h) for i, h in kept if i not in dropped]
        counts["drop_worst"] = worst
    counts["kept"] = len(kept)
    return [(sources[i], hyp["text"]) for i, hyp in kept], counts
