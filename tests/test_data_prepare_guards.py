"""`prepare` never loses or mixes data: streamed arrays are np.save's bytes, the dataset is
replaced atomically, a vocabulary mismatch is refused, and bad input is a one-line error."""

import dataclasses
import io
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from _cli import dead_leftover
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.cli.main import main
from aiayn.data import Vocab, bundled_corpus_paths, check_vocab, prepare_corpus, read_parallel
from aiayn.data import binarize as binarize_module
from aiayn.data import prepare as prepare_module
from aiayn.data.binarize import binarize_split, dataset_files, split_files
from aiayn.data.corpora import Corpus, Languages, iter_corpus
from aiayn.data.readers import iter_lines, iter_parallel
from aiayn.errors import UserError
from aiayn.files import temp_dir_beside
from aiayn.train import TrainConfig

WORDS = "the a house dog cat runs sees big small red green old new and with in on of".split()
PALABRAS = "el la casa perro gato corre ve grande rojo verde viejo nuevo y con en sobre de".split()


def sentences(words: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(n)]


def write_pair(root: Path, split: str, n: int, seed: int = 0) -> tuple[Path, Path]:
    src, tgt = root / f"{split}.en", root / f"{split}.es"
    src.write_text("\n".join(sentences(WORDS, n, seed)) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(sentences(PALABRAS, n, seed + 1)) + "\n", encoding="utf-8")
    return src, tgt


@pytest.fixture
def corpus(tmp_path) -> dict[str, tuple[Path, Path]]:
    """300 training and 30 validation pairs of random words: prepares in well under a second."""
    raw = tmp_path / "raw"
    raw.mkdir()
    return {"train": write_pair(raw, "train", 300), "valid": write_pair(raw, "valid", 30, seed=7)}


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# --- streamed binarisation: byte for byte what the in-memory arrays give to np.save -----------


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def expected_files(pairs, vocab: Vocab, max_tokens: int | None) -> dict[str, bytes]:
    """The arrays as prepare built them before streaming: one int64 array per sentence,
    concatenated at the end, cast to the token dtype, then np.save."""
    kept = {"src": [], "tgt": []}
    for s, t in pairs:
        s_ids, t_ids = vocab.encode(s), vocab.encode(t)
        if max_tokens is None or max(len(s_ids), len(t_ids)) <= max_tokens:
            kept["src"].append(np.asarray(s_ids))
            kept["tgt"].append(np.asarray(t_ids))
    dtype = binarize_module.token_dtype(len(vocab))
    files = {}
    for side, arrays in kept.items():
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        tokens = np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)
        files[f"split.{side}.tokens.npy"] = npy_bytes(tokens)
        files[f"split.{side}.offsets.npy"] = npy_bytes(offsets)
    return files


@pytest.mark.parametrize("chunk_pairs, max_tokens", [(1, None), (7, 6), (10_000, 6), (7, 0)])
def test_streamed_arrays_are_the_bytes_np_save_writes(corpus, tmp_path, chunk_pairs, max_tokens):
    vocab = Vocab.train(list(corpus["train"]), tmp_path / "v" / "spm", vocab_size=60)
    pairs, _ = read_parallel(*corpus["train"])
    out = tmp_path / "bin"
    out.mkdir()
    counts = binarize_split(iter(pairs), vocab, out, "split", max_tokens, chunk_pairs=chunk_pairs)
    expected = expected_files(pairs, vocab, max_tokens)
    assert snapshot(out) == expected
    n_kept = len(np.load(io.BytesIO(expected["split.src.offsets.npy"]))) - 1
    assert counts["pairs"] == n_kept and counts["skipped_too_long_tokens"] == len(pairs) - n_kept
    if max_tokens == 6:
        assert 0 < n_kept < len(pairs)


