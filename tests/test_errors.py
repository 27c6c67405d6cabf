"""Issue 12, second part: bad input gives one line naming the file, line or key (exit 2), never
a traceback; a full disk and a planted pickle are named for what they are."""

import errno
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _cli import config, copy_run, one_line_error, run_cli

from aiayn import checkpoint
from aiayn.checkpoint import (
    META,
    TRAINER,
    WEIGHTS,
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
)
from aiayn.checkpoint.digest import DIGESTS, file_sha256
from aiayn.errors import UserError
from aiayn.files import write_text_atomic
from aiayn.train import load_train_config


@pytest.fixture
def ckpt(tiny_run, tmp_path) -> Path:
    """A private copy of the newest checkpoint of ``tiny_run``."""
    return Path(shutil.copytree(latest_checkpoint(tiny_run / "checkpoints"), tmp_path / "ckpt"))


# --- translate: invalid UTF-8 is reported by line, the rest is translated -----------------------


def test_translate_reports_invalid_utf8_by_line_and_decodes_the_rest(ckpt, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_bytes(b"In the beginning\n\xff\xfe broken\nGod created\n")
    code, out, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--beam", 1, "--input", src)
    assert code == 2
    one_line_error(
        err, str(src), "1 line(s) not valid UTF-8 (line 2)", "the other 2 were translated"
    )
    lines = out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # 3 outputs; the bad one empty


# --- configuration files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, text, line",
    [
        ("c.yaml", "preset: tiny\nwarmup: [1, 2\nlr_scale: 2\n", 3),
        ("c.yaml", "preset: tiny\nmodel: d_ff: 3\n", 2),
        ("c.toml", 'preset = "tiny"\nwarmup = \n', 2),
        ("c.json", '{"preset": "tiny",\n "warmup": 10,,\n}', 2),
    ],
)
def test_a_broken_config_file_is_named_with_its_line(tmp_path, capsys, name, text, line):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{path}: line {line}: invalid (YAML|TOML|JSON) \("):
        load_train_config(path)
    code, _, err = run_cli(capsys, "train", path)
    assert code == 2
    one_line_error(err, f"{path}: line {line}")


def test_a_config_that_is_a_directory_or_binary_is_named(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(ValueError, match="d.yaml: is a directory"):
        load_train_config(tmp_path / "d.yaml")
    (tmp_path / "b.yaml").write_bytes(b"preset: \xff\n")
    with pytest.raises(ValueError, match="b.yaml: invalid UTF-8 at byte 8"):
        load_train_config(tmp_path / "b.yaml")


# --- damaged checkpoints ----------------------------------------------------------------------


def test_a_truncated_safetensors_file_is_named(ckpt, tmp_path, capsys):
    data = (ckpt / WEIGHTS).read_bytes()
    (ckpt / WEIGHTS).write_bytes(data[: len(data) // 2])
    src = tmp_path / "in.txt"
    src.write_text("one\n")
    code, out, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", src)
    assert code == 2 and out == ""
    one_line_error(err, str(ckpt / WEIGHTS), "not a readable safetensors file", "truncated")


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"update": 3,\n "model_config": {', "line 2: invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"update": 3}', "no 'model_config' entry"),
    ],
)
def test_an_invalid_meta_json_is_named(ckpt, tmp_path, capsys, text, problem):
    (ckpt / META).write_text(text)
    src = tmp_path / "in.txt"
    src.write_text("one\n")
    code, _, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", src)
    assert code == 2
    one_line_error(err, str(ckpt / META), problem)


class Planted:
    """A pickle that would run a shell command when loaded without weights_only."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_planted_pickle_in_trainer_pt_is_refused_as_untrusted(
    ckpt, tiny_corpus, tmp_path, capsys
):
    marker = tmp_path / "code-ran"
    torch.save({"optimizer": Planted(marker)}, ckpt / TRAINER)
    with pytest.raises(UserError, match="not a trusted checkpoint") as info:
        load_trainer_state(ckpt)
    assert "weights_only=False" not in str(info.value) and "weights_only" not in str(info.value)
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps({**config(tiny_corpus, tmp_path / "run").__dict__}))
    code, _, err = run_cli(capsys, "train", cfg_path, "--device", "cpu", "--resume", ckpt)
    assert code == 2
    one_line_error(err, str(ckpt / TRAINER), "not a trusted checkpoint")
    assert "weights_only" not in err and not marker.exists()


def _garbage(seed: int) -> bytes:
    """Random bytes, some after a pickle's protocol header: each makes the weights-only
    unpickler fail another way (IndexError, KeyError, UnicodeDecodeError)."""
    rng = random.Random(seed)
    return b"\x80\x02" + rng.randbytes(100) if seed % 2 else rng.randbytes(200)


@pytest.mark.parametrize("seed", [2, 20, 195])
@pytest.mark.parametrize("recorded", [True, False], ids=["with-digests", "without-digests"])
def test_garbage_in_trainer_pt_is_one_line_on_resume(
    ckpt, tiny_corpus, tmp_path, capsys, seed, recorded
):
    (ckpt / TRAINER).write_bytes(_garbage(seed))
    if not recorded:  # a checkpoint saved before digests were recorded
        (ckpt / DIGESTS).unlink()
    with pytest.raises(
        UserError, match=f"^{ckpt / TRAINER}: unreadable .*the checkpoint is damaged"
    ):
        load_trainer_state(ckpt)
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps({**config(tiny_corpus, tmp_path / "run").__dict__}))
    code, _, err = run_cli(capsys, "train", cfg_path, "--device", "cpu", "--resume", ckpt)
    assert code == 2
    one_line_error(err, str(ckpt / TRAINER), "the checkpoint is damaged")


def _flip(path: Path, offset_from_end: int) -> None:
    """Eight bytes changed inside the file's last tensor: it still loads, as other numbers."""
    data = bytearray(path.read_bytes())
    at = len(data) - offset_from_end
    data[at : at + 8] = bytes(b ^ 0x5A for b in data[at : at + 8])
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_the_weights_are_one_line_naming_the_file(ckpt, tmp_path, capsys):
    _flip(ckpt / WEIGHTS, 64)
    src = tmp_path / "in.txt"
    src.write_text("one\n")
    code, out, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", src)
    assert code == 2 and out == ""
    one_line_error(err, str(ckpt / WEIGHTS), "SHA-256", "damaged")
    with pytest.raises(UserError, match="SHA-256"):
        checkpoint.load_state(ckpt)


def test_flipped_bytes_in_the_trainer_state_are_named(ckpt):
    state = load_trainer_state(ckpt)  # as saved: the digest matches
    path = ckpt / TRAINER
    data = path.read_bytes()
    # the first stored tensor's bytes: torch.save's zip keeps them uncompressed under data/0
    at = data.index(b"data/0") + 200
    path.write_bytes(data[:at] + bytes(b ^ 0x5A for b in data[at : at + 8]) + data[at + 8 :])
    with pytest.raises(UserError, match=f"^{path}: its SHA-256 is not the one SHA256SUMS recorded"):
        load_trainer_state(ckpt)
    assert state


@pytest.mark.parametrize(
    "sums", [b"not a digest\n", b"\xff\xfe garbage", b"abc  model.safetensors\n"]
)
def test_a_damaged_sha256sums_is_named_not_skipped(ckpt, tmp_path, capsys, sums):
    (ckpt / DIGESTS).write_bytes(sums)
    src = tmp_path / "in.txt"
    src.write_text("one\n")
    code, out, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", src)
    assert code == 2 and out == ""
    one_line_error(err, f"{ckpt / DIGESTS}: line 1 is not a sha256sum line", "damaged")


def test_a_changed_sha256sums_is_not_blamed_on_the_weights_alone(ckpt):
    lines = (ckpt / DIGESTS).read_text().splitlines()
    (ckpt / DIGESTS).write_text("".join(("0" * 64 + line[64:] + "\n") for line in lines))
    with pytest.raises(UserError, match=r"the file or SHA256SUMS is damaged"):
        checkpoint.load_state(ckpt)


def test_a_checkpoint_without_digests_loads_as_before(ckpt):
    recorded = {
        line.split("  ")[1]: line.split("  ")[0]
        for line in (ckpt / DIGESTS).read_text().splitlines()
    }
    assert recorded == {name: file_sha256(ckpt / name) for name in (WEIGHTS, TRAINER)}
    checked = checkpoint.load_transformer(ckpt)[0].state_dict()
    (ckpt / DIGESTS).unlink()
    unchecked = checkpoint.load_transformer(ckpt)[0].state_dict()
    assert all(torch.equal(checked[name], unchecked[name]) for name in checked)
    assert load_trainer_state(ckpt).keys() == torch.load(ckpt / TRAINER).keys()


# --- training's out ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["a file", "inside a file"])
def test_an_out_that_cannot_be_a_run_directory_is_one_line_naming_the_key(
    tiny_corpus, tmp_path, capsys, where
):
    (tmp_path / "taken").write_text("mine\n")
    out = tmp_path / "taken" if where == "a file" else tmp_path / "taken" / "run"
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps({**config(tiny_corpus, tmp_path / "run").__dict__}))
    code, _, err = run_cli(capsys, "train", cfg_path, "--device", "cpu", "--set", f"out={out}")
    assert code == 2
    one_line_error(err, f"out: {out}")
    assert (tmp_path / "taken").read_text() == "mine\n"


def test_an_unwritable_output_folder_is_named_not_the_hidden_temporary_one(tmp_path, monkeypatch):
    from aiayn.files import temp_dir_beside

    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):  # root may write anywhere: the OS's answer, staged
        if self.parent == tmp_path / "ro":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(UserError) as info:
        temp_dir_beside(tmp_path / "ro" / "d")
    assert str(info.value) == (
        f"{tmp_path / 'ro' / 'd'}: cannot write it: {tmp_path / 'ro'} is not writable "
        "(Permission denied)"
    )


