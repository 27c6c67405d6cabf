"""A run's ``checkpoints/latest`` and ``checkpoints/best`` pointer files stand for the
checkpoint they name wherever a command takes one (``--checkpoint``, ``--resume``,
``--init-from``)."""

from __future__ import annotations

import json
import shutil

from _cli import config, one_line_error, run_cli

from aiayn.checkpoint import latest_checkpoint


def _sources(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("In the beginning\nAnd God said\n", encoding="utf-8")
    return src


def test_translate_and_score_follow_latest_and_best(tiny_run, tmp_path, capsys):
    run = shutil.copytree(tiny_run / "checkpoints", tmp_path / "checkpoints")
    first = sorted(run.glob("update_*"))[0]
    (run / "best").write_text(first.name + "\n")
    src = _sources(tmp_path)
    for pointer, ckpt in (("latest", latest_checkpoint(run)), ("best", first)):
        argv = ["translate", "--input", src, "--quiet"]
        code, via_pointer, err = run_cli(capsys, *argv, "--checkpoint", run / pointer)
        assert code == 0, err
        code, direct, err = run_cli(capsys, *argv, "--checkpoint", ckpt)
        assert code == 0 and via_pointer == direct and len(direct.splitlines()) == 2, err
        argv = ["score", "--src", src, "--ref", src]
        code, via_pointer, err = run_cli(capsys, *argv, "--checkpoint", run / pointer)
        assert code == 0, err
        assert via_pointer == run_cli(capsys, *argv, "--checkpoint", ckpt)[1]
    # an ensemble's repeated --checkpoint too
    code, out, err = run_cli(
        capsys, "translate", "--input", src, "--checkpoint", run / "latest", "--checkpoint",
        run / "best",
    )  # fmt: skip
    assert code == 0 and len(out.splitlines()) == 2, err


def test_a_pointer_to_nothing_is_one_line(tiny_run, tmp_path, capsys):
    run = shutil.copytree(tiny_run / "checkpoints", tmp_path / "checkpoints")
    (run / "best").write_text("update_0000099\n")
    code, out, err = run_cli(
        capsys, "translate", "--input", _sources(tmp_path), "--checkpoint", run / "best"
    )
    assert code == 2 and out == ""
    one_line_error(err, f"{run / 'best'} names no complete checkpoint inside {run}")


def test_train_resumes_from_a_latest_pointer(tiny_run, tiny_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**config(tiny_corpus, out).__dict__, "max_updates": 4}))
    resume = tiny_run / "checkpoints" / "latest"  # update 3 of another run: one update more
    code, _, err = run_cli(capsys, "train", cfg, "--device", "cpu", "--resume", resume)
    assert code == 0, err
    assert [p.name for p in (out / "checkpoints").glob("update_*")] == ["update_0000004"]
