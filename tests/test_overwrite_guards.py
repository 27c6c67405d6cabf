"""Issue 12, first part: paths that destroyed data or trained on garbage while exiting 0.

Each test drives the command (in-process, through ``aiayn.cli.main.main``) or the library call a
user would make, and checks both the error and that nothing was lost.
"""

import json
import math
import os
import shutil

import pytest
import torch
from _cli import TINY, config, copy_run, one_line_error, run_cli

from aiayn.checkpoint import META, VOCAB, WEIGHTS, latest_checkpoint, list_checkpoints
from aiayn.checkpoint.averaging import average_checkpoints, is_averaged_checkpoint
from aiayn.data import Vocab
from aiayn.decode import DecodeConfig
from aiayn.errors import UserError
from aiayn.files import read_lines
from aiayn.train import load_train_config
from aiayn.train.config import resolve_train_config
from aiayn.train.trainer import Trainer

# --- 1. average --out never destroys what it did not write -------------------------------------


def test_average_refuses_an_unrelated_directory_and_keeps_it(tiny_run, tmp_path, capsys):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("months of work")
    code, _, err = run_cli(
        capsys, "average", tiny_run / "checkpoints", "--last", 2, "--out", precious
    )
    assert code == 2
    one_line_error(err, str(precious), "not an averaged checkpoint", "--force")
    assert (precious / "chapter1.tex").read_text() == "months of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis"]  # no temporary left behind


@pytest.mark.parametrize("target", ["run", "checkpoints", "checkpoint"])
def test_average_never_replaces_a_directory_holding_its_inputs_even_with_force(
    tiny_run, tmp_path, capsys, target
):
    run = tmp_path / "run"
    copy_run(tiny_run, run / "checkpoints")
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    out = {
        "run": run,
        "checkpoints": run / "checkpoints",
        "checkpoint": run / "checkpoints" / "update_0000003",
    }[target]
    code, _, err = run_cli(
        capsys, "average", run / "checkpoints", "--last", 2, "--out", out, "--force"
    )
    assert code == 2
    one_line_error(err, f"--out {out}", "the input", "update_000000")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    assert all((p / WEIGHTS).is_file() for p in list_checkpoints(run / "checkpoints"))


