"""aiayn.metrics.significance: intervals and paired tests are sacrebleu's to the digit, and the
paired permutation test of runs over seeds is exact (its p-values pinned by hand)."""

from __future__ import annotations

import pytest
from sacrebleu.compat import sentence_bleu, sentence_chrf
from sacrebleu.metrics import CHRF, TER

from aiayn.errors import UserError
from aiayn.metrics.significance import (
    metric_objects,
    paired_permutation,
    sentence_scores,
    significance,
    wins_losses,
)

REFS = [
    "the cat sat on the mat",
    "a dog ran in the park today",
    "it rained all day long",
    "she gave him the book",
    "we will meet again tomorrow",
    "the children played in the garden",
]
GOOD = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "it rained all day",
    "she gave him a book",
    "we meet again tomorrow",
    "the children played in a garden",
]
BAD = [
    "a cat on mat",
    "dog ran park today",
    "it rained all day long",
    "she gave the book",
    "we will meet tomorrow",
    "children played garden",
]


@pytest.mark.parametrize("metric,scorer", [("chrf", CHRF), ("ter", TER)])
def test_one_systems_interval_is_sacrebleus_confidence(metric, scorer):
    """One system alone: the interval of ``sacrebleu --confidence`` (corpus_score with
    n_bootstrap), the same seed."""
    expected = scorer().corpus_score(GOOD, [REFS], n_bootstrap=1000)
    (found,) = significance([("good", GOOD)], REFS, [metric]).scores[0].values()
    assert found.score == pytest.approx(expected.score)
    assert (found.mean, found.ci) == pytest.approx((expected._mean, expected._ci))
    assert found.p_bootstrap is None and found.p_ar is None


def test_two_systems_get_p_values_and_signatures_name_resamples_and_seed():
    tested = significance([("good", GOOD), ("bad", BAD)], REFS, ["bleu"], bootstrap=200)
    assert tested.names == ["good", "bad"]
    bad = tested.scores[1]["BLEU"]
    assert bad.score < tested.scores[0]["BLEU"].score
    assert 0 < bad.p_bootstrap <= 1 and 0 < bad.p_ar <= 1
    assert "|bs:200|seed:12345|" in tested.signatures["BLEU"]


def test_metrics_are_checked_and_extracted_once_per_system():
    with pytest.raises(UserError, match="unknown metric 'meteor'"):
        metric_objects(["bleu", "meteor"])
    (ter,) = metric_objects(["ter"]).values()
    first = ter._extract_corpus_statistics(GOOD, [REFS])
    assert ter._extract_corpus_statistics(list(GOOD), [REFS]) is first  # kept, not redone


def test_sentence_scores_are_sacrebleus_sentence_scores():
    assert sentence_scores(BAD, REFS, "chrf") == [
        sentence_chrf(h, [r]).score for h, r in zip(BAD, REFS)
    ]
    assert sentence_scores(BAD, REFS, "bleu") == [
        sentence_bleu(h, [r]).score for h, r in zip(BAD, REFS)
    ]
    with pytest.raises(UserError, match="chrf or bleu"):
        sentence_scores(BAD, REFS, "ter")


def test_wins_losses_ties():
    assert wins_losses([3.0, 1.0, 2.0, 2.0], [1.0, 2.0, 2.0, 0.5]) == {
        "wins": 2,
        "losses": 1,
        "ties": 1,
    }


@pytest.mark.parametrize(
    "values,baseline,expected",
    [
        ([3.0, 4.0, 5.0], [1.0, 1.0, 1.0], 2 / 8),  # all 3 differences one way: 2 of 8 patterns
        ([4.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0], 2 / 16),  # diffs 3 1 1 1: only +-6 reach 6
        ([4.0, 2.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0], 8 / 16),  # 3 1 1 -1: |sum| >= 4 in 8 of 16
        ([2.0, 3.0, -3.0], [1.0, 1.0, 1.0], 1.0),  # 1 2 -4: every pattern at least as far
        ([5.0], [1.0], 1.0),  # one pair: +d or -d, both as far
    ],
)
def test_paired_permutation_by_hand(values, baseline, expected):
    assert paired_permutation(values, baseline) == pytest.approx(expected)


def test_paired_permutation_beyond_exact_draws_sign_patterns():
    """Past 16 runs the 2^n patterns are sampled (the observed one counted)."""
    assert paired_permutation([1.0] * 20, [0.0] * 20) < 1e-4  # exactly 2 / 2^20
    assert paired_permutation([1.0, -1.0] * 10, [0.0] * 20) == 1.0  # mean 0: all as far
    with pytest.raises(ValueError, match="pairs needed"):
        paired_permutation([1.0, 2.0], [1.0])
