"""Vocabulary, binarised round trip, vocabulary-mismatch detection, collate, bundled corpus."""

import gzip
import re
import shutil
from itertools import islice

import numpy as np
import pytest
import sentencepiece as spm
import torch

from aiayn.data import (
    TokenBudgetSampler,
    TokenDataset,
    Vocab,
    bundled_corpus_paths,
    check_vocab,
    collate,
    prepare_corpus,
    read_parallel,
)
from aiayn.errors import UserError

SPLIT_PAIRS = {"train": 27959, "valid": 1403, "test": 1523}


def lines(path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 1,500-pair slice of the bundled corpus (plus one empty pair), prepared with 200 pieces."""
    root = tmp_path_factory.mktemp("small")
    paths = bundled_corpus_paths()
    files = {}
    for split, n in (("train", 1500), ("valid", 50)):
        src, tgt = (lines(p)[:n] for p in paths[split])
        src.append("")  # an empty source line: skipped and counted, not fatal
        tgt.append("vacía")
        for side, text in (("en", src), ("es", tgt)):
            (root / f"{split}.{side}").write_text("\n".join(text) + "\n", encoding="utf-8")
        files[split] = (root / f"{split}.en", root / f"{split}.es")
    summary = prepare_corpus(files, root / "bin", vocab_size=200, max_len=60)
    return root, files, summary


def test_vocab_special_ids_and_decode_stops_at_eos(small):
    root, _, _ = small
    vocab = Vocab.load(root / "bin" / "spm.model")
    assert len(vocab) == 200
    assert (vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2, 3)
    ids = vocab.encode("In the beginning God created the heavens.")
    assert min(ids) > 3
    assert vocab.decode(ids) == "In the beginning God created the heavens."
    assert vocab.decode([2, *ids, 3, *vocab.encode("garbage"), 0]) == vocab.decode(ids)


def test_encode_source_is_the_one_source_form_with_one_truncation_rule(small):
    """Every caller (translate, evaluate's perplexity, serve, plots, diagnose, parsing) reads a
    source as subwords + eos; an over-long one loses subwords, never its eos."""
    root, _, _ = small
    vocab = Vocab.load(root / "bin" / "spm.model")
    text = "In the beginning God created the heavens and the earth."
    ids = vocab.encode(text)
    assert vocab.encode_source(text) == ids + [vocab.eos_id]
    assert vocab.encode_source(text, max_len=len(ids) + 1) == ids + [vocab.eos_id]
    assert vocab.encode_source(text, max_len=5) == ids[:4] + [vocab.eos_id]
    assert vocab.encode_source("  \t") == vocab.encode_source("") == []


def test_user_defined_symbols_are_single_pieces(tmp_path):
    # "(NP" and ")NP" recur thousands of times: plain BPE learns pieces that span them and the
    # neighbouring text; declared as symbols (with the word-boundary mark they carry after
    # normalisation) each stays exactly one piece, with ids right after the specials.
    text = ["(S (NP XX XX )NP (VP XX (NP XX )NP )VP )S the dog barks"] * 200
    symbols = [
        "\u2581(S",
        "\u2581)S",
        "\u2581(NP",
        "\u2581)NP",
        "\u2581(VP",
        "\u2581)VP",
        "\u2581XX",
    ]
    plain = Vocab.train(text, tmp_path / "plain", vocab_size=40)
    atomic = Vocab.train(text, tmp_path / "atomic", vocab_size=40, user_defined_symbols=symbols)
    line = "(S (NP XX XX )NP (VP XX )VP )S"
    assert [atomic.id_to_piece(i) for i in atomic.encode(line)] == [
        "\u2581" + t for t in line.split()
    ]
    assert [atomic.id_to_piece(i) for i in range(4, 11)] == symbols
    assert [plain.id_to_piece(i) for i in plain.encode(line)] != [
        "\u2581" + t for t in line.split()
    ]
    assert atomic.decode(atomic.encode(line)) == line


def test_model_with_other_special_ids_is_rejected(tmp_path):
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["a b c d e f g h"] * 20),
        model_prefix=str(tmp_path / "d"),
        vocab_size=20,
        model_type="bpe",
        minloglevel=2,
    )  # sentencepiece defaults: unk=0, bos=1, eos=2, no pad
    with pytest.raises(UserError, match=r"special ids \(pad, unk, bos, eos\) are \(-1, 0, 1, 2\)"):
        Vocab.load(tmp_path / "d.model")


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b""])
def test_a_file_that_is_no_sentencepiece_model_is_named(tmp_path, content):
    (tmp_path / "spm.model").write_bytes(content)
    with pytest.raises(UserError, match=rf"^{tmp_path / 'spm.model'}: not a SentencePiece model"):
        Vocab.load(tmp_path / "spm.model")


def test_translate_names_a_garbage_spm_model_in_one_line(tiny_run, tmp_path, capsys):
    from _cli import one_line_error, run_cli

    from aiayn.checkpoint import latest_checkpoint

    ckpt = shutil.copytree(latest_checkpoint(tiny_run / "checkpoints"), tmp_path / "ckpt")
    (ckpt / "spm.model").write_bytes(np.random.default_rng(0).bytes(5000))
    (tmp_path / "in.txt").write_text("In the beginning\n")
    code, out, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", tmp_path / "in.txt"
    )
    assert code == 2 and out == ""
    one_line_error(err, f"{ckpt / 'spm.model'}: not a SentencePiece model")


def test_prepare_counts_skips_and_dtype(small):
    _, _, summary = small
    train, valid = summary["splits"]["train"], summary["splits"]["valid"]
    assert (train["read"], train["skipped_empty"]) == (1501, 1)
    assert train["pairs"] + train["skipped_too_long_tokens"] == 1500
    assert train["skipped_too_long_tokens"] > 0  # max_len=60 with 200 pieces cuts long verses
    assert (valid["read"], valid["skipped_empty"]) == (51, 1)
    assert summary["dtype"] == "uint16" and summary["vocab_size"] == 200


def test_binarised_round_trip_equals_encoding(small):
    root, files, summary = small
    vocab = Vocab.load(root / "bin" / "spm.model")
    ds = TokenDataset(root / "bin", "train")
    assert len(ds) == summary["splits"]["train"]["pairs"]
    pairs, _ = read_parallel(*files["train"])
    kept = [(s, t) for s, t in pairs if max(len(vocab.encode(s)), len(vocab.encode(t))) <= 60]
    assert len(kept) == len(ds)
    for i in (0, 1, len(ds) // 2, len(ds) - 1):
        assert ds.src(i).tolist() == vocab.encode(kept[i][0])
        assert ds.tgt(i).tolist() == vocab.encode(kept[i][1])
    assert ds.src_lens[:3].tolist() == [len(vocab.encode(s)) for s, _ in kept[:3]]
    assert isinstance(ds._tokens["src"], np.memmap)  # mapped, not read: O(1) loading


def test_vocab_mismatch_is_detected(small, tmp_path):
    root, files, _ = small
    check_vocab(root / "bin", Vocab.load(root / "bin" / "spm.model"))  # its own: fine
    other = Vocab.train([files["train"][0]], tmp_path / "other", vocab_size=150)
    with pytest.raises(UserError, match=r"vocabulary mismatch: .* 200 pieces .* has 150 pieces"):
        check_vocab(root / "bin", other)


class FakeDataset:
    def __init__(self, src, tgt):
        self._src, self._tgt = src, tgt

    def src(self, i):
        return np.array(self._src[i])

    def tgt(self, i):
        return np.array(self._tgt[i])


def test_collate_pins_exact_tensors():
    ds = FakeDataset(src=[[10, 11, 12], [20], [30, 31]], tgt=[[40], [50, 51, 52, 53], [60, 61]])
    b = collate(ds, [2, 0, 1])
    assert b.src.tolist() == [[30, 31, 3, 0], [10, 11, 12, 3], [20, 3, 0, 0]]
    assert b.tgt_in.tolist() == [[2, 60, 61, 0, 0], [2, 40, 0, 0, 0], [2, 50, 51, 52, 53]]
    assert b.tgt_out.tolist() == [[60, 61, 3, 0, 0], [40, 3, 0, 0, 0], [50, 51, 52, 53, 3]]
    assert b.src.dtype == torch.int64
    assert (b.n_src_tokens, b.n_tgt_tokens, b.indices) == (9, 10, [2, 0, 1])
    moved = b.to("cpu")
    assert torch.equal(moved.tgt_out, b.tgt_out) and moved.indices == [2, 0, 1]


def test_sampler_and_collate_on_prepared_data_respect_budget(small):
    root, _, _ = small
    ds = TokenDataset(root / "bin", "train")
    sampler = TokenBudgetSampler(ds.src_lens, ds.tgt_lens, 300, 300, seed=0)
    for indices in islice(iter(sampler), 20):
        b = collate(ds, indices)
        assert b.src.numel() <= 300 and b.tgt_in.numel() <= 300
        assert b.n_tgt_tokens == int((b.tgt_out != 0).sum())


def test_bundled_corpus_counts_and_disjoint_chapters():
    paths = bundled_corpus_paths()
    refs = {}
    for split, (en, es) in paths.items():
        ref = lines(en.with_name(f"{split}.ref.gz"))
        assert len(lines(en)) == len(lines(es)) == len(ref) == SPLIT_PAIRS[split]
        refs[split] = ref
    chapters = {s: {re.sub(r":\d+$", "", r) for r in rs} for s, rs in refs.items()}
    assert not chapters["train"] & chapters["valid"]
    assert not chapters["train"] & chapters["test"]
    assert not chapters["valid"] & chapters["test"]
    assert refs["train"][0] == "Genesis 1:1" and lines(paths["train"][1])[0].startswith(
        "EN el principio"
    )


def test_subset_dataset_keeps_the_chosen_pairs_and_never_replaces_a_foreign_directory(
    small, tmp_path
):
    from aiayn.data.binarize import read_meta, subset_dataset

    root, _, _ = small
    full = TokenDataset(root / "bin", "train")
    keep = np.array([0, 5, 7])
    meta = subset_dataset(root / "bin", tmp_path / "sub", "train", keep)
    sub = TokenDataset(tmp_path / "sub", "train")
    assert meta["splits"]["train"]["pairs"] == len(sub) == 3
    assert [sub.src(i).tolist() for i in range(3)] == [full.src(int(i)).tolist() for i in keep]
    assert (
        read_meta(tmp_path / "sub")["splits"]["valid"] == read_meta(root / "bin")["splits"]["valid"]
    )
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not a prepared dataset"):
        subset_dataset(root / "bin", foreign, "train", keep)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


# --- binarising new text with an existing vocabulary (fine-tuning) -------------------------------


def _pair(tmp_path, n: int = 30):
    """The first ``n`` pairs of the bundled valid split as plain files."""
    files = []
    for side, path in zip(("en", "es"), bundled_corpus_paths()["valid"]):
        files.append(tmp_path / f"text.{side}")
        files[-1].write_text("\n".join(lines(path)[:n]) + "\n", encoding="utf-8")
    return files


def test_prepare_with_a_given_vocabulary_binarises_with_it(tiny_run, tmp_path, capsys):
    from _cli import run_cli

    vocab_file = tiny_run / "checkpoints" / "update_0000003" / "spm.model"
    src, tgt = _pair(tmp_path)
    code, _, err = run_cli(
        capsys, "prepare", "--train-src", src, "--train-tgt", tgt, "--out", tmp_path / "d",
        "--vocab", vocab_file,
    )  # fmt: skip
    assert code == 0, err
    vocab = Vocab.load(vocab_file)
    assert (tmp_path / "d/spm.model").read_bytes() == vocab_file.read_bytes()
    check_vocab(tmp_path / "d", vocab)  # what init_from and resume compare
    data = TokenDataset(tmp_path / "d", "train")
    first = src.read_text(encoding="utf-8").splitlines()[0]
    assert list(data.src(0)) == vocab.encode(first)
    listing = (tmp_path / "d/spm.vocab").read_text(encoding="utf-8").splitlines()
    assert len(listing) == len(vocab) and listing[3].split("\t")[0] == vocab.id_to_piece(3)


@pytest.mark.parametrize("case", ["with a size", "not a model", "its own output"])
def test_prepare_vocab_refuses_in_one_line(tiny_run, tmp_path, capsys, case):
    from _cli import one_line_error, run_cli

    src, tgt = _pair(tmp_path)
    out = tmp_path / "d"
    vocab_file = tiny_run / "checkpoints" / "update_0000003" / "spm.model"
    extra, needle = ["--vocab", vocab_file, "--vocab-size", "100"], "--vocab reuses a vocabulary"
    if case == "not a model":
        extra, needle = ["--vocab", src], "not a SentencePiece model"
    elif case == "its own output":
        out.mkdir()
        shutil.copyfile(vocab_file, out / "spm.model")
        extra, needle = ["--vocab", out / "spm.model"], "is the input"
    args = ["--train-src", src, "--train-tgt", tgt, "--out", out, *extra]
    code, _, err = run_cli(capsys, "prepare", *args)
    assert code == 2
    one_line_error(err, needle)
    assert not (out / "meta.json").exists()