@pytest.mark.slow
def test_bundled_training_split_streams_to_the_same_bytes(tmp_path):
    # Three chunks of 10,000 pairs and a remainder: the bundled corpus, as prepare reads it.
    src, tgt = bundled_corpus_paths()["train"]
    vocab = Vocab.train([src, tgt], tmp_path / "spm", vocab_size=1000)
    out = tmp_path / "bin"
    out.mkdir()
    binarize_split(iter_parallel(src, tgt), vocab, out, "split", 256)
    assert snapshot(out) == expected_files(iter_parallel(src, tgt), vocab, 256)


def test_workers_write_the_bytes_one_worker_writes(tmp_path):
    # 1,001 pairs in chunks of 97: ten whole chunks and one of 31, more than the 2 x 3 chunks
    # three workers keep in flight, some pairs skipped as too long
    src, tgt = write_pair(tmp_path, "train", 1001)
    vocab = Vocab.train([src, tgt], tmp_path / "v" / "spm", vocab_size=60)
    files, counts = {}, {}
    for workers in (1, 3):
        out = tmp_path / f"bin{workers}"
        out.mkdir()
        pairs = iter_parallel(src, tgt)
        counts[workers] = binarize_split(pairs, vocab, out, "split", 30, 97, workers=workers)
        files[workers] = snapshot(out)
    assert files[3] == files[1] == expected_files(iter_parallel(src, tgt), vocab, 30)
    assert counts[3] == counts[1]
    assert 0 < counts[1]["skipped_too_long_tokens"] and counts[1]["pairs"] > 500


def test_prepare_with_workers_writes_the_dataset_one_worker_writes(tmp_path, capsys):
    # 20,001 pairs: two whole chunks of 10,000 and one pair, as prepare chunks them; the
    # second prepare binarises with the first one's vocabulary, so only --workers differs
    src, tgt = write_pair(tmp_path, "train", 20_001)
    valid = write_pair(tmp_path, "valid", 31, seed=7)
    common = ["--train-src", str(src), "--train-tgt", str(tgt), "--max-len", "30"]
    common += ["--valid-src", str(valid[0]), "--valid-tgt", str(valid[1])]
    main(["prepare", *common, "--out", str(tmp_path / "one"), "--vocab-size", "60"])
    vocab = str(tmp_path / "one" / "spm.model")
    main(["prepare", *common, "--out", str(tmp_path / "w1"), "--vocab", vocab])
    main(["prepare", *common, "--out", str(tmp_path / "w2"), "--vocab", vocab, "--workers", "2"])
    capsys.readouterr()
    one, two = snapshot(tmp_path / "w1"), snapshot(tmp_path / "w2")
    assert one == two and sorted(one) == sorted(dataset_files(["train", "valid"]))
    assert json.loads(one["meta.json"])["splits"]["train"]["read"] == 20_001


# --- atomic prepare ----------------------------------------------------------------------


def test_failed_prepare_leaves_the_previous_dataset_untouched(corpus, tmp_path):
    out = tmp_path / "data"
    prepare_corpus(corpus, out, vocab_size=60, max_len=None)
    before = snapshot(out)
    # A new vocabulary is trained, then binarising the valid split fails (issue 12, item 2:
    # this used to leave the new spm.model beside the old ids).
    bad_valid = tmp_path / "short.es"
    bad_valid.write_text("uno\n", encoding="utf-8")
    with pytest.raises(UserError, match="line counts differ"):
        prepare_corpus({**corpus, "valid": (corpus["valid"][0], bad_valid)}, out, vocab_size=80)
    assert snapshot(out) == before
    assert leftovers(tmp_path) == []


def test_interrupted_prepare_removes_its_temporary_directory(corpus, tmp_path, monkeypatch):
    out = tmp_path / "data"
    prepare_corpus(corpus, out, vocab_size=60, max_len=None)
    before = snapshot(out)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "binarize_split", interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(corpus, out, vocab_size=80)
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_prepare_removes_what_killed_prepares_left_and_keeps_a_running_ones(corpus, tmp_path):
    out = tmp_path / "data"
    prepare_corpus(corpus, out, vocab_size=60, max_len=None)
    dead, running = dead_leftover(out), temp_dir_beside(out)
    prepare_corpus(corpus, out, vocab_size=80, max_len=None)
    assert leftovers(tmp_path) == [running.name] and not dead.exists()


