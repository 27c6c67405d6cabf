"""Trees, preprocessing, linearisation and its repair, splits and parallel files."""

from __future__ import annotations

from pathlib import Path

import pytest
from _ptb_sample import fixture_split, fixture_trees, require_ptb_dir, sample_trees

from aiayn.parsing import (
    Tree,
    TreeSyntaxError,
    delinearize,
    linearize,
    parse_trees,
    preprocess,
    read_mrg,
    read_tree_lines,
    source_text,
    split_wsj,
    split_wsj_sample,
    to_bracketed,
    write_tree_lines,
    write_tree_pairs,
)
from aiayn.parsing.trees import strip_label

# Two trees in the .mrg layout, with function tags, co-indices, gapping (=) and traces.
MRG = """\
( (S
    (NP-SBJ-1 (DT The) (NN plan) )
    (VP (VBD was)
      (VP (VBN approved)
        (NP (-NONE- *-1) )
        (PP-LOC=2 (IN in)
          (NP (-LRB- -LRB-) (NNP Tokyo) (-RRB- -RRB-) ))))
    (. .) ))
( (SINV (`` ``) (S-TPC-2 (NP-SBJ (PRP It) ) (VP (VBZ works) (SBAR (-NONE- 0) (S (-NONE- *T*-3) ))))
    (, ,) ('' '') (VP (VBD said) (S (-NONE- *T*-2) )) (NP-SBJ (PRP he) ) (. .) ))
"""

CLEAN = [
    "(S (NP (DT The) (NN plan)) (VP (VBD was) (VP (VBN approved) (PP (IN in) "
    "(NP (-LRB- -LRB-) (NNP Tokyo) (-RRB- -RRB-))))) (. .))",
    "(SINV (`` ``) (S (NP (PRP It)) (VP (VBZ works))) (, ,) ('' '') (VP (VBD said)) "
    "(NP (PRP he)) (. .))",
]


@pytest.mark.parametrize(
    "label,stripped",
    [
        ("NP-SBJ-1", "NP"),
        ("PP-LOC=2", "PP"),
        ("NP=3", "NP"),
        ("S-TPC-2", "S"),
        ("S", "S"),
        ("-NONE-", "-NONE-"),
        ("-LRB-", "-LRB-"),
        ("-RRB-", "-RRB-"),
        ("PRP$", "PRP$"),
        ("PRT|ADVP", "PRT|ADVP"),
    ],
)
def test_strip_label(label: str, stripped: str) -> None:
    assert strip_label(label) == stripped


def test_mrg_preprocessing(tmp_path: Path) -> None:
    path = tmp_path / "wsj_9999.mrg"
    path.write_text(MRG)
    raw = read_mrg(path)
    assert [t.label for t in raw] == ["", ""]  # the outer bracket is unlabelled
    assert [to_bracketed(preprocess(t)) for t in raw] == CLEAN
    # The one-line form reads back to the same trees.
    write_tree_lines([preprocess(t) for t in raw] + [None], tmp_path / "gold.txt")
    assert [
        None if t is None else to_bracketed(t) for t in read_tree_lines(tmp_path / "gold.txt")
    ] == CLEAN + [None]


def test_top_bracket_dropped() -> None:
    (tree,) = parse_trees("(TOP (S (NP (NN it)) (VP (VBZ works))))")
    assert to_bracketed(preprocess(tree)) == "(S (NP (NN it)) (VP (VBZ works)))"


@pytest.mark.parametrize(
    "text,line,message",
    [
        ("(S (NP (DT a)) (VP (VB b))\n", 1, "unclosed '('"),
        ("(S\n  (NP (DT a)))\n)", 3, "unmatched ')'"),
        ("(S\n (NP (DT a) b))", 2, "'b': a word must be the only child"),
        ("(S\n\n (NP ))", 3, "constituent (NP has no children"),
        ("\n(DT a)", 2, "a lone preterminal"),
    ],
)
def test_syntax_errors_name_file_and_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = tmp_path / "bad.mrg"
    path.write_text(text)
    with pytest.raises(TreeSyntaxError) as err:
        read_mrg(path)
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert message in str(err.value)


def test_read_lines_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "test.txt"
    path.write_text("(S (NN a))\n(S (NN a)) (S (NN b))\n")
    with pytest.raises(TreeSyntaxError, match=r"test.txt:2: expected one tree, found 2"):
        read_tree_lines(path)


SENT = parse_trees("(S (NP (DT the) (NN dog)) (VP (VBZ barks)) (. .))")[0]


def test_linearize_is_the_papers_format() -> None:
    # Preterminals become XX alone: the words are the source, tags are not scored.
    assert " ".join(linearize(SENT)) == "(S (NP XX XX )NP (VP XX )VP XX )S"
    assert source_text(SENT) == "the dog barks ."