def test_average_replaces_a_previous_average_and_force_replaces_anything_else(
    tiny_run, tmp_path, capsys
):
    out = tmp_path / "averaged"
    assert run_cli(capsys, "average", tiny_run / "checkpoints", "--last", 1, "--out", out)[0] == 0
    assert json.loads((out / META).read_text())["averaged_from"] == ["update_0000003"]
    assert run_cli(capsys, "average", tiny_run / "checkpoints", "--last", 2, "--out", out)[0] == 0
    assert json.loads((out / META).read_text())["averaged_from"] == [
        "update_0000002",
        "update_0000003",
    ]
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("x")
    assert (
        run_cli(
            capsys, "average", tiny_run / "checkpoints", "--last", 2, "--out", other, "--force"
        )[0]
        == 0
    )
    assert is_averaged_checkpoint(other) and not (other / "x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["averaged", "other"]


def test_a_failed_average_leaves_the_previous_one_intact(tiny_run, tmp_path, monkeypatch):
    from aiayn.checkpoint import averaging

    out = average_checkpoints(
        list_checkpoints(tiny_run / "checkpoints")[-1:], tmp_path / "averaged"
    )
    before = (out / WEIGHTS).read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(averaging, "save_file", full_disk)
    with pytest.raises(OSError):
        average_checkpoints(list_checkpoints(tiny_run / "checkpoints"), out)
    assert (out / WEIGHTS).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["averaged"]


# --- 1b. no command writes its output over one of its inputs -----------------------------------


def _evaluate_files(tmp_path):
    src, ref = tmp_path / "test.en", tmp_path / "test.es"
    src.write_text("In the beginning God created the heaven\nAnd the earth\n")
    ref.write_text("En el principio creó Dios los cielos\nY la tierra\n")
    return src, ref


@pytest.mark.parametrize("victim", ["--src", "--ref", "spm.model"])
@pytest.mark.parametrize("how", ["same path", "symlink", "hard link", "input links to it"])
def test_evaluate_refuses_an_output_that_is_one_of_its_inputs(
    tiny_run, tmp_path, capsys, victim, how
):
    ckpt = shutil.copytree(tiny_run / "checkpoints" / "update_0000003", tmp_path / "ckpt")
    src, ref = _evaluate_files(tmp_path)
    target = {"--src": src, "--ref": ref, "spm.model": ckpt / VOCAB}[victim]
    output = target
    if how == "symlink":
        output = tmp_path / "hyp.link"
        output.symlink_to(target)
    elif how == "hard link":
        output = tmp_path / "hyp.hard"
        os.link(target, output)
    elif how == "input links to it":  # the input is a link to the file the output replaces
        output = tmp_path / "hyp.txt"
        shutil.move(target, output)
        target.symlink_to(output)
    before = {p: p.read_bytes() for p in (src, ref, ckpt / VOCAB)}
    code, _, err = run_cli(
        capsys,
        "evaluate",
        "--checkpoint",
        ckpt,
        "--src",
        src,
        "--ref",
        ref,
        "--output",
        output,
        "--beam",
        1,
    )
    assert code == 2
    one_line_error(err, f"--output {output} is the input", str(target))
    assert {p: p.read_bytes() for p in (src, ref, ckpt / VOCAB)} == before


@pytest.mark.parametrize("target", ["reference", "its directory"])
def test_average_never_replaces_its_choose_on_files_even_with_force(
    tiny_run, tmp_path, capsys, target
):
    data = tmp_path / "valid"
    data.mkdir()
    src, ref = _evaluate_files(data)
    out = {"reference": ref, "its directory": data}[target]
    code, _, err = run_cli(
        capsys,
        "average",
        tiny_run / "checkpoints",
        "--last",
        2,
        "--choose-on",
        src,
        ref,
        "--out",
        out,
        "--force",
    )
    assert code == 2
    one_line_error(err, f"--out {out}", "the input", str(data / "test."))
    assert sorted(p.name for p in data.iterdir()) == ["test.en", "test.es"]
    assert read_lines(ref)[1] == "Y la tierra"


def test_demo_fresh_never_deletes_its_prepared_corpus(tmp_path, monkeypatch):
    from aiayn import demo

    def no_prepare(work):
        raise AssertionError("the demo ran before checking --work against --out")

    monkeypatch.setattr(demo, "prepare_bundled", no_prepare)
    run = tmp_path / "run"
    (run / "attention").mkdir(parents=True)  # a demo output's name, holding a dataset
    (run / "attention" / "meta.json").write_text("{}")
    with pytest.raises(UserError, match=f"--out {run} holds the input {run / 'attention'}"):
        demo.run_demo(out=run, work=run / "attention", fresh=True, progress=lambda m: None)
    assert (run / "attention" / "meta.json").read_text() == "{}"


def test_experiment_refuses_to_write_its_results_into_its_checkpoint(tiny_run, tmp_path, capsys):
    ckpt = shutil.copytree(tiny_run / "checkpoints" / "update_0000003", tmp_path / "ckpt")
    before = sorted(p.name for p in ckpt.iterdir())
    code, _, err = run_cli(
        capsys,
        "experiment",
        "heads",
        "--checkpoint",
        ckpt,
        "--out",
        ckpt,
        "--budget",
        "sentences=2",
    )
    assert code == 2
    one_line_error(err, f"--out {ckpt} is the input {ckpt}")
    assert sorted(p.name for p in ckpt.iterdir()) == before


# --- 3. one line-reading rule: LF ends a line, CRLF's CR goes, a bare CR stays --------------------

MIXED = b"In the beginning\rGod created\r\nthe heaven\n"  # 2 lines: a bare CR is inside line 1


def test_translate_file_and_stdin_split_lines_alike(tiny_run, tmp_path, capsys, monkeypatch):
    import io
    import sys

    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_bytes(MIXED)
    code, from_file, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--beam", 1, "--input", src
    )
    assert code == 0, err
    assert len(from_file.splitlines()) == 2
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(MIXED)))
    code, from_stdin, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--beam", 1)
    assert code == 0, err
    assert from_stdin == from_file


