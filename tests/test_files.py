"""aiayn.files: the one line-reading rule and the atomic writers, pinned by examples and by
Hypothesis; and the config parser, which must answer any text with a config or a ValueError."""

import io
import os
import re
import subprocess
import sys

import pytest
from _cli import dead_leftover
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn import files as aiayn_files
from aiayn.data.readers import iter_lines as corpus_lines
from aiayn.errors import UserError
from aiayn.files import (
    atomic_file,
    check_not_input,
    count_lines,
    iter_lines,
    publish_dir,
    read_jsonl,
    read_lines,
    temp_dir_beside,
    write_lines_atomic,
    write_parallel,
    write_text_atomic,
)
from aiayn.train import TrainConfig, load_train_config
from aiayn.train.config import resolve_train_config

FAST = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# --- the rule, by example ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, lines",
    [
        (b"", []),
        (b"a\nb\n", ["a", "b"]),
        (b"a\nb", ["a", "b"]),  # a last line without LF
        (b"a\r\nb\r\n", ["a", "b"]),  # CRLF: the CR goes with the LF
        (b"a\rb\n", ["a\rb"]),  # a bare CR stays inside the line
        (b"a\r\r\n", ["a\r"]),  # only the one CR of the CRLF goes
        (b"a\r", ["a\r"]),  # a last bare CR is not a CRLF
        (b"\n\n", ["", ""]),
        ("x\u2028y\x0cz\n".encode(), ["x\u2028y\x0cz"]),  # str.splitlines would give 3 lines
    ],
)
def test_lines_split_at_lf_only(tmp_path, data, lines):
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    assert read_lines(path) == lines
    assert list(corpus_lines(path)) == lines  # prepare reads by the same rule
    assert count_lines(path) == len(lines)  # a progress bar's total counts by it too


def test_gzip_is_read_transparently(tmp_path):
    import gzip

    path = tmp_path / "f.txt.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"one\r\ntwo\n")
    assert read_lines(path) == ["one", "two"]


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"ok\nstill ok\n\xc3(\n")
    with pytest.raises(UserError, match=rf"^{path}: line 3: invalid UTF-8"):
        read_lines(path)
    with pytest.raises(UserError, match=rf"^{path}: line 3: invalid UTF-8"):
        list(corpus_lines(path))


def test_a_directory_is_not_a_text_file(tmp_path):
    with pytest.raises(UserError, match="is a directory"):
        read_lines(tmp_path)


# --- the rule, by property -------------------------------------------------------------------


def expected_lines(data: bytes) -> list[bytes]:
    """The rule written the obvious way: split at LF, drop the empty tail, strip a CRLF's CR."""
    parts = data.split(b"\n")
    terminated = [p[:-1] if p.endswith(b"\r") else p for p in parts[:-1]]
    return terminated + ([parts[-1]] if parts[-1] else [])


pieces = st.one_of(
    st.binary(max_size=6),
    st.sampled_from(
        [
            b"\n",
            b"\r",
            b"\r\n",
            b"\r\r\n",
            b"\xff",
            b"\xc3",
            "é".encode(),
            "\u2028".encode(),
            b"\x85",
        ]
    ),
)
random_files = st.lists(pieces, max_size=20).map(b"".join)


@FAST
@given(random_files)
def test_any_bytes_give_the_rule_or_a_named_error(tmp_path, data):
    want = expected_lines(data)
    try:
        got = list(iter_lines(io.BytesIO(data), "in.txt"))
    except UserError as e:
        bad = next(i for i, raw in enumerate(want, start=1) if not _valid(raw))
        assert str(e).startswith(f"in.txt: line {bad}: invalid UTF-8")
        return
    assert got == [raw.decode() for raw in want]
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    assert list(corpus_lines(path)) == got
    assert count_lines(path) == len(got)


