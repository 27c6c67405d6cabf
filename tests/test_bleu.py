"""BLEU on fixed strings: SacreBLEU's numbers and the paper's tokenised BLEU computed by hand."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from aiayn.metrics import atat_split, moses_tokenize, multi_bleu, paper_bleu, sacre_bleu

HYPS = ["The well-known cat sat on the mat.", "It is a test."]
REFS = ["The well-known cat sat on a mat.", "It is the test."]


def test_moses_and_compound_split():
    assert moses_tokenize('Das "rich-text" Format, 3,5 & mehr!', "de") == (
        "Das &quot; rich-text &quot; Format , 3,5 &amp; mehr !"
    )
    assert atat_split("rich-text format") == "rich ##AT##-##AT## text format"
    assert atat_split("a-b-c") == "a ##AT##-##AT## b-c"  # Perl's s///g does not overlap
    assert atat_split("- x -") == "- x -"


def test_paper_bleu_by_hand():
    # Tokenised + split, sentence 1 (10 tokens each):
    #   hyp: The well ##AT##-##AT## known cat sat on the mat .
    #   ref: The well ##AT##-##AT## known cat sat on a   mat .
    #   1-grams 9/10 (not "the"), 2-grams 7/9 (not "on the", "the mat"),
    #   3-grams 5/8 (not "sat on the", "on the mat", "the mat ."), 4-grams 4/7.
    # Sentence 2 (5 tokens each): hyp "It is a test ." ref "It is the test ."
    #   1-grams 4/5, 2-grams 2/4 ("It is", "test ."), 3-grams 0/3, 4-grams 0/2.
    # Corpus: p = 13/15, 9/13, 5/11, 4/9; c = r = 15, so BP = 1.
    # BLEU = (13*9*5*4 / (15*13*11*9)) ** (1/4) = (4/33) ** 0.25 = 0.590047...
    expected = 100 * (4 / 33) ** 0.25
    assert paper_bleu(HYPS, REFS, lang="en") == pytest.approx(expected, abs=1e-9)
    assert expected == pytest.approx(59.0047, abs=1e-4)


def test_paper_bleu_without_compound_split_by_hand():
    # Without ##AT## "well-known" is one token: sentence 1 has 8 tokens,
    # p = 7/8, 5/7, 3/6, 2/5; sentence 2 as above. Corpus p = 11/13, 7/11, 3/9, 2/7, BP = 1.
    # BLEU = (11*7*3*2 / (13*11*9*7)) ** 0.25 = (6/117) ** 0.25 = 47.588...
    expected = 100 * (6 / 117) ** 0.25
    assert paper_bleu(HYPS, REFS, lang="en", compound_split=False) == pytest.approx(
        expected, abs=1e-9
    )


@pytest.mark.parametrize(
    "hyp,ref,expected",
    [
        # c = 5 < r = 6: all precisions 1, BP = exp(1 - 6/5).
        ("the cat sat on the", "the cat sat on the mat", 100 * math.exp(1 - 6 / 5)),
        # no 4-gram at all: multi-bleu's log(0) -> BLEU 0 (no smoothing).
        ("a b c", "a b c d", 0.0),
        # identical
        ("a b c d e", "a b c d e", 100.0),
    ],
)
def test_multi_bleu_rules(hyp, ref, expected):
    assert multi_bleu([hyp], [ref]) == pytest.approx(expected, abs=1e-9)


def test_multi_bleu_closest_reference_length():
    # Two references of 4 and 6 tokens for a 5-token hypothesis: both are 1 away, multi-bleu
    # takes the shorter (4), so c = 5 > r = 4 and BP = 1. All n-grams match the 6-token one.
    hyp, refs = "a b c d e", [["x y z w"], ["a b c d e f"]]
    assert multi_bleu([hyp], refs) == pytest.approx(100.0, abs=1e-9)


def test_sacre_bleu_pinned():
    # 13a keeps "well-known" whole, so the counts are those of the no-split case above.
    score, signature = sacre_bleu(HYPS, REFS)
    assert score == pytest.approx(100 * (6 / 117) ** 0.25, abs=1e-9)
    assert signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    # "The cat sat ." vs "The cat sat on the mat .": p = 4/4, 2/3, 1/2, 0/1; SacreBLEU's exp
    # smoothing turns the first zero into 1/(2*1). BP = exp(1 - 7/4).
    # BLEU = exp(-0.75) * (1 * 2/3 * 1/2 * 1/2) ** 0.25 = 0.472367 * 0.638943 = 30.1815...
    score, _ = sacre_bleu(["The cat sat."], ["The cat sat on the mat."])
    assert score == pytest.approx(100 * math.exp(-0.75) * (1 / 6) ** 0.25, abs=1e-9)
    assert score == pytest.approx(30.18153515504547, abs=1e-9)
    # smooth_method="none" gives multi-bleu's 0 for the same pair
    assert sacre_bleu(["The cat sat."], ["The cat sat on the mat."], smooth_method="none")[0] == 0.0


@pytest.mark.lint  # a repository lint: `make lint` runs it
def test_metrics_module_needs_no_torch():
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('bleu', 'src/aiayn/metrics/bleu.py')\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