def test_evaluate_and_prepare_readers_follow_the_same_rule(tmp_path):
    from aiayn.data.corpora import text_lines as corpus_lines  # what prepare reads with

    path = tmp_path / "x.txt"
    path.write_bytes(MIXED)
    expected = ["In the beginning\rGod created", "the heaven"]
    assert read_lines(path) == expected
    assert list(corpus_lines(path)) == expected


# --- 4. translate --window ---------------------------------------------------------------------


@pytest.mark.parametrize("window", [0, -1])
def test_translate_rejects_a_window_below_one(tiny_run, tmp_path, capsys, window):
    src = tmp_path / "in.txt"
    src.write_text("one\n")
    code, out, err = run_cli(
        capsys,
        "translate",
        "--checkpoint",
        latest_checkpoint(tiny_run / "checkpoints"),
        "--input",
        src,
        "--window",
        window,
    )
    assert code == 2 and out == ""
    one_line_error(err, "--window must be at least 1", str(window))


# --- 5. every numeric key range-checked ---------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, key",
    [
        ("lr_scale=-1", "lr_scale"),
        ("lr_scale=nan", "lr_scale"),
        ("lr_scale=inf", "lr_scale"),
        ("lr_scale=0", "lr_scale"),
        ("adam_eps=nan", "adam_eps"),
        ("adam_beta1=1", "adam_beta1"),
        ("adam_beta2=-0.1", "adam_beta2"),
        ("eps_ls=nan", "eps_ls"),
        ("num_threads=0", "num_threads"),
        ("num_threads=-2", "num_threads"),
        ("max_updates=0", "max_updates"),
        ("max_minutes=nan", "max_minutes"),
        ("max_minutes=-1", "max_minutes"),
        ("save_every_minutes=inf", "save_every_minutes"),
        ("save_every_updates=0", "save_every_updates"),
        ("seed=-1", "seed"),
        ("warmup=0", "warmup"),
        ("model.P_drop=nan", "P_drop"),
        ("model.attention_dropout=-0.5", "attention_dropout"),
        ("model.d_model=0", "d_model"),
        ("model.max_len=-3", "max_len"),
    ],
)
def test_out_of_range_values_are_rejected_naming_the_key(assignment, key):
    with pytest.raises(ValueError, match=key):
        resolve_train_config({"preset": "tiny"}, [assignment])


def test_train_with_a_nan_learning_rate_fails_before_training(tmp_path, capsys):
    code, _, err = run_cli(
        capsys,
        "train",
        "--set",
        "preset=tiny",
        "--set",
        f"out={tmp_path / 'run'}",
        "--set",
        "lr_scale=nan",
    )
    assert code == 2
    one_line_error(err, "lr_scale", "nan")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"alpha": math.nan}, "alpha"),
        ({"alpha": math.inf}, "alpha"),
        ({"alpha": -0.5}, "alpha"),
        ({"max_len_a": math.nan}, "max_len_a"),
        ({"beam": 0}, "beam"),
    ],
)
def test_decode_config_ranges(overrides, key):
    with pytest.raises(ValueError, match=key):
        DecodeConfig(**overrides)


# --- 6. average --last, mixtures, fewer than asked ----------------------------------------------


@pytest.mark.parametrize("last", [0, -2])
def test_average_last_must_be_at_least_one(tiny_run, tmp_path, capsys, last):
    code, _, err = run_cli(
        capsys, "average", tiny_run / "checkpoints", "--last", last, "--out", tmp_path / "avg"
    )
    assert code == 2
    one_line_error(err, "--last must be at least 1")
    assert not (tmp_path / "avg").exists()


def test_average_warns_when_fewer_checkpoints_than_asked(tiny_run, tmp_path, capsys):
    code, out, err = run_cli(
        capsys, "average", tiny_run / "checkpoints", "--last", 20, "--out", tmp_path / "avg"
    )
    assert code == 0
    assert "warning: asked for the last 20 checkpoints" in err and "holds only 3" in err
    assert "averaged 3 checkpoints" in out
    assert "(no more were saved)" in err and "keep_last" not in err  # it keeps 5: not the cause
    ckpts = copy_run(tiny_run, tmp_path / "ckpts")
    meta_path = latest_checkpoint(ckpts) / META
    meta = json.loads(meta_path.read_text())
    meta["train_config"]["keep_last"] = 3  # a run that kept its last 3
    meta_path.write_text(json.dumps(meta))
    code, _, err = run_cli(capsys, "average", ckpts, "--last", 20, "--out", tmp_path / "avg2")
    assert code == 0 and "(the run's keep_last, 3, bounds how many are kept)" in err