def _valid(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.text(
            alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)),
            max_size=8,
        ),
        max_size=10,
    )
)
def test_written_lines_read_back_unchanged(tmp_path, lines):
    # A line ending in CR does not survive (it would read as CRLF); every other line does.
    lines = [line for line in lines if not line.endswith("\r")]
    path = tmp_path / "out.txt"
    write_lines_atomic(path, lines)
    assert read_lines(path) == lines


# --- atomic writers ----------------------------------------------------------------------------


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "hyps.txt"
    write_text_atomic(path, "old\n")
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_text("half of the ne")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["hyps.txt"]


def test_atomic_files_get_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0600


def test_published_directories_get_the_usual_permissions(tmp_path):
    import torch
    from safetensors.torch import save_file  # writes 0600 files of its own accord

    old = os.umask(0o022)
    try:
        tmp = temp_dir_beside(tmp_path / "out")
        save_file({"w": torch.zeros(2)}, str(tmp / "model.safetensors"))
        (tmp / "meta.json").write_text("{}")
        publish_dir(tmp, tmp_path / "out")
    finally:
        os.umask(old)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755  # not mkdtemp's private 0700
    for name in ("model.safetensors", "meta.json"):
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == 0o644, name


def test_a_directory_under_a_file_is_named(tmp_path):
    (tmp_path / "afile").write_text("keep me")
    with pytest.raises(
        UserError, match=f"^cannot write {tmp_path}/afile/sub: {tmp_path}/afile is a file"
    ):
        temp_dir_beside(tmp_path / "afile" / "sub")
    assert (tmp_path / "afile").read_text() == "keep me"


def test_an_output_that_is_a_directory_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match="is a directory; give a file name"):
        write_text_atomic(tmp_path / "out", "x")


def _same_file_cases(tmp_path, how):
    """(output, input) where the output is the input by ``how``."""
    data = tmp_path / "ref.txt"
    data.write_text("keep\n")
    if how == "same path":
        return tmp_path / "." / "ref.txt", data
    if how == "symlink to the input":
        (tmp_path / "link").symlink_to(data)
        return tmp_path / "link", data
    if how == "input is a symlink to it":
        (tmp_path / "link").symlink_to(data)
        return data, tmp_path / "link"
    os.link(data, tmp_path / "hard")
    return tmp_path / "hard", data


@pytest.mark.parametrize(
    "how", ["same path", "symlink to the input", "input is a symlink to it", "hard link"]
)
def test_an_output_that_is_an_input_is_refused_naming_both(tmp_path, how):
    output, data = _same_file_cases(tmp_path, how)
    with pytest.raises(UserError) as caught:
        check_not_input(output, [tmp_path / "other", data], option="--output")
    message = str(caught.value)
    assert "\n" not in message and f"--output {output}" in message and str(data) in message


def test_an_output_beside_its_inputs_is_allowed(tmp_path):
    (tmp_path / "ref.txt").write_text("x\n")
    (tmp_path / "hyp.txt").write_text("y\n")  # an earlier output, not an input
    check_not_input(tmp_path / "hyp.txt", [tmp_path / "ref.txt", tmp_path / "missing"])
    check_not_input(tmp_path / "new.txt", [tmp_path / "ref.txt"])


def test_a_directory_holding_an_input_is_refused_only_when_replaced_whole(tmp_path):
    inner = tmp_path / "run" / "checkpoints" / "update_1"
    inner.mkdir(parents=True)
    check_not_input(tmp_path / "run", [inner])  # written into, not replaced: the input stays
    with pytest.raises(UserError, match=f"--out {tmp_path / 'run'} holds the input {inner}"):
        check_not_input(tmp_path / "run", [inner], option="--out", whole_dir=True)
    check_not_input(inner / "averaged", [inner], whole_dir=True)  # inside an input is no threat


def _dir_with(path, text: str):
    path.mkdir()
    for name in ("model", "meta"):
        (path / name).write_text(text)
    return path