def test_an_output_on_a_read_only_file_system_is_refused_first_by_its_name(ckpt, tmp_path, capsys):
    """/proc takes no new file, for root too: refused before the model decodes, naming the
    path given, not a hidden temporary file beside it."""
    (tmp_path / "src.txt").write_text("one\n")
    (tmp_path / "ref.txt").write_text("uno\n")
    out = Path("/proc/aiayn-nowhere/hyp.txt")
    code, _, err = run_cli(
        capsys, "evaluate", "--checkpoint", ckpt, "--src", tmp_path / "src.txt",
        "--ref", tmp_path / "ref.txt", "--output", out,
    )  # fmt: skip
    assert code == 2
    one_line_error(err, f"cannot write {out}: /proc is not writable")
    with pytest.raises(UserError, match=f"^cannot write {out}"):
        write_text_atomic(out, "x")


# --- damaged datasets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, keep",
    [
        ("train.src.tokens.npy", 40),  # inside the header
        ("train.tgt.tokens.npy", -100),  # the header whole, the data cut short
        ("train.src.offsets.npy", -16),
        ("valid.tgt.offsets.npy", 0),  # empty
    ],
)
def test_a_truncated_dataset_array_is_one_line_naming_it_and_prepare(
    tiny_corpus, tmp_path, capsys, name, keep
):
    data = Path(shutil.copytree(tiny_corpus, tmp_path / "data"))
    raw = (data / name).read_bytes()
    (data / name).write_bytes(raw[:keep])
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps({**config(data, tmp_path / "run", validate=True).__dict__}))
    code, _, err = run_cli(capsys, "train", cfg_path, "--device", "cpu")
    assert code == 2
    one_line_error(err, name.split(".")[0], "damaged", "aiayn prepare")
    assert str(data) in err


