"""aiayn.checkpoint: what loading refuses (non-finite weights, a pointer that is no checkpoint
name), the permissions of what averaging writes, and loading older checkpoints."""

import os
import shutil
import weakref
from pathlib import Path

import pytest
import torch
from _cli import copy_run, one_line_error, run_cli
from safetensors.torch import load_file, save_file

from aiayn.checkpoint import (
    WEIGHTS,
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_transformer,
)
from aiayn.checkpoint.averaging import average_checkpoints
from aiayn.checkpoint.digest import DIGESTS
from aiayn.errors import UserError

BAD = "encoder.0.feed_forward.W_2.weight"


@pytest.fixture
def ckpt(tiny_run, tmp_path) -> Path:
    """A private copy of the newest checkpoint of ``tiny_run``."""
    return Path(shutil.copytree(latest_checkpoint(tiny_run / "checkpoints"), tmp_path / "ckpt"))


def spoil(ckpt: Path, value: float, names: tuple[str, ...] = (BAD,)) -> None:
    state = load_file(str(ckpt / WEIGHTS))
    for name in names:
        state[name].view(-1)[3] = value
    save_file(state, str(ckpt / WEIGHTS))
    (ckpt / DIGESTS).unlink()  # weights written by another tool: nothing recorded to check


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(ckpt, value):
    spoil(ckpt, value)
    with pytest.raises(UserError, match=rf"^{ckpt}: {BAD} holds NaN or infinite values"):
        load_transformer(ckpt)


def test_all_nan_weights_name_the_first_tensor_and_translate_nothing(ckpt, tmp_path, capsys):
    state = load_file(str(ckpt / WEIGHTS))
    save_file({k: torch.full_like(v, float("nan")) for k, v in state.items()}, str(ckpt / WEIGHTS))
    (ckpt / DIGESTS).unlink()
    src = tmp_path / "in.txt"
    src.write_text("In the beginning\n")
    code, out, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", src)
    assert code == 2 and out == ""
    one_line_error(err, str(ckpt), "src_embed.tokens.weight holds NaN or infinite values")


def test_averaging_refuses_non_finite_weights(tiny_run, tmp_path):
    ckpts = copy_run(tiny_run, tmp_path / "checkpoints")
    spoil(ckpts / "update_0000002", float("nan"))
    with pytest.raises(UserError, match=f"update_0000002: {BAD} holds NaN"):
        average_checkpoints(list_checkpoints(ckpts), tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_an_averaged_checkpoint_gets_the_usual_permissions(tiny_run, tmp_path):
    old = os.umask(0o022)
    try:
        out = average_checkpoints(list_checkpoints(tiny_run / "checkpoints"), tmp_path / "avg")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o755  # not mkdtemp's private 0700
    files = sorted(out.iterdir())
    assert WEIGHTS in [f.name for f in files]
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o644, f.name  # safetensors alone writes 0600


def test_a_pointer_holding_a_big_file_is_quoted_in_part(tiny_run, tmp_path):
    ckpts = copy_run(tiny_run, tmp_path / "checkpoints")
    big = tmp_path / "big.txt"
    big.write_text("x" * 100_000 + "\n")
    (ckpts / "latest").unlink()
    (ckpts / "latest").symlink_to(big)
    with pytest.raises(UserError, match="not a checkpoint directory inside") as info:
        latest_checkpoint(ckpts)
    assert repr("x" * 60) + " ..." in str(info.value) and "x" * 61 not in str(info.value)


def test_the_best_pointer_never_names_what_is_outside_the_run(tiny_run, tmp_path):
    ckpts = copy_run(tiny_run, tmp_path / "checkpoints")
    assert best_checkpoint(ckpts) is None  # trained without validation
    (ckpts / "best").write_text("../../elsewhere\n")
    with pytest.raises(UserError, match="best names '../../elsewhere', which is not a checkpoint"):
        best_checkpoint(ckpts)
    (ckpts / "best").write_text("update_0000002\n")
    assert best_checkpoint(ckpts) == ckpts / "update_0000002"


# --- averaging one checkpoint at a time; files whose bytes follow their tensors ---------------


def test_averaging_holds_one_checkpoint_at_a_time_and_gives_the_mean(
    tiny_run, tmp_path, monkeypatch
):
    """The sum is accumulated as each checkpoint loads (fairseq does the same): when one loads,
    no tensor of an earlier one is still alive, and the result is the mean, bit for bit."""
    from aiayn.checkpoint import averaging as ckpt_module  # the averager reads each checkpoint

    paths = list_checkpoints(tiny_run / "checkpoints")
    states = [load_file(str(p / WEIGHTS)) for p in paths]
    loaded, alive_at_load = [], []
    load_state = ckpt_module.load_state

    def watched(path):
        alive_at_load.append(sum(any(r() is not None for r in refs) for refs in loaded))
        state = load_state(path)
        loaded.append([weakref.ref(t) for t in state.values()])
        return state

    monkeypatch.setattr(ckpt_module, "load_state", watched)
    out = average_checkpoints(paths, tmp_path / "avg")
    averaged = load_file(str(out / WEIGHTS))
    assert len(paths) == 3 and alive_at_load == [0, 0, 0, 0]  # the first is read twice
    for name, tensor in averaged.items():
        want = sum(state[name] for state in states) / len(states)
        assert torch.equal(tensor, want.to(tensor.dtype)), name


def test_a_checkpoint_file_is_the_same_bytes_whenever_its_tensors_are(tiny_run, tmp_path):
    """safetensors writes several metadata keys in a random order; ours has one, so that
    ``sha256sum`` can check a reproduction (before: the tied matrix's two aliases swapped)."""
    from aiayn.checkpoint import save_weights

    model, _ = load_transformer(latest_checkpoint(tiny_run / "checkpoints"))
    files = []
    for i in range(6):
        save_weights(model, tmp_path / f"{i}.safetensors")
        files.append((tmp_path / f"{i}.safetensors").read_bytes())
    assert all(f == files[0] for f in files)
    again, _ = load_transformer(latest_checkpoint(tiny_run / "checkpoints"))
    stored = load_file(str(tmp_path / "0.safetensors"))
    assert "generator.weight" in stored and "src_embed.tokens.weight" not in stored  # once
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, stored.get(name, stored["generator.weight"])), name


def test_loading_a_checkpoint_loads_weights_and_nothing_else(tiny_run):
    """The loaded model computes with the model's own kernels; the fast ones and the weights'
    form are the decoding door's (``runtime.for_decoding``), asked by whoever decodes."""
    from aiayn.model import Kernels
    from aiayn.runtime import for_decoding
    from aiayn.runtime.kernels import UniformDropout, key_padding

    model, _ = load_transformer(latest_checkpoint(tiny_run / "checkpoints"))
    assert model.kernels == Kernels()
    assert {type(m) for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {
        torch.nn.Dropout
    }
    ready = for_decoding(model)
    assert ready.kernels.key_padding is key_padding
    assert all(
        type(m) is UniformDropout for m in ready.modules() if isinstance(m, torch.nn.Dropout)
    )
