"""Parsing pipeline: prepare, atomic brackets, decoded pieces back to trees, and evaluate/parse
with a tiny model trained for a few updates.

Everything runs on the tiny treebank under ``tests/fixtures/treebank``; the tests of the
prepared data run again on a few files of the WSJ sample when it is present (its sentences are
longer and its tokens more varied), the model tests on the fixture only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from _cli import one_line_error, run_cli
from _ptb_sample import FIXTURE_DIR, fixture_split, require_ptb_dir

from aiayn.data import TokenDataset, Vocab
from aiayn.decode import DecodeConfig
from aiayn.parsing import (
    WsjSplit,
    delinearize,
    evalb_score,
    is_bracket,
    linearize,
    parse_trees,
    pipeline,
    read_tree_lines,
    read_treebank,
    split_wsj_sample,
    to_bracketed,
)
from aiayn.parsing.pipeline import (
    MIN_INDEX_TOKENS,
    _parse_words,
    evaluate_parser,
    ids_to_tokens,
    leaf_tokens,
    parse_lines,
    prepare_parsing,
    prepared_leaves,
    text_paths,
    trained_leaves,
    tree_constraint,
)
from aiayn.train import TrainConfig
from aiayn.train.trainer import Trainer

BOUNDARY = "\u2581"


# Vocabulary sizes by leaves: small enough that the source words still split into subwords
# (the fixture's 16 training trees allow at most ~760 pieces, the index markers 300 more).
VOCAB_SIZE = {
    "fixture": {"XX": 300, "words": 300, "tags": 300, "index": 600},
    "wsj-sample": {"XX": 600, "words": 500, "tags": 600, "index": 800},
}


def _treebank(name: str) -> WsjSplit:
    if name == "fixture":
        return fixture_split()
    split = split_wsj_sample(require_ptb_dir())
    return WsjSplit(split.train[:12], split.dev[:2], split.test[:2])


@pytest.fixture(scope="module", params=["fixture", "wsj-sample"])
def treebank(request) -> tuple[WsjSplit, dict[str, int]]:
    """The files of each split, and vocabulary sizes that suit them."""
    return _treebank(request.param), VOCAB_SIZE[request.param]


def _prepare(split: WsjSplit, vocab_size: dict[str, int], out, leaves: str = "XX") -> dict:
    return prepare_parsing(
        split.train, split.dev, split.test, out, vocab_size=vocab_size[leaves], leaves=leaves
    )


@pytest.fixture(scope="module")
def prepared(treebank, tmp_path_factory):
    out = tmp_path_factory.mktemp("ptb") / "data"
    return out, _prepare(*treebank, out)


def _lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("split", ["dev", "test"])
def test_prepare_writes_aligned_text_and_gold_trees(prepared, split):
    out, summary = prepared
    src, tgt = (_lines(p) for p in text_paths(out, split))
    gold = read_tree_lines(out / f"{split}.gold")
    assert len(src) == len(tgt) == len(gold) == summary["sentences"][split] > 0
    for words, target, tree in zip(src, tgt, gold):
        assert words.split() == tree.words()
        assert target.split() == linearize(tree)
        assert target.split().count("XX") == len(tree.words())
        assert all(tag != "XX" for tag in tree.tags())  # gold keeps its POS tags
    binarised = TokenDataset(out, {"dev": "valid", "test": "test"}[split])
    assert len(binarised) == len(src)  # nothing dropped: evaluation lines up with the gold


def test_bracket_tokens_are_single_pieces(prepared):
    out, summary = prepared
    vocab = Vocab.load(out / "spm.model")
    targets = _lines(text_paths(out, "train")[1])
    symbols = {tok for line in targets for tok in line.split()}
    assert summary["bracket_symbols"] == len(symbols) and "XX" in symbols and "(NP" in symbols
    for line in targets[:200]:
        pieces = [vocab.id_to_piece(i) for i in vocab.encode(line)]
        assert pieces == [BOUNDARY + tok for tok in line.split()]
    # ... while the words of the source side are still split into subwords.
    assert summary["splits"]["train"]["src_tokens"] > sum(
        len(s.split()) for s in _lines(text_paths(out, "train")[0])
    )


def test_decoded_pieces_delinearize_to_the_gold_tree(prepared):
    out, _ = prepared
    vocab = Vocab.load(out / "spm.model")
    for tree in read_tree_lines(out / "dev.gold")[:10]:
        ids = vocab.encode(" ".join(linearize(tree)))
        tokens = ids_to_tokens(vocab, [vocab.bos_id, *ids, vocab.eos_id, *ids[:3], vocab.pad_id])
        assert tokens == linearize(tree)
        assert delinearize(tokens, tree.words(), tree.tags()) == (tree, False)
        # A hypothesis cut off early (no closing brackets) is repaired over the same words.
        cut, repaired = delinearize(
            ids_to_tokens(vocab, ids[: len(ids) // 2]), tree.words(), tree.tags()
        )
        assert repaired and cut.words() == tree.words() and cut.tags() == tree.tags()
    # A word piece among the brackets merges into its neighbour and becomes one unknown token.
    mixed = [vocab.encode("(NP")[0], *vocab.encode("XX")] + vocab.encode("dog")[-1:]
    assert len(ids_to_tokens(vocab, mixed)) == 2


def _train(data, run, updates: int):
    cfg = TrainConfig(
        data=str(data),
        out=str(run),
        preset="tiny",
        model={"max_len": 1024},
        max_src_tokens=600,
        max_tgt_tokens=1000,
        warmup=10,
        max_updates=updates,
        save_every_minutes=None,
        validate=False,
        log_every=1,
    )
    Trainer(cfg, device="cpu").run(resume=None)
    return run / "checkpoints" / f"update_{updates:07d}"


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: a second thread only adds waiting on a busy machine
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, one_thread):
    """A tiny model trained for 6 updates on the fixture's XX-leaf data."""
    data = tmp_path_factory.mktemp("fixture") / "data"
    _prepare(fixture_split(), VOCAB_SIZE["fixture"], data)
    return data, _train(data, tmp_path_factory.mktemp("run"), 6)