def _copy_in(path) -> str:
    """'old' or 'new' when ``path`` holds that complete copy."""
    texts = {p.name: p.read_text() for p in path.iterdir()}
    assert sorted(texts) == ["meta", "model"] and len(set(texts.values())) == 1, texts
    return texts["meta"]


@pytest.mark.parametrize("exchange", [True, False])
def test_publish_dir_replaces_the_old_copy_and_leaves_nothing_else(tmp_path, monkeypatch, exchange):
    final = _dir_with(tmp_path / "out", "old")
    tmp = _dir_with(tmp_path / ".out.new", "new")
    if not exchange:  # an OS without renameat2: the two renames
        monkeypatch.setattr(aiayn_files, "_exchange", lambda a, b: False)
    publish_dir(tmp, final)
    assert _copy_in(final) == "new" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_publish_dir_replaces_a_link_and_not_what_it_points_to(tmp_path):
    elsewhere = _dir_with(tmp_path / "elsewhere", "theirs")
    (tmp_path / "out").symlink_to(elsewhere)
    publish_dir(_dir_with(tmp_path / ".out.new", "new"), tmp_path / "out")
    assert not (tmp_path / "out").is_symlink() and _copy_in(tmp_path / "out") == "new"
    assert _copy_in(elsewhere) == "theirs"


def test_a_crash_while_publishing_a_dir_leaves_a_complete_copy(tmp_path, monkeypatch):
    final = _dir_with(tmp_path / "out", "old")
    tmp = _dir_with(tmp_path / ".out.new", "new")
    renames = []

    def crash(*args):
        raise OSError("power cut")

    def rename_once(src, dst):  # the first rename happens, then the machine stops
        if renames:
            crash()
        renames.append(src)
        os.replace(src, dst)

    monkeypatch.setattr(aiayn_files.os, "rename", rename_once)
    monkeypatch.setattr(aiayn_files.shutil, "rmtree", crash)  # the step after the swap
    with pytest.raises(OSError, match="power cut"):
        publish_dir(tmp, final)
    assert _copy_in(final) in ("old", "new")


def test_temporary_dirs_of_ended_processes_are_removed_and_only_those(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    alive = temp_dir_beside(dest)  # this process's: in use
    dead = dead_leftover(dest)
    other = dead_leftover(tmp_path / "other")  # another destination's
    elsewhere = dead.name.replace(dead.name.split("-")[1], "ffffffff")  # that pid, another host
    foreign = [tmp_path / n for n in (".out.tmp", ".out.123.tmp", "out.1-2-3.tmp", elsewhere)]
    for path in foreign:
        path.mkdir()
    assert str(os.getpid()) in alive.name and dead.name.startswith(".out.") and dead.exists()
    fresh = temp_dir_beside(dest)
    assert not dead.exists() and alive.is_dir() and fresh.is_dir() and other.is_dir()
    assert all(path.is_dir() for path in foreign)


def test_a_leftover_holding_the_only_copy_of_its_destination_is_kept(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    aside = dead_leftover(dest, holding_old_copy=True)
    dest.rmdir()  # the crash came between the fallback's two renames
    temp_dir_beside(dest)
    assert (aside / "out").is_dir()


@pytest.mark.lint  # a repository lint: `make lint` runs it
def test_io_does_not_import_torch():
    code = "import sys, aiayn.files, aiayn.parsing; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# --- the config parser answers any input with a config or a ValueError --------------------------

KEYS = [f.name for f in __import__("dataclasses").fields(TrainConfig)] + [
    "model.d_model",
    "model.P_drop",
    "model.max_len",
    "model.norm",
    "model.d_k",
    "warmpu",
    "model.x",
    "",
]
VALUES = st.one_of(
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "-1",
            "0",
            "1",
            "0.5",
            "1e999",
            "9" * 5000,
            "None",
            "null",
            "true",
            "tiny",
            "pre",
            "fp16",
            "",
            " 3 ",
            "1_000",
            "0x10",
        ]
    ),
    st.text(max_size=12),
)