def test_average_refuses_a_mixture_of_vocabularies(tiny_run, tiny_corpus, tmp_path):
    ckpts = copy_run(tiny_run, tmp_path / "ckpts")
    other = Vocab.train(
        [tiny_corpus.parent / "train.es"], tmp_path / "other" / "spm", vocab_size=300
    )
    assert len(other) == len(
        Vocab.load(ckpts / "update_0000003" / VOCAB)
    )  # same size, other pieces
    shutil.copyfile(other.path, ckpts / "update_0000003" / VOCAB)
    with pytest.raises(ValueError, match="different vocabularies"):
        average_checkpoints(list_checkpoints(ckpts), tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_average_refuses_a_mixture_of_model_configs(tiny_run, tmp_path):
    ckpts = copy_run(tiny_run, tmp_path / "ckpts")
    meta_path = ckpts / "update_0000001" / META
    meta = json.loads(meta_path.read_text())
    meta["model_config"]["norm"] = "pre"  # same tensor shapes, another model
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="different model configs"):
        average_checkpoints(list_checkpoints(ckpts), tmp_path / "avg")


def _rewrite_weights(ckpt, change) -> None:
    """Replace the tensors of ``ckpt``'s model.safetensors by ``change(tensors)``."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / WEIGHTS))
    save_file(change(tensors), str(ckpt / WEIGHTS))
    (ckpt / "SHA256SUMS").unlink()  # weights written by another tool: nothing recorded to check


def test_average_refuses_a_tensor_of_another_shape_by_name(tiny_run, tmp_path):
    ckpts = copy_run(tiny_run, tmp_path / "ckpts")
    name = "encoder.0.feed_forward.W_1.weight"
    # A [1, d] tensor for a [d_ff, d] weight broadcasts in a sum: it must be refused, not averaged.
    _rewrite_weights(ckpts / "update_0000002", lambda t: {**t, name: t[name][:1].clone()})
    with pytest.raises(UserError, match=f"update_0000002: tensor {name} has shape \\[1, 32\\]"):
        average_checkpoints(list_checkpoints(ckpts), tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_average_refuses_a_missing_tensor_by_name(tiny_run, tmp_path):
    ckpts = copy_run(tiny_run, tmp_path / "ckpts")
    name = "encoder.0.ffn_norm.bias"
    _rewrite_weights(ckpts / "update_0000003", lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(UserError, match=f"update_0000003 has no tensor {name}"):
        average_checkpoints(list_checkpoints(ckpts), tmp_path / "avg")


def test_average_refuses_checkpoints_stored_in_different_dtypes(tiny_run, tmp_path):
    ckpts = copy_run(tiny_run, tmp_path / "ckpts")
    _rewrite_weights(ckpts / "update_0000003", lambda t: {k: v.half() for k, v in t.items()})
    with pytest.raises(
        UserError, match="update_0000003: tensor .* is torch.float16, in .* torch.float32"
    ):
        average_checkpoints(list_checkpoints(ckpts), tmp_path / "avg")


def test_average_sums_in_fp32_and_stores_the_common_dtype(tiny_run, tmp_path):
    from aiayn.checkpoint import load_state

    ckpts = copy_run(tiny_run, tmp_path / "ckpts")
    for ckpt in list_checkpoints(ckpts):
        _rewrite_weights(
            ckpt, lambda t: {k: torch.full_like(v, 60000).half() for k, v in t.items()}
        )
    out = average_checkpoints(list_checkpoints(ckpts), tmp_path / "avg")
    state = load_state(out)
    assert {t.dtype for t in state.values()} == {torch.float16}
    # 3 x 60000 overflows fp16 (max 65504); summed in fp32 the mean is exact.
    assert all(torch.equal(t, torch.full_like(t, 60000)) for t in state.values())


# --- 7. the valid split: checked at start-up; a failure never loses the trained updates ---------


def test_a_dataset_without_valid_split_fails_at_start_up(tiny_corpus, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_corpus, data)
    meta = json.loads((data / "meta.json").read_text())
    del meta["splits"]["valid"]
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="no split 'valid'.*validate=false"):
        Trainer(config(data, tmp_path / "run", validate=True))
    assert not (tmp_path / "run").exists()
    Trainer(config(data, tmp_path / "run", validate=False))  # without validation it may train


def test_a_validation_failure_saves_the_trained_weights_first(tiny_corpus, tmp_path, monkeypatch):
    def broken(self):
        raise UserError("valid.src.tokens.npy: damaged")

    monkeypatch.setattr(Trainer, "validate", broken)
    trainer = Trainer(
        config(tiny_corpus, tmp_path / "run", validate=True, max_updates=3, save_every_updates=3)
    )
    with pytest.raises(
        ValueError, match="validation failed at update 3; the trained weights were saved first"
    ):
        trainer.run(resume=None)
    saved = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert saved.name == "update_0000003" and json.loads((saved / META).read_text())["update"] == 3


# --- 8. the big preset keeps the 20 checkpoints the paper averages ------------------------------


def test_big_preset_keeps_twenty_checkpoints(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("preset: big\n")
    assert load_train_config(path).keep_last == 20
    assert (
        load_train_config(None, ["keep_last=3"], preset="big").keep_last == 3
    )  # still overridable


# --- 9. fp16: a step the gradient scaler skips is not an update ---------------------------------


def test_a_skipped_fp16_step_advances_neither_schedule_nor_count(tiny_corpus, tmp_path):
    trainer = Trainer(config(tiny_corpus, tmp_path / "run"))
    # A scale so large that the scaled loss overflows: the scaler must skip the step.
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    batches = iter(trainer.sampler)
    stats = trainer.train_update(batches)
    assert stats["stepped"] == 0.0
    assert trainer.update == 0 and trainer.scheduler.last_epoch == 0
    assert trainer.scaler.get_scale() == 2.0**126
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    assert trainer.train_update(batches)["stepped"] == 1.0
    assert trainer.update == 1 and trainer.scheduler.last_epoch == 1


def test_training_stops_when_the_scaler_skips_every_step(tiny_corpus, tmp_path, monkeypatch):
    from aiayn.train import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "MAX_SKIPPED_STEPS", 3)
    trainer = Trainer(config(tiny_corpus, tmp_path / "run", max_updates=50))
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, backoff_factor=1.0 - 2**-20)
    with pytest.raises(
        trainer_module.NonFiniteLossError, match="skipped 3 steps in a row at update 1"
    ):
        trainer.run(resume=None)
    assert trainer.update == 0


# --- 10. model.max_len against the data, at start-up --------------------------------------------


def test_model_max_len_shorter_than_the_data_fails_at_start_up(tiny_corpus, tmp_path):
    with pytest.raises(
        UserError, match=r"model.max_len=8 is shorter than the train split.*raise model.max_len"
    ):
        Trainer(config(tiny_corpus, tmp_path / "run", model={**TINY, "max_len": 8}))
    assert not (tmp_path / "run").exists()


# --- demo --fresh deletes a demo run, nothing else ----------------------------------------------


def test_demo_fresh_refuses_a_directory_that_is_not_a_demo_run(tmp_path):
    from aiayn.demo import run_demo
    from aiayn.errors import UserError

    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not a demo run directory.*notes.txt"):
        run_demo(out=home, fresh=True, work=tmp_path / "work", progress=lambda message: None)
    assert (home / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "work").exists()


def test_demo_fresh_refuses_a_train_run_and_keeps_every_file(tiny_run, tmp_path):
    from aiayn.demo import run_demo

    run = shutil.copytree(tiny_run, tmp_path / "run")
    before = sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*"))
    with pytest.raises(UserError, match="aiayn demo did not create it.*delete it by hand"):
        run_demo(out=run, fresh=True, work=tmp_path / "work", progress=lambda message: None)
    assert sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*")) == before
    assert not (tmp_path / "work").exists()