@pytest.fixture(scope="module")
def words_checkpoint(tmp_path_factory, one_thread):
    """A tiny model trained for 1 update on the fixture's word-leaf data."""
    data = tmp_path_factory.mktemp("fixture-words") / "data"
    _prepare(fixture_split(), VOCAB_SIZE["fixture"], data, leaves="words")
    return _train(data, tmp_path_factory.mktemp("run-words"), 1)


def test_evaluate_agrees_with_evalb_on_its_prediction_file(tiny_checkpoint, tmp_path):
    data, ckpt = tiny_checkpoint
    decode = DecodeConfig(beam=2, alpha=0.3, max_len_a=1.0, max_len_b=15)
    result = evaluate_parser(ckpt, data, "dev", decode, out_dir=tmp_path)
    gold = read_tree_lines(data / "dev.gold")
    predicted = read_tree_lines(tmp_path / "dev.parsed")
    assert len(predicted) == result["sentences"] == 4
    for g, p in zip(gold, predicted):  # source words and gold tags on every prediction
        assert p.words() == g.words() and p.tags() == g.tags()
    rescored = evalb_score(gold, predicted)
    assert result["f1"] == pytest.approx(rescored.f1)
    # The fixture's 41-word dev sentence is scored in "all" but not in "len<=40".
    assert rescored.short.sentences == 3
    assert result["precision_le40"] == pytest.approx(rescored.short.precision)
    assert result["recall_le40"] == pytest.approx(rescored.short.recall)
    assert result["complete_match"] == pytest.approx(rescored.complete_match)
    assert result["errors"] == result["skipped"] == 0
    assert result["repair_rate"] == result["repaired"] / 4
    report = (tmp_path / "dev.evalb").read_text(encoding="utf-8")
    assert rescored.format_report() in report
    assert f"repaired outputs {result['repaired']} of 4" in report
    # --limit scores the first sentences only.
    limited = evaluate_parser(ckpt, data, "dev", decode, limit=2, out_dir=tmp_path / "limited")
    assert limited["sentences"] == len(read_tree_lines(tmp_path / "limited" / "dev.parsed")) == 2


