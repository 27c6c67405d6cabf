"""EVALB (COLLINS.prm) scores on hand-made trees, each number worked out in the comments."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from _ptb_sample import REPO_ROOT, fixture_trees, sample_trees

from aiayn.parsing import (
    COLLINS,
    Tree,
    delinearize,
    evalb_score,
    linearize,
    parse_trees,
    write_tree_lines,
)
from aiayn.parsing.evalb import EvalbAborted


def tree(text: str) -> Tree:
    (t,) = parse_trees(text)
    return t


# 1. Punctuation, function tags, ADVP = PRT.
#    Gold words without , and . : The dog barked loudly (0..4). Gold brackets:
#    NP(0,2) ADVP(3,4) [ADVP-MNR cut] VP(2,4) S(0,4) -> 4.
#    Test brackets: NP(0,1) ADVP(3,4) [PRT] VP(1,4) S(0,4) -> 4. Matched: ADVP, S -> 2.
#    Crossing: test VP(1,4) crosses gold NP(0,2) -> 1. Length with punctuation: 6.
PUNCT_GOLD = "(S (NP-SBJ (DT The) (NN dog)) (VP (VBD barked) (, ,) (ADVP-MNR (RB loudly))) (. .))"
PUNCT_TEST = "(S (NP (DT The)) (VP (NN dog) (VBD barked) (, ,) (PRT (RB loudly))) (. .))"
# 2. Spans are counted without punctuation, so a VP that takes in the final '.' still matches;
#    the NP over a trace covers no word and is dropped; -NONE- does not count for length.
#    Gold: NP(0,1) VP(1,2) S(0,2) -> 3; test the same 3 -> 3 matched, a complete match.
#    Length: John left . -> 3.
TRACE_GOLD = "(S (NP (NNP John)) (VP (VBD left) (NP (-NONE- *T*-1))) (. .))"
TRACE_TEST = "(S (NP (NNP John)) (VP (VBD left) (. .)))"
# 3. Unary chains and duplicate brackets count as often as they occur; TOP is deleted.
#    Gold: NP(0,1) x2, VP(1,2), S(0,2) -> 4. Test: NP(0,1), VP(1,2) x2, S(0,2) -> 4.
#    Matched: NP min(2,1)=1, VP min(1,2)=1, S 1 -> 3. Length 2.
UNARY_GOLD = "(TOP (S (NP (NP (NN dogs))) (VP (VBP bark))))"
UNARY_TEST = "(S (NP (NN dogs)) (VP (VP (VBP bark))))"
# 4. A test sentence with an extra word: "Length unmatch", an error sentence. Length 2.
EXTRA_GOLD = "(S (NP (PRP It)) (VP (VBZ works)))"
EXTRA_TEST = "(S (NP (PRP It)) (VP (VBZ works) (ADVP (RB well))))"
# 5. No test parse (a blank line): a skipped sentence. Length 3.
SKIP_GOLD = "(S (NP (PRP We)) (VP (VBD tried)) (. .))"

GOLD = [tree(t) for t in (PUNCT_GOLD, TRACE_GOLD, UNARY_GOLD, EXTRA_GOLD, SKIP_GOLD)]
TEST = [tree(t) for t in (PUNCT_TEST, TRACE_TEST, UNARY_TEST, EXTRA_TEST)] + [None]


@pytest.mark.parametrize(
    "i,status,matched,gold,test,crossing,length",
    [
        (0, 0, 2, 4, 4, 1, 6),
        (1, 0, 3, 3, 3, 0, 3),
        (2, 0, 3, 4, 4, 0, 2),
        (3, 1, 0, 0, 0, 0, 2),
        (4, 2, 0, 0, 0, 0, 3),
    ],
)
def test_sentence_scores(
    i: int, status: int, matched: int, gold: int, test: int, crossing: int, length: int
) -> None:
    s = evalb_score(GOLD, TEST).sentences[i]
    assert (s.status, s.matched, s.gold_brackets, s.test_brackets, s.crossing, s.length) == (
        status,
        matched,
        gold,
        test,
        crossing,
        length,
    )


# Valid sentences 1-3: matched 2+3+3 = 8 of 4+3+4 = 11 gold and 11 test brackets:
# R = P = F = 800/11 = 72.73. Complete match 1/3 = 33.33. Crossing 1/3 = 0.33 on average,
# none in 2 of 3 = 66.67. Tags: 4+2+2 = 8 words, all correct.
REPORT_ALL = """\
Number of sentence        =      5
Number of Error sentence  =      1
Number of Skip  sentence  =      1
Number of Valid sentence  =      3
Bracketing Recall         =  72.73
Bracketing Precision      =  72.73
Bracketing FMeasure       =  72.73
Complete match            =  33.33
Average crossing          =   0.33
No crossing               =  66.67
2 or less crossing        = 100.00
Tagging accuracy          = 100.00
"""
# len<=5 keeps sentences 2-5 (sentence 1 has 4 words but 6 with punctuation, which counts):
# valid 2 and 3: matched 6 of 7 and 7 -> 85.71; complete 1/2 = 50.00; no crossing.
REPORT_SHORT = """\
Number of sentence        =      4
Number of Error sentence  =      1
Number of Skip  sentence  =      1
Number of Valid sentence  =      2
Bracketing Recall         =  85.71
Bracketing Precision      =  85.71
Bracketing FMeasure       =  85.71
Complete match            =  50.00
Average crossing          =   0.00
No crossing               = 100.00
2 or less crossing        = 100.00
Tagging accuracy          = 100.00
"""


def test_report_matches_evalb_layout() -> None:
    result = evalb_score(GOLD, TEST, dataclasses.replace(COLLINS, cutoff_len=5))
    assert result.format_report() == (
        "=== Summary ===\n\n-- All --\n" + REPORT_ALL + "\n-- len<=5 --\n" + REPORT_SHORT
    )
    assert (result.n_sentences, result.n_errors, result.n_skipped) == (5, 1, 1)
    assert result.recall == result.precision == pytest.approx(800 / 11)
    assert result.f1 == pytest.approx(800 / 11)
    assert result.complete_match == pytest.approx(100 / 3)


def test_default_cutoff_is_40() -> None:
    result = evalb_score(GOLD, TEST)
    assert result.cutoff_len == 40 and "-- len<=40 --" in result.format_report()
    assert result.short.sentences == 5 and result.short.f1 == result.f1


def test_advp_prt_equivalence_and_function_tags() -> None:
    gold = [tree("(S (NP-SBJ (PRP He)) (VP (VBD gave) (PRT (RP up))))")]
    test = [tree("(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up))))")]
    assert evalb_score(gold, test).f1 == 100.0
    # Without the equivalence 3 of 4 brackets match.
    plain = dataclasses.replace(COLLINS, eq_labels=())
    assert evalb_score(gold, test, plain).f1 == 75.0


def test_words_unmatch_is_an_error() -> None:
    result = evalb_score([tree(EXTRA_GOLD)], [tree("(S (NP (PRP It)) (VP (VBZ worked)))")])
    assert (result.n_errors, result.all.valid) == (1, 0)


def test_xx_punctuation_does_not_line_up() -> None:
    # A delinearised tree with placeholder tags keeps its '.', the gold loses it:
    # 2 words against 3, an error. With the gold tags it scores like the gold.
    gold = tree(SKIP_GOLD)
    output = "(S (NP XX )NP (VP XX )VP XX )S".split()
    with_xx, _ = delinearize(output, gold.words())
    with_tags, _ = delinearize(output, gold.words(), gold.tags())
    assert evalb_score([gold], [with_xx]).n_errors == 1
    assert evalb_score([gold], [with_tags]).f1 == 100.0


def test_no_brackets_prints_nan_like_evalb() -> None:
    result = evalb_score([tree(SKIP_GOLD)], [None])
    assert "Bracketing FMeasure       =   -nan\n" in result.format_report()
    assert result.f1 == 0.0 and result.n_skipped == 1


def test_evalb_aborts_at_the_twelfth_error() -> None:
    gold, bad = tree(EXTRA_GOLD), tree(EXTRA_TEST)
    assert evalb_score([gold] * 11, [bad] * 11).n_errors == 11
    with pytest.raises(EvalbAborted, match="sentence 12"):
        evalb_score([gold] * 12, [bad] * 12)
    never = dataclasses.replace(COLLINS, max_error=None)
    assert evalb_score([gold] * 12, [bad] * 12, never).n_errors == 12


def test_sentence_counts_must_agree() -> None:
    with pytest.raises(ValueError, match="2 gold trees but 1 test trees"):
        evalb_score(GOLD[:2], TEST[:1])


def test_identical_fixture_trees_score_100() -> None:
    gold = [t for part in fixture_trees().values() for t in part]
    result = evalb_score(gold, gold)
    assert (result.precision, result.recall, result.f1, result.complete_match) == (
        100.0,
        100.0,
        100.0,
        100.0,
    )
    assert (result.n_sentences, result.n_errors, result.n_skipped) == (23, 0, 0)


def test_flat_output_on_the_fixture() -> None:
    # Every dev sentence one flat S: only the root bracket (S in all 4 trees) can match.
    # Gold brackets: "The dog barks ..." S NP VP PP NP NP = 6; "Her sister , a doctor , ..."
    # S NP NP NP VP PP NP PP NP = 9; "They said the bridge ..." S NP VP SBAR S NP VP VP PP NP
    # = 10; the 41-word one S + 8 x (S NP VP) + S NP VP ADVP = 29. All: 54.
    # R = 4/54 = 7.41, P = 4/4 = 100, F = 2PR/(P+R) = 13.79. len<=40 leaves out the 41 words:
    # R = 3/25 = 12.00, F = 2 * 100 * 12 / 112 = 21.43.
    gold = fixture_trees()["dev"]
    assert [len(t.words()) for t in gold] == [10, 13, 9, 41]
    result = evalb_score(gold, [delinearize([], t.words(), t.tags())[0] for t in gold])
    assert (result.all.matched, result.all.gold_brackets, result.all.test_brackets) == (4, 54, 4)
    assert (result.short.sentences, result.short.matched, result.short.gold_brackets) == (3, 3, 25)
    report = result.format_report()
    assert "Bracketing FMeasure       =  13.79\n" in report
    assert "Bracketing FMeasure       =  21.43\n" in report
    assert result.complete_match == 0.0


@pytest.mark.slow
def test_identical_sample_trees_score_100() -> None:
    gold = sample_trees()["test"]
    result = evalb_score(gold, gold)
    assert (result.precision, result.recall, result.f1, result.complete_match) == (
        100.0,
        100.0,
        100.0,
        100.0,
    )
    assert (result.n_sentences, result.n_errors, result.n_skipped) == (118, 0, 0)


def test_flat_output_on_sample_scores_below_100() -> None:
    # The worst deterministic parser: every sentence one flat S (repair of empty output).
    # Its only possible match is the root bracket: S in 121 of the 127 dev trees, which have
    # 2305 brackets. R = 12100/2305 = 5.25, P = 12100/127 = 95.28, F = 9.95.
    gold = sample_trees()["dev"]
    test = [delinearize([], t.words(), t.tags())[0] for t in gold]
    result = evalb_score(gold, test)
    totals = result.all
    assert (totals.valid, totals.matched, totals.gold_brackets, totals.test_brackets) == (
        127,
        121,
        2305,
        127,
    )
    assert "Bracketing FMeasure       =   9.95\n" in result.format_report()
    # ...and the gold linearised through delinearize is a perfect parser.
    perfect = [delinearize(linearize(t), t.words(), t.tags())[0] for t in gold]
    assert evalb_score(gold, perfect).f1 == 100.0


COLLINS_PRM = """\
DEBUG 0
MAX_ERROR 10
CUTOFF_LEN 40
LABELED 1
DELETE_LABEL TOP
DELETE_LABEL -NONE-
DELETE_LABEL ,
DELETE_LABEL :
DELETE_LABEL ``
DELETE_LABEL ''
DELETE_LABEL .
DELETE_LABEL_FOR_LENGTH -NONE-
EQ_LABEL ADVP PRT
"""


def _perturb(tokens: list[str], rng: random.Random) -> list[str]:
    """Drop, insert and relabel brackets at random: a plausible bad parser's output."""
    labels = ["NP", "VP", "S", "PP", "ADVP", "PRT", "SBAR", "TOP"]
    out = []
    for tok in tokens:
        r = rng.random()
        if r < 0.03:
            continue
        if r < 0.05:
            out.append("(" + rng.choice(labels))
        if r < 0.07 and tok[0] in "()":
            tok = tok[0] + rng.choice(labels)
        out.append(tok)
    return out