@FAST
@given(
    st.lists(st.tuples(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), VALUES), max_size=4)
)
def test_any_set_strings_give_a_config_or_a_value_error(pairs):
    sets = [f"{k}={v}" for k, v in pairs]
    try:
        cfg = resolve_train_config({"preset": "tiny"}, sets)
    except ValueError as e:
        assert str(e).startswith("--set"), e
        return
    assert isinstance(cfg, TrainConfig)
    assert cfg.lr_scale > 0 and cfg.adam_eps > 0 and 0 <= cfg.eps_ls < 1  # validated, never nan


config_texts = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.tuples(
            st.sampled_from(KEYS[:12] + ["model", "x", "1"]),
            st.sampled_from(
                [
                    "1",
                    "-1",
                    ".nan",
                    "nan",
                    "tiny",
                    "[1, 2",
                    "{a: 1}",
                    "{}",
                    "'x'",
                    "2001-01-01",
                    "[]",
                    "true",
                    "1e999",
                ]
            ),
        ),
        max_size=5,
    ).map(lambda kv: "".join(f"{k}: {v}\n" for k, v in kv)),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)


@FAST
@given(st.sampled_from([".yaml", ".toml", ".json"]), config_texts)
def test_any_config_file_gives_a_config_or_an_error_naming_it(tmp_path, suffix, text):
    path = tmp_path / f"c{suffix}"
    path.write_text(text, encoding="utf-8")
    try:
        cfg = load_train_config(path)
    except ValueError as e:
        assert str(e).startswith(f"{path}: "), e  # the file first, then line or key
        return
    assert isinstance(cfg, TrainConfig)


@FAST
@given(st.binary(max_size=40))
def test_config_files_of_random_bytes_never_crash(tmp_path, data):
    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    try:
        load_train_config(path)
    except ValueError as e:
        assert str(e).startswith(f"{path}: "), e  # the file first, then line or key


def test_keys_that_are_not_strings_are_rejected_by_name(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("1: 2\npreset: tiny\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \[1\]"):
        load_train_config(path)
    path.write_text("preset: tiny\nmodel: {1: 2}\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \[1\]"):
        load_train_config(path)
    path.write_text("preset: [tiny]\n")
    with pytest.raises(ValueError, match="preset"):
        load_train_config(path)


def test_write_parallel_keeps_pairs_aligned_and_is_all_or_nothing(tmp_path):
    src, tgt = tmp_path / "train.en", tmp_path / "train.es"
    n = write_parallel([("a\nb ", "uno"), ("c", " dos\ntres")], src, tgt)
    assert n == 2
    assert src.read_text(encoding="utf-8") == "a b\nc\n"
    assert tgt.read_text(encoding="utf-8") == "uno\ndos tres\n"

    def broken():
        yield "x", "y"
        raise OSError("connection lost")

    with pytest.raises(OSError):
        write_parallel(broken(), src, tgt)
    # The earlier complete pair is untouched, and no temporary file is left behind.
    assert (
        src.read_text(encoding="utf-8") == "a b\nc\n"
        and tgt.read_text(encoding="utf-8") == "uno\ndos tres\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.en", "train.es"]


def test_a_run_log_is_read_as_records_and_a_broken_line_is_named(tmp_path):
    """One reader of log.jsonl for the demo, the plots, compare and measure: blank lines
    (a log cut by a crash ends with one) skipped, CRLF endings read as LF, a broken line named."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"update": 1, "loss": 2.5}\r\n\n{"update": 2, "valid_ppl": 9.0}\n')
    assert read_jsonl(log) == [{"update": 1, "loss": 2.5}, {"update": 2, "valid_ppl": 9.0}]
    log.write_bytes(log.read_bytes() + b'{"update": 3, "loss\n')
    with pytest.raises(UserError, match=rf"^{re.escape(str(log))}: line 4: not JSON$"):
        read_jsonl(log)