def test_parse_lines_gives_xx_tagged_trees_over_the_input_words(tiny_checkpoint):
    _, ckpt = tiny_checkpoint
    lines = ["The dog barks .", "", "Pierre Vinken will join the board ."]
    trees = parse_lines(ckpt, lines, DecodeConfig(beam=2, alpha=0.3, max_len_b=10))
    assert trees[1] == ""
    for line, text in zip(lines[::2], trees[::2]):
        (tree,) = parse_trees(text)
        assert tree.words() == line.split() and set(tree.tags()) == {"XX"}
        assert to_bracketed(tree) == text


def test_constrained_evaluation_needs_no_repair(tiny_checkpoint, tmp_path):
    data, ckpt = tiny_checkpoint
    decode = DecodeConfig(beam=2, alpha=0.3, max_len_a=1.0, max_len_b=80)
    result = evaluate_parser(ckpt, data, "dev", decode, out_dir=tmp_path, constrained=True)
    assert result["constrained"] and result["sentences"] == 4
    assert result["repaired"] == 0 and result["errors"] == 0
    assert "constrained to well-formed trees" in (tmp_path / "dev.evalb").read_text(
        encoding="utf-8"
    )


def test_the_constraint_counts_the_words_of_every_sentence(prepared):
    out, _ = prepared
    vocab = Vocab.load(out / "spm.model")
    constraint = tree_constraint(vocab)
    for split in ("train", "dev", "test"):
        for line in _lines(text_paths(out, split)[0]):
            source = vocab.encode(line) + [vocab.eos_id]
            assert constraint.start(source, 1000).words == len(line.split()), line


def test_word_leaves_are_recorded_and_used_by_evaluation(treebank, tmp_path):
    out = tmp_path / "words"
    summary = _prepare(*treebank, out, leaves="words")
    assert summary["leaves"] == prepared_leaves(out) == "words"
    for words, target in zip(*(_lines(p) for p in text_paths(out, "dev"))):
        tokens = target.split()
        assert [t for t in tokens if not is_bracket(t)] == words.split()
    assert "XX" not in _lines(text_paths(out, "train")[1])[0].split()
    # The copying constraint allows every gold target, piece by piece: the target spells each
    # word as the source does.
    vocab = Vocab.load(out / "spm.model")
    constraint = tree_constraint(vocab, copy_words=True)
    for words, target in zip(*(_lines(p) for p in text_paths(out, "train"))):
        state = constraint.start(vocab.encode(words) + [vocab.eos_id], 2000)
        assert state.words == len(words.split())
        for i in vocab.encode(target):
            assert i in set(constraint.allowed(state)), (words, vocab.id_to_piece(i))
            state = constraint.advance(state, i)
        assert list(constraint.allowed(state)) == [vocab.eos_id]


def test_tag_leaves_are_single_pieces_and_the_constraint_still_counts_words(treebank, tmp_path):
    split, _ = treebank
    out = tmp_path / "tags"
    summary = _prepare(*treebank, out, leaves="tags")
    assert summary["leaves"] == prepared_leaves(out) == "tags"
    vocab = Vocab.load(out / "spm.model")
    assert set(leaf_tokens(vocab)) == {
        t for tree in read_treebank(split.train) for t in tree.tags()
    }
    assert {"DT", "NN", ",", "."} <= set(leaf_tokens(vocab))
    for tree, target in zip(read_tree_lines(out / "dev.gold"), _lines(text_paths(out, "dev")[1])):
        assert [t for t in target.split() if not is_bracket(t)] == tree.tags()
    # One piece per training target token: a tag is one decoder step, like a bracket.
    for target in _lines(text_paths(out, "train")[1]):
        assert len(vocab.encode(target)) == len(target.split())
    # Tag symbols such as "▁IN" or "▁," also match source words; each word still has one
    # word-initial piece, so the constraint's word count holds on every sentence.
    constraint = tree_constraint(vocab)
    for split_name in ("train", "dev", "test"):
        for line in _lines(text_paths(out, split_name)[0]):
            assert constraint.start(vocab.encode(line) + [vocab.eos_id], 1000).words == len(
                line.split()
            ), line