@pytest.mark.parametrize(
    "output,repaired_tree",
    [
        # Well-formed: nothing to repair.
        ("(S (NP XX XX )NP (VP XX )VP XX )S", "(S (NP (DT the) (NN dog)) (VP (VBZ barks)) (. .))"),
        # Rule 3: brackets left open are closed at the end.
        ("(S (NP XX XX (VP XX XX", "(S (NP (DT the) (NN dog) (VP (VBZ barks) (. .))))"),
        # Rule 2: )VP closes the open NP; the surplus )S has nothing open and is dropped.
        ("(S (NP XX XX )VP XX XX )S )S", "(S (NP (DT the) (NN dog)) (VBZ barks) (. .))"),
        # Rule 5: too many XX, the last two are cut and the VP left empty goes (rule 4).
        ("(S (NP XX XX )NP XX XX (VP XX XX )VP )S", "(S (NP (DT the) (NN dog)) (VBZ barks) (. .))"),
        # Rule 5: too few XX, the missing leaves are appended to the root.
        ("(S (NP XX )NP )S", "(S (NP (DT the)) (NN dog) (VBZ barks) (. .))"),
        # Rules 1, 4, 6: an unknown token and an empty PP dropped; two roots wrapped in S.
        (
            "(NP XX XX )NP (PP )PP (VP XX junk XX )VP",
            "(S (NP (DT the) (NN dog)) (VP (VBZ barks) (. .)))",
        ),
        # Rule 6: empty output is a flat S.
        ("", "(S (DT the) (NN dog) (VBZ barks) (. .))"),
    ],
)
def test_delinearize_repairs(output: str, repaired_tree: str) -> None:
    tree, repaired = delinearize(output.split(), SENT.words(), SENT.tags())
    assert to_bracketed(tree) == repaired_tree
    assert repaired == (output != "(S (NP XX XX )NP (VP XX )VP XX )S")


def test_word_leaves_option_writes_words_and_reads_any_word_as_a_leaf() -> None:
    assert " ".join(linearize(SENT, leaves="words")) == "(S (NP the dog )NP (VP barks )VP . )S"
    assert delinearize(
        linearize(SENT, leaves="words"), SENT.words(), SENT.tags(), leaves="words"
    ) == (SENT, False)
    # The model's words do not matter: the leaves take the source words, in order.
    tree, repaired = delinearize(
        "(S (NP a cat )NP (VP sleeps )VP ! )S".split(), SENT.words(), SENT.tags(), "words"
    )
    assert tree == SENT and not repaired
    # In the paper's XX mode the same output is all unknown tokens (rule 1).
    assert delinearize("(S (NP a cat )NP (VP sleeps )VP ! )S".split(), SENT.words(), SENT.tags())[1]


def test_index_leaves_option_marks_each_word_on_both_sides() -> None:
    assert " ".join(linearize(SENT, leaves="index")) == "(S (NP <1> <2> )NP (VP <3> )VP <4> )S"
    assert source_text(SENT, "index") == "<1> the <2> dog <3> barks <4> ."
    assert delinearize(
        linearize(SENT, leaves="index"), SENT.words(), SENT.tags(), leaves="index"
    ) == (SENT, False)
    # The leaves take the words in order whatever the markers say; a missing one is repaired.
    tree, repaired = delinearize(
        "(S (NP <4> <1> )NP (VP <2> )VP )S".split(), SENT.words(), SENT.tags(), "index"
    )
    assert to_bracketed(tree) == "(S (NP (DT the) (NN dog)) (VP (VBZ barks)) (. .))" and repaired


def test_tag_leaves_option_writes_tags_and_can_return_the_models_tags() -> None:
    assert " ".join(linearize(SENT, leaves="tags")) == "(S (NP DT NN )NP (VP VBZ )VP . )S"
    assert delinearize(
        linearize(SENT, leaves="tags"), SENT.words(), SENT.tags(), leaves="tags"
    ) == (SENT, False)
    # Scoring passes the gold tags; without them the tree carries the model's own tags.
    tree, repaired = delinearize(
        "(S (NP DT JJ )NP (VP VBD )VP . )S".split(), SENT.words(), leaves="tags"
    )
    assert tree.tags() == ["DT", "JJ", "VBD", "."] and not repaired
    # Repair keeps tags with their leaves: surplus tags are cut at the end, missing ones are XX.
    tree, repaired = delinearize(
        "(S (NP DT NN )NP VBZ . NN )S".split(), SENT.words(), leaves="tags"
    )
    assert tree.tags() == SENT.tags() and repaired
    tree, repaired = delinearize("(S (NP DT NN )NP )S".split(), SENT.words(), leaves="tags")
    assert to_bracketed(tree) == "(S (NP (DT the) (NN dog)) (XX barks) (XX .))" and repaired


def test_delinearize_default_tags_and_unlabelled_close() -> None:
    tree, repaired = delinearize("(S (NP XX XX ) (VP XX ) XX )".split(), SENT.words())
    assert to_bracketed(tree) == "(S (NP (XX the) (XX dog)) (VP (XX barks)) (XX .))"
    assert not repaired


def test_round_trip_every_fixture_tree() -> None:
    trees = [t for part in fixture_trees().values() for t in part]
    assert len(trees) == 23
    for tree in trees:
        assert delinearize(linearize(tree), tree.words(), tree.tags()) == (tree, False)


