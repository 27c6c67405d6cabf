"""How sure a score is: BLEU, chrF and TER with their 95% bootstrap confidence intervals, the
paired significance of a difference between systems, per-sentence wins and losses, and the
paired test of runs repeated over seeds. Torch-free.

Every corpus statistic is sacrebleu's own (``sacrebleu.significance.PairedTest``), so the
numbers are those of ``sacrebleu REF -i BASE SYS --paired-bs`` (and ``--paired-ar``) on the
same files: the interval is sacrebleu's, the mean of the bootstrap resamples plus or minus
half the distance between their 2.5th and 97.5th percentiles; paired bootstrap resampling
(Koehn 2004) and approximate randomization (Riezler and Maxwell 2005) give two-sided p-values
of the difference against the first system, the baseline. The random seed is sacrebleu's:
12345, or the environment's ``SACREBLEU_SEED``; the signatures name it (``seed:``) and the
number of resamples (``bs:``).

A test set's bootstrap says how far the score could move on another test set drawn like this
one, for these very outputs. It says nothing about another training run: two runs of one
recipe with different seeds differ by more than that on small data. ``paired_permutation``
tests a difference across runs, one score per seed.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest, Result, estimate_ci

from ..errors import UserError

# The metrics by the names the command line takes; scores are keyed by sacrebleu's own names
# (BLEU, chrF2, TER). TER is an error rate: lower is better.
METRICS: dict[str, Callable[[], Metric]] = {"bleu": BLEU, "chrf": CHRF, "ter": TER}
SACREBLEU_NAMES = {"bleu": "BLEU", "chrf": "chrF2", "ter": "TER"}  # sacrebleu's, defaults
LOWER_IS_BETTER = frozenset({"TER"})
BOOTSTRAP = 1000  # sacrebleu's default resamples (--paired-bs-n, --confidence-n)
TRIALS = 10000  # sacrebleu's default approximate-randomization trials (--paired-ar-n)


@dataclass(frozen=True)
class MetricScore:
    """One system's score in one metric: the corpus score, the bootstrap mean and half-width
    of the 95% interval (``mean ± ci``), and against the baseline (None for the baseline
    itself) the p-values of paired bootstrap resampling and approximate randomization."""

    name: str
    score: float
    mean: float
    ci: float
    p_bootstrap: float | None = None
    p_ar: float | None = None

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"score": self.score, "mean": self.mean, "ci": self.ci}
        if self.p_bootstrap is not None:
            found |= {"p_bootstrap": self.p_bootstrap, "p_ar": self.p_ar}
        return found


def with_interval(score: Mapping[str, float]) -> str:
    """``score (mean ± ci)``: a score (``MetricScore.as_dict``) beside its bootstrap mean and
    the half-width of its 95% interval, as ``aiayn compare`` and the demo's report print it."""
    return f"{score['score']:.2f} ({score['mean']:.2f} ± {score['ci']:.2f})"


@dataclass(frozen=True)
class Significance:
    """Every system's scores (the baseline first) and the signatures they were made with."""

    names: list[str]
    scores: list[dict[str, MetricScore]]  # per system: metric name -> its score
    signatures: dict[str, str]  # metric name -> sacrebleu's signature, with bs: and seed:
    bootstrap: int
    trials: int


def metric_objects(names: Sequence[str]) -> dict[str, Metric]:
    """sacrebleu's metric for each name of ``METRICS``, with its default settings (the
    ones ``sacrebleu -m bleu chrf ter`` uses), statistics extracted once per system."""
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise UserError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}")
    return {name: _extract_once(METRICS[name]()) for name in names}


def _extract_once(metric: Metric) -> Metric:
    """``metric`` remembering each system's sufficient statistics: sacrebleu extracts them
    again in every test (the baseline's in every ``PairedTest``), and TER's take seconds a
    thousand sentences. One metric object scores one reference set, so the hypotheses are
    the key."""
    extract = metric._extract_corpus_statistics
    kept: dict[tuple[str, ...], Any] = {}

    def once(hypotheses: Sequence[str], references: Any) -> Any:
        key = tuple(hypotheses)
        if key not in kept:
            kept[key] = extract(hypotheses, references)
        return kept[key]

    metric._extract_corpus_statistics = once  # type: ignore[method-assign]
    return metric