# The EVALB release unpacked (evalb.c, as Sekine and Collins distribute it), beside the checkout
# as the WSJ sample is, or where AIAYN_EVALB_SRC says; AIAYN_EVALB names an evalb already built.
EVALB_SOURCE = Path(os.environ.get("AIAYN_EVALB_SRC", REPO_ROOT.parent / "shared/tools/EVALB"))


@pytest.fixture(scope="module")
def evalb_program(tmp_path_factory) -> str:
    """The C program to compare with: AIAYN_EVALB, else evalb.c built here; a skip that says
    what is missing where there is neither the source nor a C compiler."""
    if os.environ.get("AIAYN_EVALB"):
        return os.environ["AIAYN_EVALB"]
    source = EVALB_SOURCE if EVALB_SOURCE.suffix == ".c" else EVALB_SOURCE / "evalb.c"
    if not source.is_file():
        pytest.skip(
            f"no EVALB to compare with: no {source}; set AIAYN_EVALB_SRC to the EVALB "
            "release's evalb.c (or its directory), or AIAYN_EVALB to a built evalb"
        )
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        pytest.skip(f"no C compiler (cc or gcc) to build {source}: apt-get install gcc")
    program = tmp_path_factory.mktemp("evalb") / "evalb"
    # gnu89: evalb.c defines its functions K&R style, which C23 compilers refuse
    build = [compiler, "-O2", "-w", "-std=gnu89", "-o", str(program), str(source)]
    built = subprocess.run(build, capture_output=True, text=True)
    assert built.returncode == 0, f"{' '.join(build)} failed:\n{built.stderr[-2000:]}"
    return str(program)


@pytest.mark.oracle
def test_matches_evalb_program(tmp_path: Path, evalb_program: str) -> None:
    rng = random.Random(0)
    gold = sample_trees()["dev"] + sample_trees()["test"]
    test: list[Tree | None] = [
        None
        if i % 50 == 7
        # a few skipped sentences
        else delinearize(_perturb(linearize(t), rng), t.words(), None if i % 60 == 3 else t.tags())[
            0
        ]  # a few length-unmatch errors
        for i, t in enumerate(gold)
    ]
    write_tree_lines(gold, tmp_path / "gold.txt")
    write_tree_lines(test, tmp_path / "test.txt")
    (tmp_path / "COLLINS.prm").write_text(COLLINS_PRM)
    out = subprocess.run(
        [
            evalb_program,
            "-p",
            str(tmp_path / "COLLINS.prm"),
            str(tmp_path / "gold.txt"),
            str(tmp_path / "test.txt"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ours = evalb_score(gold, test)
    assert ours.n_errors > 0 and ours.n_skipped > 0
    assert out[out.index("=== Summary ===") :] == ours.format_report()