def test_new_dataset_replaces_the_old_and_keeps_other_entries(corpus, tmp_path):
    out = tmp_path / "data"
    prepare_corpus({**corpus, "test": corpus["valid"]}, out, vocab_size=60, max_len=None)
    (out / "text").mkdir()
    (out / "text" / "dev.gold").write_text("(S (X a))\n", encoding="utf-8")
    (out / "parsing.json").write_text("{}\n", encoding="utf-8")
    summary = prepare_corpus(corpus, out, vocab_size=80, max_len=None)
    assert sorted(summary["splits"]) == ["train", "valid"]
    assert not list(out.glob("test.*"))  # the old dataset's files went with it
    assert (out / "text" / "dev.gold").read_text(encoding="utf-8") == "(S (X a))\n"
    assert (out / "parsing.json").read_text(encoding="utf-8") == "{}\n"  # kept as it was
    check_vocab(out, Vocab.load(out / "spm.model"))
    assert len(Vocab.load(out / "spm.model")) == 80 and leftovers(tmp_path) == []


def test_a_directory_with_other_files_gets_the_dataset_beside_them(tmp_path):
    # `aiayn parse prepare` writes its text and gold trees into the output first.
    out = tmp_path / "data"
    (out / "text").mkdir(parents=True)
    (out / "dev.gold").write_text("(S (X a))\n", encoding="utf-8")
    splits = {"train": write_pair(out / "text", "train", 300)}
    text_before = snapshot(out / "text")
    summary = prepare_corpus(splits, out, vocab_size=60)
    meta = json.loads((out / "meta.json").read_text())  # the dataset, beside them
    assert meta == {k: v for k, v in summary.items() if k != "seconds"}
    assert summary["splits"]["train"]["pairs"] == 300 and snapshot(out / "text") == text_before
    assert (out / "dev.gold").read_text(encoding="utf-8") == "(S (X a))\n"
    assert leftovers(tmp_path) == []


def test_a_dataset_directory_is_swapped_whole(corpus, tmp_path):
    out = tmp_path / "data"
    prepare_corpus({**corpus, "test": corpus["valid"]}, out, vocab_size=60)
    out.chmod(0o750)
    prepare_corpus(corpus, out, vocab_size=80)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["meta.json", "spm.model", "spm.vocab", *split_files("train"), *split_files("valid")]
    )
    assert len(Vocab.load(out / "spm.model")) == 80 and (out.stat().st_mode & 0o777) == 0o750
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda d: (d / "spm.model").write_text("x"),
            r"holds spm.model but no meta.json, so not a dataset",
        ),
        (
            lambda d: (d / "train.src.tokens.npy").write_text("x"),
            r"holds train.src.tokens.npy but no meta.json",
        ),
        (
            lambda d: (d / "meta.json").write_text('{"a": 1'),
            r"meta.json: not a dataset's meta.json",
        ),
        (
            lambda d: (d / "meta.json").write_text("{}"),
            r"meta.json: not a dataset's meta.json: no vocab_fingerprint",
        ),
    ],
)
def test_prepare_refuses_a_directory_it_did_not_write(corpus, tmp_path, make, message):
    out = tmp_path / "mine"
    out.mkdir()
    make(out)
    before = snapshot(out)
    with pytest.raises(UserError, match=message):
        prepare_corpus(corpus, out, vocab_size=60)
    assert snapshot(out) == before and leftovers(tmp_path) == []


# --- the vocabulary fingerprint guards training ----------------------------------------