def test_index_leaves_mark_every_word_with_one_piece_on_both_sides(treebank, tmp_path):
    out = tmp_path / "index"
    _prepare(*treebank, out, leaves="index")
    vocab = Vocab.load(out / "spm.model")
    markers = leaf_tokens(vocab)
    assert markers[:3] == ["<1>", "<2>", "<3>"] and len(markers) == MIN_INDEX_TOKENS
    constraint = tree_constraint(vocab)
    assert constraint.indexed
    for split_name in ("train", "dev", "test"):
        for words, target in zip(*(_lines(p) for p in text_paths(out, split_name))):
            source = vocab.encode(words)
            n = len(words.split()) // 2
            assert constraint.start(source + [vocab.eos_id], 1000).words == n
            # Each marker is one piece on both sides, the same piece.
            pieces = [vocab.id_to_piece(i) for i in source]
            assert [p for p in pieces if p[1:] in markers] == [
                BOUNDARY + f"<{i + 1}>" for i in range(n)
            ]
            assert [t for t in target.split() if not is_bracket(t)] == [
                f"<{i + 1}>" for i in range(n)
            ]
    with pytest.raises(
        ValueError, match="a sentence of 301 words: this vocabulary marks at most 300"
    ):
        _parse_words(None, vocab, [["w"] * 301], DecodeConfig(), leaves="index")


def test_xx_is_the_recorded_default(prepared):
    out, summary = prepared
    assert summary["leaves"] == prepared_leaves(out) == "XX"


@pytest.mark.slow
def test_the_command_line_prepares_the_fixture(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "parse",
            "prepare",
            "--treebank",
            str(FIXTURE_DIR),
            "--out",
            str(tmp_path / "data"),
            "--vocab-size",
            "300",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    summary = json.loads(out)
    assert summary["sentences"] == {"train": 16, "dev": 4, "test": 3}
    assert summary["files"] == {"train": 3, "dev": 1, "test": 1}
    assert len(read_tree_lines(tmp_path / "data" / "test.gold")) == 3


# --- a checkpoint decodes with the leaf form it was trained on ---------------------------------


def _decoded_leaves(monkeypatch, ckpt, **kwargs) -> list[str]:
    """The leaf forms ``parse_lines`` decoded ``ckpt`` with (beam 1, a few steps)."""
    used = []

    def spy(*args, leaves, **rest):
        used.append(leaves)
        return real(*args, leaves=leaves, **rest)

    real = pipeline._parse_words
    monkeypatch.setattr(pipeline, "_parse_words", spy)
    parse_lines(ckpt, ["The dog barks ."], DecodeConfig(beam=1, max_len_b=5), **kwargs)
    return used


def test_a_checkpoint_records_the_leaf_form_of_its_training_data(tiny_checkpoint, words_checkpoint):
    assert trained_leaves(tiny_checkpoint[1]) == "XX"
    assert trained_leaves(words_checkpoint) == "words"


def test_parse_decodes_with_the_recorded_leaf_form_by_default(words_checkpoint, monkeypatch):
    assert _decoded_leaves(monkeypatch, words_checkpoint) == ["words"]
    assert _decoded_leaves(monkeypatch, words_checkpoint, leaves="words") == ["words"]


def test_a_leaf_form_that_contradicts_the_checkpoint_is_a_one_line_error(
    words_checkpoint, tmp_path, capsys
):
    (tmp_path / "in.txt").write_text("The dog barks .\n")
    code, out, err = run_cli(
        capsys,
        "parse",
        "parse",
        "--checkpoint",
        words_checkpoint,
        "--input",
        tmp_path / "in.txt",
        "--leaves",
        "XX",
        "--beam",
        1,
    )
    assert code == 2 and out == ""
    one_line_error(err, str(words_checkpoint), "--leaves words", "--leaves XX")


def test_a_checkpoint_without_a_record_keeps_the_old_default(
    words_checkpoint, tmp_path, monkeypatch
):
    old = shutil.copytree(words_checkpoint, tmp_path / "old")
    meta = json.loads((old / "meta.json").read_text())
    del meta["dataset"]
    (old / "meta.json").write_text(json.dumps(meta))
    assert trained_leaves(old) is None
    assert _decoded_leaves(monkeypatch, old) == ["XX"]
    assert _decoded_leaves(monkeypatch, old, leaves="words") == ["words"]