# --- evaluate ----------------------------------------------------------------------------------


def test_evaluate_output_that_is_a_directory_fails_before_decoding(
    ckpt, tmp_path, capsys, monkeypatch
):
    from aiayn import evaluate

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the output path was checked")

    monkeypatch.setattr(evaluate, "load_translator", no_model)
    (tmp_path / "s").write_text("a\n")
    (tmp_path / "r").write_text("b\n")
    (tmp_path / "hyps").mkdir()
    code, _, err = run_cli(
        capsys,
        "evaluate",
        "--checkpoint",
        ckpt,
        "--src",
        tmp_path / "s",
        "--ref",
        tmp_path / "r",
        "--output",
        tmp_path / "hyps",
    )
    assert code == 2
    one_line_error(err, str(tmp_path / "hyps"), "is a directory")


@pytest.mark.parametrize(
    "src_text, ref_text, problem",
    [
        ("", "", "are both empty: nothing to evaluate"),
        ("a\nb\n", "", "the reference file {ref} is empty"),
        ("a\nb\n", "x\n", "{src} has 2 lines but {ref} has 1"),
        ("\n \n", "x\ny\n", "no line of {src} has text"),
    ],
)
@pytest.mark.parametrize("command", ["evaluate", "average --choose-on"])
def test_evaluate_and_average_choose_on_check_the_test_files_alike(
    tiny_run, tmp_path, capsys, src_text, ref_text, problem, command
):
    src, ref = tmp_path / "s.txt", tmp_path / "r.txt"
    src.write_text(src_text)
    ref.write_text(ref_text)
    if command == "evaluate":
        ckpt = latest_checkpoint(tiny_run / "checkpoints")
        argv = ["evaluate", "--checkpoint", ckpt, "--src", src, "--ref", ref]
    else:
        argv = ["average", tiny_run / "checkpoints", "--last", 2, "--choose-on", src, ref]
        argv += ["--out", tmp_path / "avg"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    one_line_error(err, problem.format(src=src, ref=ref))
    assert "perplexity" not in out and not (tmp_path / "avg").exists()


def test_alpha_nan_is_a_one_line_error(ckpt, tmp_path, capsys):
    (tmp_path / "s").write_text("a\n")
    code, out, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--alpha", "nan", "--input", tmp_path / "s"
    )
    assert code == 2 and out == ""
    one_line_error(err, "alpha must be a finite number", "nan")