def test_training_refuses_ids_binarised_with_another_vocabulary(tiny_corpus, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(tiny_corpus, data)
    other = Vocab.train([tiny_corpus.parent / "train.es"], tmp_path / "other", vocab_size=300)
    shutil.copyfile(
        other.path, data / "spm.model"
    )  # same size, other pieces: ids mean other things
    cfg = TrainConfig(
        data=str(data),
        out=str(tmp_path / "run"),
        preset="tiny",
        max_updates=1,
        validate=False,
        num_threads=1,
    )
    (tmp_path / "cfg.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    with pytest.raises(SystemExit) as e:
        main(["train", str(tmp_path / "cfg.json"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert f"{data / 'meta.json'} records a vocabulary of 300 pieces" in err
    assert f"but {data / 'spm.model'} has 300 pieces" in err
    assert not (tmp_path / "run").exists()


# --- bad input: one line naming the file, line or key -------------------------------------


def run_prepare(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(["prepare", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_invalid_utf8_in_training_text_drops_that_pair_and_counts_it(tmp_path, capsys):
    # Line 3001 is past sentencepiece's first read, where its trainer used to wrap the error.
    src, tgt = write_pair(tmp_path, "train", 3001)
    data = src.read_bytes().split(b"\n")
    data[3000] = b"caf\xe9 " + data[3000]
    src.write_bytes(b"\n".join(data))
    out = tmp_path / "o"
    main(
        ["prepare", "--train-src", str(src), "--train-tgt", str(tgt), "--out", str(out)]
        + ["--vocab-size", "60", "--no-clean"]
    )
    train = json.loads((out / "meta.json").read_text())["splits"]["train"]
    assert (train["read"], train["skipped_invalid_utf8"], train["pairs"]) == (3001, 1, 3000)
    assert "1 invalid_utf8" in capsys.readouterr().err


def test_invalid_utf8_in_a_valid_split_drops_that_pair_and_counts_it(corpus, tmp_path, capsys):
    src, tgt = write_pair(tmp_path, "valid", 5)
    tgt.write_bytes(tgt.read_bytes() + b"\xff\n")
    src.write_bytes(src.read_bytes() + b"x\n")
    out = tmp_path / "o"
    main(
        ["prepare", "--train-src", str(corpus["train"][0]), "--train-tgt", str(corpus["train"][1])]
        + [
            "--valid-src",
            str(src),
            "--valid-tgt",
            str(tgt),
            "--out",
            str(out),
            "--vocab-size",
            "60",
        ]
    )
    valid = json.loads((out / "meta.json").read_text())["splits"]["valid"]
    assert (valid["read"], valid["skipped_invalid_utf8"], valid["pairs"]) == (6, 1, 5)


@pytest.mark.parametrize("content", ["", "\n  \n\t\n"])
def test_an_empty_training_file_is_named(corpus, tmp_path, capsys, content):
    empty = tmp_path / "empty.es"
    empty.write_text(content, encoding="utf-8")
    err = run_prepare(
        capsys,
        "--train-src",
        str(corpus["train"][0]),
        "--train-tgt",
        str(empty),
        "--out",
        str(tmp_path / "o"),
    )
    assert f"{empty}: empty training file" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--vocab-size", "0"], "vocab size must be a positive number of pieces, got 0"),
        (["--vocab-size", "-5"], "vocab size must be a positive number of pieces, got -5"),
        (
            ["--vocab-size", "5"],
            "vocab size 5 is too small: the training text's characters and the special pieces need at least",
        ),
        (
            ["--vocab-size", "5000"],
            "vocab size 5000 is too large: this training text yields at most",
        ),
        (["--max-len", "0"], "max_len must be a positive number"),
        (["--workers", "0"], "workers must be a positive number of processes, got 0"),
        (
            ["--max-len", "1"],
            "train split ({src}, {tgt}): 0 of 300 pairs kept: 0 with an empty side, 0 over max_words=None, 300 over max_len=1",
        ),
    ],
)
def test_bad_sizes_are_one_line_errors(corpus, tmp_path, capsys, flags, message):
    src, tgt = corpus["train"]
    err = run_prepare(
        capsys,
        "--train-src",
        str(src),
        "--train-tgt",
        str(tgt),
        "--out",
        str(tmp_path / "o"),
        "--vocab-size",
        "60",
        *flags,
    )
    assert message.format(src=src, tgt=tgt) in err
    assert not (tmp_path / "o").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "no input: give --bundled, --wmt14, --data-spec, --corpus, or --train-src and"),
        (["--train-src", "only-one-side.en"], "--train-src and --train-tgt go together"),
    ],
)
def test_prepare_without_inputs_is_a_one_line_error(tmp_path, capsys, flags, message):
    err = run_prepare(capsys, "--out", str(tmp_path / "o"), *flags)
    assert err.startswith(f"aiayn prepare: error: {message}")
    assert not (tmp_path / "o").exists()


def test_too_large_vocab_size_says_the_limit(corpus, tmp_path):
    with pytest.raises(UserError, match=r"at most (\d+) pieces; ask for \1 or fewer") as e:
        prepare_corpus({"train": corpus["train"]}, tmp_path / "o", vocab_size=5000)
    limit = int(e.value.args[0].split("at most ")[1].split()[0])
    assert len(Vocab.train(list(corpus["train"]), tmp_path / "v", vocab_size=limit)) == limit


@pytest.mark.parametrize(
    "which, message", [("dir", "is a directory; expected a text file"), ("missing", "no such file")]
)
def test_a_path_that_is_not_a_file_is_named(corpus, tmp_path, capsys, which, message):
    bad = tmp_path / which
    if which == "dir":
        bad.mkdir()
    err = run_prepare(
        capsys,
        "--train-src",
        str(corpus["train"][0]),
        "--train-tgt",
        str(bad),
        "--out",
        str(tmp_path / "o"),
    )
    assert f"{bad}: {message}" in err


def test_out_that_is_a_file_is_refused(corpus, tmp_path, capsys):
    (tmp_path / "o").write_text("keep me")
    err = run_prepare(
        capsys,
        "--train-src",
        str(corpus["train"][0]),
        "--train-tgt",
        str(corpus["train"][1]),
        "--out",
        str(tmp_path / "o"),
    )
    assert f"output directory {tmp_path / 'o'}: is a file" in err
    assert (tmp_path / "o").read_text() == "keep me"


# --- one line rule: LF ends a line, one CR before it is dropped, a bare CR stays -----------


def test_prepare_counts_lines_by_lf_only(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "a.es"
    src.write_bytes(b"one\r\ntwo\rstill two\nthree\r\r\n")
    tgt.write_bytes(b"uno\ndos\ntres\n")
    assert list(iter_lines(src)) == ["one", "two\rstill two", "three\r"]
    corpus = Corpus("a", "pair", (src, tgt))
    assert [s for s, _ in iter_corpus(corpus, Languages())] == ["one", "two\rstill two", "three"]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=12).filter(lambda b: b"\n" not in b),
            st.sampled_from([b"\n", b"\r\n", b"\r", b""]),
        ),
        max_size=8,
    )
)
def test_iter_lines_follows_the_rule_or_names_the_line(tmp_path_factory, parts):
    data = b"".join(text + end for text, end in parts)
    path = tmp_path_factory.mktemp("lines") / "x.txt"
    path.write_bytes(data)
    *ended, last = data.split(b"\n")  # ``last``: text after the final LF, not ended by one
    expected = [line.removesuffix(b"\r") for line in ended]  # CRLF: the CR goes
    if last:
        expected.append(last)  # no LF follows, so a CR at its end is bare and stays
    try:
        want = [line.decode("utf-8") for line in expected]
    except UnicodeDecodeError:
        with pytest.raises(UserError, match=rf"{path}: line \d+: invalid UTF-8"):
            list(iter_lines(path))
    else:
        assert list(iter_lines(path)) == want