def test_fixture_split_and_preprocessing() -> None:
    split = fixture_split()
    assert [[p.name for p in files] for files in split] == [
        ["wsj_0001.mrg", "wsj_0002.mrg", "wsj_0003.mrg"],
        ["wsj_0180.mrg"],
        ["wsj_0190.mrg"],
    ]
    trees = fixture_trees()
    assert {name: len(part) for name, part in trees.items()} == {"train": 16, "dev": 4, "test": 3}
    train = trees["train"]
    # (NP-SBJ (-NONE- *)) goes, the small clause it was the subject of stays.
    assert to_bracketed(train[1]) == (
        "(S (NP (NP (DT A) (JJ small) (NN boat)) (, ,) (VP (VBN painted) (S (ADJP (JJ red)))) (, ,)) "
        "(VP (VBD drifted) (PP (IN down) (NP (DT the) (NN river)))) (. .))"
    )
    # (SBAR (-NONE- 0) (S (-NONE- *T*-1))) is empty once its traces go: all of it goes.
    assert to_bracketed(train[3]) == (
        "(S (S (NP (NNS Prices)) (VP (VBD rose) (NP (CD 3) (NN %)) (PP (IN in) (NP (NNP March))))) "
        "(, ,) (NP (DT the) (NN bank)) (VP (VBD said)) (. .))"
    )
    # Labels that begin with a dash are kept whole; the relative clause loses its trace subject.
    assert to_bracketed(train[6]) == (
        "(S (NP (NP (DT The) (NN museum)) (PRN (-LRB- -LRB-) (SBAR (WHNP (WDT which)) (S (VP (VBD opened) "
        "(PP (IN in) (NP (CD 1990)))))) (-RRB- -RRB-))) (VP (VBZ draws) (NP (JJ many) (NNS visitors))) (. .))"
    )
    labels = {tok for part in trees.values() for t in part for tok in linearize(t)}
    assert not any("-NONE-" in tok or "-" in tok[2:] for tok in labels)
    assert {"(SQ", "(PRT", "(PRN", "(WHADVP"} <= labels


def test_round_trip_every_sample_tree() -> None:
    trees = [t for part in sample_trees().values() for t in part]
    for tree in trees:
        assert delinearize(linearize(tree), tree.words(), tree.tags()) == (tree, False)


def test_sample_split_and_first_tree() -> None:
    split = split_wsj_sample(require_ptb_dir())
    assert [len(files) for files in split] == [179, 10, 10]
    assert (split.dev[0].name, split.test[-1].name) == ("wsj_0180.mrg", "wsj_0199.mrg")
    trees = sample_trees()
    assert {name: len(part) for name, part in trees.items()} == {
        "train": 3669,
        "dev": 127,
        "test": 118,
    }
    assert to_bracketed(trees["train"][0]) == (
        "(S (NP (NP (NNP Pierre) (NNP Vinken)) (, ,) (ADJP (NP (CD 61) (NNS years)) "
        "(JJ old)) (, ,)) (VP (MD will) (VP (VB join) (NP (DT the) (NN board)) (PP (IN as) "
        "(NP (DT a) (JJ nonexecutive) (NN director))) (NP (NNP Nov.) (CD 29)))) (. .))"
    )
    # Preprocessing leaves no trace, function tag or index anywhere.
    labels = {node for part in trees.values() for t in part for node in linearize(t)}
    assert not any("-NONE-" in tok or "=" in tok or "-" in tok[1:] for tok in labels)


def test_split_wsj_standard_sections(tmp_path: Path) -> None:
    for section in range(0, 25):
        (tmp_path / f"{section:02d}").mkdir()
        for k in range(3):
            (tmp_path / f"{section:02d}" / f"wsj_{section:02d}{k:02d}.mrg").touch()
    split = split_wsj(tmp_path)
    assert [len(files) for files in split] == [60, 3, 3]
    assert split.train[0].name == "wsj_0200.mrg" and split.train[-1].name == "wsj_2102.mrg"
    assert split.test[0] == tmp_path / "23" / "wsj_2300.mrg"


def test_split_wsj_missing_section(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="wsj_02xx.mrg"):
        split_wsj(tmp_path)


def test_write_parallel(tmp_path: Path) -> None:
    trees = [preprocess(t) for t in parse_trees(MRG)]
    n = write_tree_pairs(trees, tmp_path / "train.src", tmp_path / "train.tgt")
    assert n == 2
    assert (tmp_path / "train.src").read_text().splitlines() == [
        "The plan was approved in -LRB- Tokyo -RRB- .",
        "`` It works , '' said he .",
    ]
    assert (tmp_path / "train.tgt").read_text().splitlines()[0] == (
        "(S (NP XX XX )NP (VP XX (VP XX (PP XX (NP XX XX XX )NP )PP )VP )VP XX )S"
    )


def test_tree_is_a_value() -> None:
    a, b = parse_trees("(S (NN a)) (S (NN a))")
    assert a == b and hash(a) == hash(b) and isinstance(a, Tree)