# --- a full disk while saving -----------------------------------------------------------------


def test_a_full_disk_while_saving_removes_the_partial_checkpoint_and_says_so(
    tiny_run, tmp_path, monkeypatch
):
    ckpts = copy_run(tiny_run, tmp_path / "ckpts")
    real_save = checkpoint.save_weights

    def save_until_full(model, path):
        real_save(model, path)  # a partial file exists on disk when the write fails
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_weights", save_until_full)
    model, _ = checkpoint.load_transformer(ckpts / "update_0000003")
    with pytest.raises(OSError, match="no space left on device while saving checkpoint") as info:
        checkpoint.save_checkpoint(ckpts, 4, model, {"update": 4}, None, None)
    assert info.value.errno == errno.ENOSPC and "update_0000003" in str(info.value)
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "latest",
        "update_0000001",
        "update_0000002",
        "update_0000003",
    ]
    assert latest_checkpoint(ckpts).name == "update_0000003"


def test_train_reports_a_full_disk_in_one_line(tiny_corpus, tmp_path, capsys, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_weights", full)
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps(config(tiny_corpus, tmp_path / "run", max_updates=1).__dict__))
    code, _, err = run_cli(capsys, "train", cfg_path, "--device", "cpu")
    assert code == 2
    one_line_error(err, "no space left on device", "the partial .update_0000001.", "was removed")
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == []


# --- checkpoints/latest stays inside the run ----------------------------------------------------


@pytest.mark.parametrize("pointer", ["../../elsewhere", "/tmp", "update_0000003/../../x", "link"])
def test_latest_never_points_outside_the_run(tiny_run, tmp_path, pointer):
    ckpts = copy_run(tiny_run, tmp_path / "run" / "checkpoints")
    outside = tmp_path / "elsewhere"
    shutil.copytree(ckpts / "update_0000003", outside)
    (ckpts / "update_0000009").symlink_to(outside)
    (ckpts / "latest").write_text(("update_0000009" if pointer == "link" else pointer) + "\n")
    with pytest.raises(UserError, match="not a checkpoint directory inside"):
        latest_checkpoint(ckpts)
    assert "update_0000009" not in [
        p.name for p in list_checkpoints(ckpts)
    ]  # a link is no checkpoint


def test_a_bug_raising_valueerror_keeps_its_traceback_while_a_user_error_is_one_line(
    capsys, monkeypatch
):
    """Only ``UserError`` (and an OSError about the user's paths) become one line: a ValueError
    from inside numpy, torch or our own code is a bug, and hiding its traceback would hide
    where it happened."""
    import aiayn.cli.main as parser_main
    from aiayn.errors import UserError

    def bug(args):
        raise ValueError("math domain error deep inside a library")

    args = parser_main.build_parser().parse_args(["info", "--presets"])
    monkeypatch.setattr(parser_main, "build_parser", lambda: _FixedParser(args, bug))
    with pytest.raises(ValueError, match="math domain error"):
        parser_main.main(["info"])

    def mistake(args):
        raise UserError("corpus.txt: line 3: expected 2 tab-separated fields, found 1")

    monkeypatch.setattr(parser_main, "build_parser", lambda: _FixedParser(args, mistake))
    code, _, err = run_cli(capsys, "info")
    assert code == 2
    one_line_error(err, "aiayn info: error: corpus.txt: line 3")


