"""What the commands share (``aiayn.cli.common``): ``--device`` is checked once, before any
work, for every command that takes it."""

import pytest
import torch
from _cli import one_line_error, run_cli

from aiayn.checkpoint import latest_checkpoint
from aiayn.cli.common import check_device
from aiayn.errors import UserError

# Every command taking --device, with the other arguments it needs to parse.
COMMANDS = [
    ["translate", "--checkpoint", "CKPT"],
    ["evaluate", "--checkpoint", "CKPT", "--src", "s", "--ref", "r"],
    ["serve", "--checkpoint", "CKPT"],
    ["train"],
    ["parse", "train"],
    ["parse", "evaluate", "--checkpoint", "CKPT", "--data", "d"],
    ["parse", "parse", "--checkpoint", "CKPT"],
]


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine, whatever it has, as one without CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(
    "device, problem",
    [
        ("potato", "--device potato: not a device; use cpu, cuda or cuda:N"),
        ("meta", "--device meta: not available here; use cpu, cuda or cuda:N"),
        ("cuda", "--device cuda: CUDA is not available on this machine; use cpu"),
        ("cuda:1", "--device cuda:1: CUDA is not available on this machine; use cpu"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line(tiny_run, capsys, no_cuda, argv, device, problem):
    ckpt = str(latest_checkpoint(tiny_run / "checkpoints"))
    code, out, err = run_cli(
        capsys, *[ckpt if a == "CKPT" else a for a in argv], "--device", device
    )
    assert code == 2 and out == ""
    one_line_error(err, f"aiayn {argv[0]}: error: {problem}")
    assert len(err.strip().splitlines()) == 1, err


def test_device_names_this_machine_has_pass(no_cuda, monkeypatch):
    assert check_device("cpu") == "cpu"
    assert check_device("auto") == "cpu"  # cuda where there is one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [check_device(d) for d in ("auto", "cuda", "cuda:1")] == ["cuda", "cuda", "cuda:1"]
    with pytest.raises(UserError, match="^--device cuda:2: this machine has 2 CUDA devices"):
        check_device("cuda:2")