def significance(
    systems: Sequence[tuple[str, Sequence[str]]],
    references: Sequence[str],
    metrics: Sequence[str] = tuple(METRICS),
    *,
    bootstrap: int = BOOTSTRAP,
    trials: int = TRIALS,
) -> Significance:
    """Score ``systems`` (name, one hypothesis a reference line), the first the baseline,
    with intervals, and test each other one against it both ways. One system alone gets its
    scores and intervals (the test of nothing is skipped)."""
    scorers = metric_objects(metrics)
    named: list[tuple[str, Sequence[str]]] = [(name, list(hyps)) for name, hyps in systems]
    streams = [list(references)]
    signatures, by_bootstrap = PairedTest(named, scorers, streams, "bs", bootstrap)()
    by_ar = PairedTest(named, scorers, streams, "ar", trials)()[1] if len(named) > 1 else {}
    scores = []
    for i in range(len(named)):
        found = {}
        for metric in signatures:
            # sacrebleu types a table's cells as str | Result; the rows past its header are Results
            bs = cast(Result, by_bootstrap[metric][i])
            ar = cast(Result, by_ar[metric][i]) if by_ar else None
            assert bs.mean is not None and bs.ci is not None  # resampling fills both
            found[metric] = MetricScore(
                name=metric,
                score=float(bs.score),
                mean=float(bs.mean),
                ci=float(bs.ci),
                p_bootstrap=None if bs.p_value is None else float(bs.p_value),
                p_ar=None if ar is None or ar.p_value is None else float(ar.p_value),
            )
        scores.append(found)
    return Significance(
        names=[name for name, _ in named],
        scores=scores,
        signatures={metric: sig.format() for metric, sig in signatures.items()},
        bootstrap=bootstrap,
        trials=trials,
    )


def sentence_scores(
    hypotheses: Sequence[str], references: Sequence[str], metric: str = "chrf"
) -> list[float]:
    """Each line's own score: sentence chrF, or sentence BLEU as ``sacrebleu
    --sentence-level`` computes it (effective n-gram order, so a short line is not zero)."""
    if metric not in ("chrf", "bleu"):
        raise UserError(f"sentence scores are chrf or bleu, not {metric!r}")
    scorer = CHRF() if metric == "chrf" else BLEU(effective_order=True)
    return [scorer.sentence_score(h, [r]).score for h, r in zip(hypotheses, references)]


def wins_losses(system: Sequence[float], baseline: Sequence[float]) -> dict[str, int]:
    """How many lines score higher, lower and the same as the baseline's."""
    pairs = list(zip(system, baseline))
    wins = sum(s > b for s, b in pairs)
    losses = sum(s < b for s, b in pairs)
    return {"wins": wins, "losses": losses, "ties": len(pairs) - wins - losses}


def paired_difference(
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    metric: str = "bleu",
    *,
    bootstrap: int = BOOTSTRAP,
) -> MetricScore:
    """``system`` minus ``baseline`` in ``metric``: the corpus difference, and the mean and
    half-width of the 95% interval of the difference over ``bootstrap`` paired resamples (the
    same resampled lines for both, drawn as sacrebleu draws them, with its seed), so that a
    difference comes with how far it could move on another test set drawn like this one."""
    scorer = metric_objects([metric])[metric]
    refs = [list(references)]
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    rng = np.random.default_rng(None if seed.lower() == "none" else int(seed))
    idxs = rng.choice(len(references), size=(bootstrap, len(references)), replace=True)
    resampled, corpus = [], []
    for hyps in (baseline, system):
        stats = np.array(scorer._extract_corpus_statistics(list(hyps), refs), dtype="float32")
        scores = [scorer._compute_score_from_stats(s.sum(0)).score for s in stats[idxs]]
        resampled.append(np.array(scores))
        corpus.append(scorer.corpus_score(list(hyps), refs).score)
    mean, ci = estimate_ci(resampled[1] - resampled[0])
    return MetricScore(
        name=SACREBLEU_NAMES[metric], score=corpus[1] - corpus[0], mean=float(mean), ci=float(ci)
    )


EXACT_RUNS = 16  # up to 2^16 sign patterns, enumerated; beyond, that many drawn at random


def paired_permutation(values: Sequence[float], baseline: Sequence[float]) -> float:
    """Two-sided p-value of the mean paired difference ``values[i] - baseline[i]`` (run i of
    each with the same seed) under the null hypothesis that the sign of each difference is
    chance: the share of the 2^n sign patterns whose mean is at least as far from zero as
    the one observed (the observed one counted). Exact, and free of any assumption about the
    spread of runs; its smallest p-value is 2 / 2^n, so n = 5 runs cannot reach 0.05 and
    n = 6 can."""
    if len(values) != len(baseline) or not values:
        raise ValueError(f"{len(values)} runs against {len(baseline)}: pairs needed")
    diffs = np.asarray(values, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    # signs: (patterns, n), each row one assignment of +1/-1 to the n differences
    if len(diffs) <= EXACT_RUNS:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(diffs))))
    else:
        drawn = np.random.default_rng(12345).integers(2, size=(1 << EXACT_RUNS, len(diffs)))
        signs = np.vstack([np.ones(len(diffs)), 1.0 - 2.0 * drawn])
    means = np.abs(signs @ diffs) / len(diffs)  # (patterns,)
    observed = abs(diffs.mean())
    return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


__all__ = [
    "BOOTSTRAP",
    "LOWER_IS_BETTER",
    "METRICS",
    "TRIALS",
    "MetricScore",
    "Significance",
    "metric_objects",
    "paired_difference",
    "paired_permutation",
    "sentence_scores",
    "significance",
    "wins_losses",
    "with_interval",
]