@pytest.mark.parametrize(
    "error, one_line",
    [
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "corpus.txt"), True),
        (PermissionError(errno.EACCES, "Permission denied", "runs/x"), True),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "out"), True),
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro"), True),
        (OSError(errno.EINVAL, "Invalid argument"), False),  # a bug's bad call
        (OSError(errno.ENOMEM, "Cannot allocate memory"), False),
        (OSError("a library's own complaint"), False),
        (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), False),
    ],
)
def test_only_oserrors_about_the_users_paths_are_one_line(capsys, monkeypatch, error, one_line):
    import aiayn.cli.main as parser_main

    def fails(args):
        raise error

    args = parser_main.build_parser().parse_args(["info", "--presets"])
    monkeypatch.setattr(parser_main, "build_parser", lambda: _FixedParser(args, fails))
    if one_line:
        code, _, err = run_cli(capsys, "info")
        assert code == 2
        one_line_error(err, "aiayn info: error:", str(error))
    else:
        with pytest.raises(type(error)):
            parser_main.main(["info"])


@pytest.mark.parametrize(
    "content", [b"not gzip at all\n", gzip.compress(b"a line\n" * 1000)[:-10]], ids=["not", "cut"]
)
def test_a_damaged_gz_input_is_one_line_naming_it(ckpt, tmp_path, capsys, content):
    # a .gz that is not one (BadGzipFile, an OSError) or cut short (EOFError): not a bug
    from aiayn.files import count_lines, read_lines

    path = tmp_path / "src.en.gz"
    path.write_bytes(content)
    for read in (read_lines, count_lines):
        with pytest.raises(UserError, match=f"{path}: not a readable gzip file"):
            read(path)
    code, out, err = run_cli(capsys, "score", "--checkpoint", ckpt, "--src", path, "--ref", path)
    assert code == 2 and out == ""
    one_line_error(err, f"{path}: not a readable gzip file")


class _FixedParser:
    """A parser whose parse_args returns ``args`` with ``func`` replaced."""

    def __init__(self, args, func):
        self.args, self.func = args, func

    def parse_args(self, argv):
        self.args.func = self.func
        return self.args


@pytest.mark.parametrize("given", ["run", "run/checkpoints"])
def test_a_run_directory_given_as_a_checkpoint_names_its_latest(tiny_run, tmp_path, capsys, given):
    path = tiny_run if given == "run" else tiny_run / "checkpoints"
    src = tmp_path / "in.txt"
    src.write_text("one\n")
    code, out, err = run_cli(capsys, "translate", "--checkpoint", path, "--input", src)
    assert code == 2 and out == ""
    latest = latest_checkpoint(tiny_run / "checkpoints")
    one_line_error(
        err,
        f"{path} is not a checkpoint: meta.json is missing; {path} holds a run's checkpoints: "
        f"give {tiny_run / 'checkpoints' / 'latest'} (now {latest.name})",
    )


@pytest.mark.slow
def test_a_prefix_file_longer_than_an_input_redirected_from_a_file_is_refused_first(ckpt, tmp_path):
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    (tmp_path / "prefix.txt").write_text("a\nb\nc\n")
    env = {**os.environ, "PYTHONPATH": str(Path(checkpoint.__file__).parents[1])}
    with open(tmp_path / "in.txt", "rb") as stdin:  # `< in.txt`: a file, not a pipe
        done = subprocess.run(
            [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(ckpt)]
            + ["--prefix", str(tmp_path / "prefix.txt"), "--beam", "1"],
            stdin=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    assert (done.returncode, done.stdout) == (2, "")  # nothing translated before the refusal
    assert done.stderr == (
        f"aiayn translate: error: --prefix {tmp_path / 'prefix.txt'} has 3 lines, the input 2: "
        "give one line per input line\n"
    )


def test_ctrl_c_anywhere_in_a_command_is_one_line_and_status_130(tmp_path, capsys, monkeypatch):
    """Ctrl-C while `aiayn import` (a command with no handler of its own) works, or while any
    handler still imports the library: one line naming the command, no traceback."""
    import aiayn.export.marian_import as marian_import

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(marian_import, "import_marian", interrupted)
    code, out, err = run_cli(capsys, "import", tmp_path / "opus", "--out", tmp_path / "ckpt")
    assert code == 130 and out == ""
    assert err.strip() == "aiayn import: stopped by SIGINT"
