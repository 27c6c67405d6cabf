"""Bad input must fail loudly (naming file, line and counts) or be skipped and counted."""

import gzip

import pytest

from aiayn.data import read_parallel, read_tsv
from aiayn.errors import UserError


def write(path, text: str | bytes) -> None:
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_reads_aligned_pairs_plain_and_gzip(tmp_path, suffix):
    src, tgt = tmp_path / f"a.en{suffix}", tmp_path / f"a.de{suffix}"
    write(src, "Hello world\r\n  two  \n")
    write(tgt, "Hallo Welt\nzwei\n")
    pairs, stats = read_parallel(src, tgt)
    assert pairs == [("Hello world", "Hallo Welt"), ("two", "zwei")]
    assert (stats.read, stats.kept, stats.empty, stats.too_long) == (2, 2, 0, 0)


@pytest.mark.parametrize("n_src, n_tgt", [(3, 2), (2, 4)])
def test_mismatched_line_counts_name_both_files_and_counts(tmp_path, n_src, n_tgt):
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    write(src, "x\n" * n_src)
    write(tgt, "y\n" * n_tgt)
    with pytest.raises(UserError) as e:
        read_parallel(src, tgt)
    assert f"{src} has {n_src} lines" in str(e.value)
    assert f"{tgt} has {n_tgt}" in str(e.value)


def test_invalid_utf8_names_file_and_line(tmp_path):
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    write(src, b"ok\nfine\nbad \xff byte\n")
    write(tgt, "a\nb\nc\n")
    with pytest.raises(UserError, match=rf"{src}: line 3: invalid UTF-8"):
        read_parallel(src, tgt)


def test_empty_and_overlong_pairs_are_skipped_and_counted(tmp_path):
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    write(src, "one two\n\nkeep me\na b c d e\n   \n")
    write(tgt, "eins zwei\nleer\nbehalte mich\nx\ny\n")
    pairs, stats = read_parallel(src, tgt, max_words=4)
    assert pairs == [("one two", "eins zwei"), ("keep me", "behalte mich")]
    assert (stats.read, stats.kept, stats.empty, stats.too_long) == (5, 2, 2, 1)


def test_tsv_reads_pairs_and_rejects_wrong_field_count(tmp_path):
    good = tmp_path / "good.tsv"
    write(good, "Hello\tHallo\n\tleer\nBye\tTschuess\n")
    pairs, stats = read_tsv(good)
    assert pairs == [("Hello", "Hallo"), ("Bye", "Tschuess")]
    assert stats.empty == 1
    bad = tmp_path / "bad.tsv"
    write(bad, "a\tb\nno tab here\n")
    with pytest.raises(
        UserError, match=rf"{bad}: line 2: expected 2 tab-separated fields, found 1"
    ):
        read_tsv(bad)
