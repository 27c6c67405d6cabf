"""Section 5: schedule, loss, split-invariant updates, exact resume, DDP, averaging, configs."""

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _cli import TINY, dead_leftover, one_line_error, run_cli
from _cli import config as cli_config
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch._dynamo.utils import counters
from torch.utils.flop_counter import FlopCounterMode

from aiayn import ModelConfig, Transformer
from aiayn.checkpoint import (
    best_checkpoint,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_transformer,
    save_checkpoint,
)
from aiayn.checkpoint.averaging import average_checkpoints
from aiayn.config import PRESETS
from aiayn.data import TokenDataset, Vocab
from aiayn.decode import DecodeConfig, SearchRequest
from aiayn.errors import UserError
from aiayn.evaluate import evaluate_model
from aiayn.files import temp_dir_beside
from aiayn.runtime import hardware
from aiayn.runtime.flops import real_lengths, training_flops
from aiayn.runtime.policy import resolve_attention
from aiayn.train import TrainConfig, load_train_config, noam_rate
from aiayn.train import trainer as trainer_module
from aiayn.train.config import resolve_train_config
from aiayn.train.loss import label_smoothed_nll
from aiayn.train.trainer import NonFiniteLossError, Trainer

# torch.compile takes minutes a test on a CPU: an oracle, run by `make test-oracles`
COMPILED = (pytest.mark.oracle, pytest.mark.compile)


def config(data: Path, out: Path, **overrides) -> TrainConfig:
    """``_cli.config`` with 6 updates, enough for the checkpoint and resume tests here."""
    return cli_config(data, out, **{"max_updates": 6, **overrides})


# --- 5.3 schedule (the 5.4 loss is pinned in test_loss.py) -------------------------------------------------------------


@pytest.mark.parametrize(
    "step, expected",
    [
        (1, 512**-0.5 * 4000**-1.5),  # 1.7469e-07: first warm-up step
        (2000, 512**-0.5 * 2000 * 4000**-1.5),  # halfway up: 3.4939e-04
        (4000, 512**-0.5 * 4000**-0.5),  # the peak: 6.9877e-04
        (16000, 512**-0.5 * 16000**-0.5),  # decay: half the peak at 4x warm-up
    ],
)
def test_noam_schedule(step, expected):
    assert noam_rate(step, 512, 4000) == pytest.approx(expected, rel=1e-12)
    assert noam_rate(4000, 512, 4000) == pytest.approx(6.98771e-4, rel=1e-5)


# --- an update does not depend on how its batch is split ------------------------------------


def _capture_gradients(trainer: Trainer) -> list[list[torch.Tensor]]:
    """Record the gradients the optimizer is about to apply, at every step."""
    seen: list[list[torch.Tensor]] = []
    # A pre-step hook, not a replaced optimizer.step: the scheduler wraps step and warns if it
    # is swapped out after the scheduler was built.
    trainer.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(
            [p.grad.clone() for p in trainer.model.parameters()]
        )
    )
    return seen


def test_gradient_accumulation_equals_one_big_batch(tiny_corpus, tmp_path):
    split = Trainer(
        config(tiny_corpus, tmp_path / "a", update_freq=2, model={**TINY, "P_drop": 0.0})
    )
    whole = Trainer(
        config(tiny_corpus, tmp_path / "b", update_freq=1, model={**TINY, "P_drop": 0.0})
    )
    b0, b1 = split.sampler.epoch_batches(0)[:2]
    assert len(b0) > 1 and len(b1) > 1
    # The gradient of the first update is that of the mean token loss of the whole batch.
    from aiayn.data import collate

    reference = Transformer(whole.model_cfg)
    reference.load_state_dict(whole.model.state_dict())
    batch = collate(whole.train_data, b0 + b1)
    mask = batch.tgt_out != 0
    loss, _ = label_smoothed_nll(reference(batch.src, batch.tgt_in, mask), batch.tgt_out[mask], 0.1)
    (loss / batch.n_tgt_tokens).backward()

    split_grads, whole_grads = _capture_gradients(split), _capture_gradients(whole)
    for _ in range(3):  # three updates: Adam's state must agree too
        split.train_update(iter([b0, b1]))
        whole.train_update(iter([b0 + b1]))
    for p, g in zip(reference.parameters(), whole_grads[0]):
        assert torch.allclose(p.grad, g, atol=1e-7, rtol=1e-5)
    for step in range(3):
        for g, h in zip(split_grads[step], whole_grads[step]):
            assert torch.allclose(g, h, atol=1e-7, rtol=1e-4)
    assert_same_weights(dict(split.model.state_dict()), dict(whole.model.state_dict()))
    # FLOPs are counted on real tokens: the split (two paddings instead of one) changes nothing.
    counted = 3 * training_flops(
        whole.model_cfg, real_lengths(batch.src, 0), real_lengths(batch.tgt_out, 0)
    )
    assert split.flops == whole.flops == counted


def assert_same_weights(a: dict, b: dict) -> None:
    """allclose on every weight but the key bias of self-attention.

    softmax(q (k_j + b)) = softmax(q k_j): the key bias's gradient is exactly zero in exact
    arithmetic, so in floats it is rounding noise, which Adam divides by its own magnitude
    and turns into steps of size lr with a random sign. Its value never changes an output.
    """
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if name.endswith("self_attn.W_QKV.bias"):
            d = x.numel() // 3  # [q | k | v] for d_k = d_v
            x, y = torch.cat([x[:d], x[2 * d :]]), torch.cat([y[:d], y[2 * d :]])
        elif name.endswith("src_attn.W_KV.bias"):
            x, y = x[x.numel() // 2 :], y[y.numel() // 2 :]
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize(
    "tokens, processes, freq",
    [(800, 1, 2), (800, 2, 1), (2400, 2, 3), (760, 1, 2), (420, 1, 1)],
)
def test_tokens_per_update_gives_micro_batches_per_process(tokens, processes, freq):
    cfg = TrainConfig(max_tgt_tokens=400, tokens_per_update=tokens, preset="tiny")
    assert trainer_module.distributed.update_freq(cfg, processes) == freq


@pytest.mark.parametrize("tokens, processes", [(1000, 1), (1200, 2), (350, 1)])
def test_tokens_per_update_refuses_what_whole_micro_batches_miss(tokens, processes):
    cfg = TrainConfig(max_tgt_tokens=400, tokens_per_update=tokens, preset="tiny")
    with pytest.raises(UserError, match=f"tokens_per_update={tokens} is not near a whole"):
        trainer_module.distributed.update_freq(cfg, processes)


# --- exact resume after SIGKILL --------------------------------------------------------------


def _train_cmd(cfg_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", "train", str(cfg_path), "--device", "cpu", *extra]


def _write(cfg: TrainConfig, path: Path) -> Path:
    import dataclasses

    path.write_text(json.dumps(dataclasses.asdict(cfg)))
    return path


@pytest.mark.slow  # several processes, or one killed and resumed: 10-25 s each
@pytest.mark.parametrize(
    "amp, compile, answer",
    [
        ("none", False, "emulated"),
        ("bf16", False, "emulated"),
        ("bf16", False, "native"),  # the attention the shipped figure chooses (resolve_attention)
        pytest.param("none", True, "emulated", marks=COMPILED),
        pytest.param("bf16", True, "emulated", marks=COMPILED),
    ],
)
def test_resume_after_sigkill_is_exact(tiny_corpus, tmp_path, monkeypatch, amp, compile, answer):
    monkeypatch.setenv(hardware.ASSUME_BF16, answer)  # the subprocesses' CPU
    n = 3  # dropout on (the tiny preset's 0.1): its masks resume exactly, compiled too
    ema = {"ema_decay": 0.9, "amp": amp, "compile": compile}  # the moving average as well
    straight = _write(
        config(tiny_corpus, tmp_path / "straight", max_updates=2 * n, **ema), tmp_path / "a.json"
    )
    subprocess.run(_train_cmd(straight), check=True, capture_output=True)
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["attention"] == resolve_attention(amp, torch.device("cpu"))  # the path tested

    # The same run, saving every n updates, killed (no clean-up at all) once update n is saved.
    killed_cfg = config(
        tiny_corpus, tmp_path / "killed", max_updates=10_000, save_every_updates=n, **ema
    )
    proc = subprocess.Popen(
        _train_cmd(_write(killed_cfg, tmp_path / "b.json")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first = tmp_path / "killed" / "checkpoints" / f"update_{n:07d}"
    deadline = time.monotonic() + 120
    while not (first / "meta.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "training died before update n"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    resumed = _write(
        config(tiny_corpus, tmp_path / "killed", max_updates=2 * n, **ema), tmp_path / "c.json"
    )
    subprocess.run(_train_cmd(resumed, "--resume", str(first)), check=True, capture_output=True)

    for weights in ("model.safetensors", "ema/model.safetensors"):
        a = load_file(str(tmp_path / "straight/checkpoints" / checkpoint_name(2 * n) / weights))
        b = load_file(str(tmp_path / "killed/checkpoints" / checkpoint_name(2 * n) / weights))
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), (weights, name)


# --- pre-emption: SIGTERM and Ctrl-C save at the next update, and the run resumes exactly ------


def _signal_once_logged(proc: subprocess.Popen, log: Path, sig: int) -> None:
    """Send ``sig`` to ``proc`` as soon as its log.jsonl records a first update."""
    deadline = time.monotonic() + 120
    while not (log.is_file() and '"loss"' in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, "training died early"
        time.sleep(0.01)
    proc.send_signal(sig)


_STOPPED = re.compile(
    r"aiayn train: stopped by (\w+) at update (\d+), checkpoint (\S+); resume: (.+)"
)


@pytest.mark.slow  # several processes, or one killed and resumed: 10-25 s each
def test_sigterm_saves_at_the_next_update_and_the_resumed_run_is_exact(tiny_corpus, tmp_path):
    ema = {"ema_decay": 0.9}  # the moving average resumes exactly too
    cfg = config(tiny_corpus, tmp_path / "stopped", max_updates=10_000, **ema)
    proc = subprocess.Popen(
        _train_cmd(_write(cfg, tmp_path / "b.json")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _signal_once_logged(proc, tmp_path / "stopped" / "log.jsonl", signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    # one line, no traceback, no summary; a shell's status for SIGTERM
    assert proc.returncode == 143 and out == "" and "Traceback" not in err, err
    said = _STOPPED.fullmatch(err.splitlines()[-1])
    assert said and said[1] == "SIGTERM", err
    k = int(said[2])
    assert said[3] == str((tmp_path / "stopped/checkpoints" / checkpoint_name(k)).resolve())
    assert json.loads((Path(said[3]) / "meta.json").read_text())["update"] == k
    summary = json.loads((tmp_path / "stopped/summary.json").read_text())
    assert (summary["stopped"], summary["updates"]) == ("SIGTERM", k)

    # the command it printed resumes the run (here for 3 more updates) ...
    resume = shlex.split(said[4])
    assert resume[:3] == ["aiayn", "train", str(tmp_path / "b.json")] and "--resume" not in resume
    # ... to the weights of a run never interrupted (run side by side), bit for bit
    straight = config(tiny_corpus, tmp_path / "straight", max_updates=k + 3, **ema)
    uninterrupted = subprocess.Popen(
        _train_cmd(_write(straight, tmp_path / "a.json")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    more = ["--set", f"max_updates={k + 3}"]
    subprocess.run([sys.executable, "-m", *resume, *more], check=True, capture_output=True)
    assert uninterrupted.wait(timeout=300) == 0
    for weights in ("model.safetensors", "ema/model.safetensors"):
        a = load_file(str(tmp_path / "straight/checkpoints" / checkpoint_name(k + 3) / weights))
        b = load_file(str(tmp_path / "stopped/checkpoints" / checkpoint_name(k + 3) / weights))
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), (weights, name)


def test_ctrl_c_saves_unvalidated_and_a_second_one_does_not_cut_the_save_short(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    cfg = config(tiny_corpus, out, max_updates=50, validate=True, save_every_updates=2)
    cfg_path = _write(cfg, tmp_path / "c.json")
    update, save = Trainer.train_update, Trainer.save

    def ctrl_c_in_update_3(self, batches):
        if self.update == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return update(self, batches)

    def ctrl_c_again_while_saving(self, validate=True):
        if self.stop_signal:
            os.kill(os.getpid(), signal.SIGINT)
        return save(self, validate)

    monkeypatch.setattr(Trainer, "train_update", ctrl_c_in_update_3)
    monkeypatch.setattr(Trainer, "save", ctrl_c_again_while_saving)
    before = signal.getsignal(signal.SIGINT)
    code, stdout, err = run_cli(capsys, "train", cfg_path, "--device", "cpu")
    assert code == 130 and stdout == "" and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("aiayn")] == [
        f"aiayn train: stopped by SIGINT at update 3, checkpoint "
        f"{(out / 'checkpoints' / checkpoint_name(3)).resolve()}; resume: "
        f"aiayn train {cfg_path} --device cpu"
    ]
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C is the caller's again
    # the checkpoint is whole, and not validated: best, and patience's count, as they were
    ckpts = out / "checkpoints"
    assert latest_checkpoint(ckpts).name == checkpoint_name(3)
    assert best_checkpoint(ckpts).name == checkpoint_name(2)
    meta = json.loads((ckpts / checkpoint_name(3) / "meta.json").read_text())
    assert meta["valid"] == {} and meta["best"]["stale"] == 0
    load_transformer(ckpts / checkpoint_name(3))
    assert (
        "valid_ppl" in json.loads((ckpts / checkpoint_name(2) / "meta.json").read_text())["valid"]
    )


def test_a_stop_signal_before_the_first_update_saves_nothing(tiny_corpus, tmp_path):
    trainer = Trainer(config(tiny_corpus, tmp_path / "run"))
    trainer.request_stop(signal.SIGTERM)
    summary = trainer.run()
    assert (summary["updates"], summary["stopped"], summary["checkpoint"]) == (0, "SIGTERM", None)
    assert trainer.preempted and not (tmp_path / "run" / "checkpoints").exists()


_ONE_RANK_SIGNALLED = """
import json, os, signal, sys
from pathlib import Path
from aiayn.cli.main import main
from aiayn.train.trainer import Trainer

update, run = Trainer.train_update, Trainer.run

def signal_rank_1(self, batches):  # rank 1 alone is told to stop, during update 2
    if self.dist.rank == 1 and self.update == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return update(self, batches)

def run_and_say(self, resume="auto"):
    try:
        return run(self, resume)
    finally:
        done = {"update": self.update, "stopped": self.stopped}
        Path(sys.argv[2], f"rank{self.dist.rank}.json").write_text(json.dumps(done))

Trainer.train_update, Trainer.run = signal_rank_1, run_and_say
try:
    main(["train", sys.argv[1], "--device", "cpu"])
except SystemExit as e:
    rank = os.environ["RANK"]
    Path(sys.argv[2], f"code{rank}").write_text(str(e.code))
"""


def _torchrun_two(script: Path, cfg, tmp_path: Path) -> subprocess.CompletedProcess:
    """``script CONFIG TMP`` under torchrun with 2 CPU processes of one thread each; it must
    exit 0 (each rank writes what it saw under TMP)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = subprocess.run(
        [*cmd, str(script), str(_write(cfg, tmp_path / "c.json")), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow  # several processes, or one killed and resumed: 10-25 s each
def test_under_torchrun_every_rank_stops_at_the_update_one_rank_was_signalled(
    tiny_corpus, tmp_path
):
    cfg = config(tiny_corpus, tmp_path / "run", max_updates=50, model={**TINY, "P_drop": 0.0})
    script = tmp_path / "signalled.py"
    script.write_text(_ONE_RANK_SIGNALLED)
    result = _torchrun_two(script, cfg, tmp_path)
    for rank in (0, 1):
        done = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert done == {"update": 2, "stopped": "SIGTERM"}, rank
        assert (tmp_path / f"code{rank}").read_text() == "143"
    ckpts = tmp_path / "run" / "checkpoints"
    assert [p.name for p in list_checkpoints(ckpts)] == [checkpoint_name(2)]
    said = [line for line in result.stderr.splitlines() if line.startswith("aiayn train:")]
    assert len(said) == 1 and said[0].endswith(
        f"resume: torchrun --nproc_per_node 2 -m aiayn train {tmp_path / 'c.json'} --device cpu"
    ), result.stderr[-3000:]


@pytest.mark.parametrize("init", ["fairseq", "xavier"])
def test_a_new_run_starts_from_the_configured_init(tiny_corpus, tmp_path, init):
    trainer = Trainer(config(tiny_corpus, tmp_path / init, init=init), device="cpu")
    bias = trainer.model.encoder[0].feed_forward.W_2.bias
    assert (torch.count_nonzero(bias) > 0) == (init == "fairseq")  # xavier's biases are 0


def test_resume_refuses_another_vocabulary(tiny_corpus, tmp_path):
    cfg = config(tiny_corpus, tmp_path / "run", max_updates=1)
    Trainer(cfg).run()
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["vocab_fingerprint"] = "0" * 64
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="different vocabulary"):
        Trainer(cfg).run(resume=ckpt)


# --- one run per OUT: a lock the kernel releases when its holder dies -----------------------


def _files(root: Path) -> dict[str, bytes]:
    """Every file's bytes; only the names under tensorboard/ (its writer thread appends)."""
    files = (p.relative_to(root) for p in sorted(root.rglob("*")) if p.is_file())
    return {str(p): b"" if p.parts[0] == "tensorboard" else (root / p).read_bytes() for p in files}


def test_a_second_run_on_a_running_out_fails_naming_the_holder(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    cfg = config(tiny_corpus, tmp_path / "run", max_updates=3, save_every_updates=1)
    cfg_path = _write(config(tiny_corpus, tmp_path / "run", seed=7), tmp_path / "second.json")
    real, seen = Trainer.train_update, {}

    def update_then_intrude(self, batches):
        if self.update == 2 and not seen:  # mid-run, two checkpoints and a log on disk
            seen["before"] = before = _files(tmp_path / "run")
            capsys.readouterr()  # the first run's progress bar
            seen["cli"] = run_cli(capsys, "train", cfg_path, "--device", "cpu")
            seen["untouched"] = _files(tmp_path / "run") == before
        return real(self, batches)

    monkeypatch.setattr(Trainer, "train_update", update_then_intrude)
    assert Trainer(cfg).run()["updates"] == 3  # the first run finishes undisturbed
    code, _, err = seen["cli"]
    assert code == 2
    one_line_error(err, str(tmp_path / "run"), f"pid {os.getpid()}")
    assert seen["untouched"]
    assert json.loads((tmp_path / "run/config.json").read_text())["seed"] == cfg.seed


_HOLD_LOCK = """
import sys, time
from aiayn.files import exclusive_lock
with exclusive_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_lock_left_by_a_killed_run_does_not_block(tiny_corpus, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(out / ".lock")], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline() == "locked\n"
    cfg = config(tiny_corpus, out, max_updates=1)
    with pytest.raises(UserError, match=f"pid {holder.pid}"):
        Trainer(cfg).run()
    assert not (out / "checkpoints").exists() and not (out / "config.json").exists()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert Trainer(cfg).run()["updates"] == 1


def test_a_run_removes_checkpoints_half_written_by_killed_runs(tiny_corpus, tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    dead = [dead_leftover(ckpts / f"update_{n:07d}") for n in (1, 9)]
    running = temp_dir_beside(ckpts / "update_0000009")  # a live process's, kept
    Trainer(config(tiny_corpus, tmp_path / "run", max_updates=1)).run()
    hidden = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("."))
    assert hidden == [running.name] and not any(p.exists() for p in dead)


# --- data parallel with torchrun (gloo) equals one process on the same global batches --------


@pytest.mark.slow  # several processes, or one killed and resumed: 10-25 s each
@pytest.mark.parametrize(
    "amp, compile", [("none", False), ("bf16", False), pytest.param("none", True, marks=COMPILED)]
)
def test_ddp_two_processes_equal_one_process(tiny_corpus, tmp_path, amp, compile):
    # tokens_per_update: 2 micro-batches of 400 target tokens on one process, 1 on each of two;
    # bf16: the weights' copies (train/mixed.py) under DDP's gradient hooks
    common = dict(
        model={**TINY, "P_drop": 0.0},
        max_updates=3,
        tokens_per_update=800,
        compile=compile,
        amp=amp,
    )
    single = Trainer(config(tiny_corpus, tmp_path / "single", **common))
    assert single.update_freq == 2
    single.run(resume=None)
    ddp_cfg = _write(config(tiny_corpus, tmp_path / "ddp", **common), tmp_path / "ddp.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29533",
        "-m",
        "aiayn",
        "train",
        str(ddp_cfg),
        "--device",
        "cpu",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    a = load_file(str(tmp_path / "single/checkpoints/update_0000003/model.safetensors"))
    b = load_file(str(tmp_path / "ddp/checkpoints/update_0000003/model.safetensors"))
    assert_same_weights(a, b)
    meta = json.loads((tmp_path / "ddp/checkpoints/update_0000003/meta.json").read_text())
    assert (meta["world_size"], meta["update_freq"]) == (2, 1)
    rng = torch.load(tmp_path / "ddp/checkpoints/update_0000003/trainer.pt")["rng"]
    assert len(rng) == 2 and not torch.equal(rng[0]["cpu"], rng[1]["cpu"])  # each rank's own
    assert (
        meta["tokens"]
        == json.loads((tmp_path / "single/checkpoints/update_0000003/meta.json").read_text())[
            "tokens"
        ]
    )


# Each rank saves its RNG states and restores its own; CUDA's generator is stood in for by a
# torch.Generator, so that the CUDA branch of the same functions runs on a CPU.
_RNG_ROUND_TRIP = """
import sys
from pathlib import Path
import torch
from aiayn.checkpoint import load_trainer_state
from aiayn.train import distributed

out = Path(sys.argv[1])
d = distributed.setup("cpu")
fake = torch.Generator()
torch.cuda.get_rng_state = lambda device="cuda": fake.get_state()
torch.cuda.set_rng_state = lambda state, device="cuda": fake.set_state(state)
d = distributed.Distributed(d.rank, d.world_size, torch.device("cuda", 0))
torch.manual_seed(100 + d.rank)
fake.manual_seed(200 + d.rank)
states = distributed.rng_states(d)
expected = torch.stack([torch.rand(4), torch.rand(4, generator=fake)])
if d.is_main:
    torch.save({"rng": states}, out / "trainer.pt")
torch.distributed.barrier()
torch.manual_seed(0)
fake.manual_seed(0)
distributed.set_rng_states(load_trainer_state(out)["rng"], d)
got = torch.stack([torch.rand(4), torch.rand(4, generator=fake)])
torch.save({"expected": expected, "got": got}, out / f"rank{d.rank}.pt")
distributed.teardown()
"""


@pytest.mark.slow  # several processes, or one killed and resumed: 10-25 s each
def test_each_rank_restores_its_own_cpu_and_cuda_rng(tmp_path):
    script = tmp_path / "round_trip.py"
    script.write_text(_RNG_ROUND_TRIP)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*cmd, str(script), str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(tmp_path / "trainer.pt", weights_only=True)["rng"]
    assert [sorted(state) for state in saved] == [["cpu", "cuda"], ["cpu", "cuda"]]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for rank in ranks:
        assert torch.equal(rank["got"], rank["expected"])  # CPU draws, then CUDA draws
    for kind in (0, 1):  # independent dropout masks per rank, on both generators
        assert not torch.equal(ranks[0]["expected"][kind], ranks[1]["expected"][kind])


# --- non-finite losses ----------------------------------------------------------------------


def test_non_finite_losses_skip_then_abort(tiny_corpus, tmp_path, monkeypatch):
    real = trainer_module.label_smoothed_nll
    calls = {"n": 0}

    def flaky(logits, target, eps):
        loss, nll = real(logits, target, eps)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] >= 3 else loss), nll

    monkeypatch.setattr(trainer_module, "label_smoothed_nll", flaky)
    trainer = Trainer(config(tiny_corpus, tmp_path / "run", max_nonfinite=3, max_updates=50))
    with (
        pytest.warns(UserWarning, match="non-finite loss"),
        pytest.raises(NonFiniteLossError, match="3 non-finite"),
    ):
        trainer.run(resume=None)
    assert trainer.update == 2  # two good updates; the skipped ones did not count


# --- checkpoints ---------------------------------------------------------------------------


def test_average_is_the_mean_and_keeps_ties(tmp_path):
    cfg = ModelConfig.preset("tiny")
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        model = Transformer(cfg)
        models.append(model)
        meta = {"update": seed + 1, "model_config": __import__("dataclasses").asdict(cfg)}
        save_checkpoint(tmp_path / "ckpts", seed + 1, model, meta, None, None)
    out = average_checkpoints(list_checkpoints(tmp_path / "ckpts"), tmp_path / "avg")
    averaged, _ = load_transformer(out)
    for name, p in averaged.named_parameters():
        expected = sum(dict(m.named_parameters())[name] for m in models) / 3
        assert torch.allclose(p, expected, atol=1e-7), name
    assert averaged.generator.weight is averaged.src_embed.tokens.weight
    stored = load_file(str(out / "model.safetensors"))
    assert sum(t.shape == (cfg.vocab_size, cfg.d_model) for t in stored.values()) == 1  # tied, once


def test_keep_last_and_latest_ignore_partial_writes(tmp_path):
    model = Transformer(ModelConfig.preset("tiny"))
    for update in range(1, 5):
        save_checkpoint(
            tmp_path, update, model, {"update": update}, {"x": torch.ones(1)}, None, keep_last=2
        )
    (tmp_path / ".update_0000005.tmp").mkdir()  # a crash mid-write leaves only a temp dir
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_0000003", "update_0000004"]
    assert latest_checkpoint(tmp_path).name == "update_0000004"


def _flops_by_counting_ops(cfg: ModelConfig, batches: list) -> float:
    """Training FLOPs of ``batches`` counted from the matmuls that a forward and backward pass
    of each pair alone (no padding) runs, with torch's FlopCounterMode; attention's query-key
    products by hand, 2 (d_k + d_v) h FLOPs a pair forward and twice that backward (the counter
    does not see the CPU's fused attention kernel). aiayn.runtime.flops is not used."""
    model, total = Transformer(dataclasses.replace(cfg, P_drop=0.0)), 0.0
    per_pair = 3 * 2 * cfg.h * (cfg.resolved_d_k + cfg.resolved_d_v)
    for batch in batches:
        for src, tgt_in, tgt_out in zip(batch.src, batch.tgt_in, batch.tgt_out):
            s, t = int((src != 0).sum()), int((tgt_out != 0).sum())
            src, tgt_in, tgt_out = src[None, :s], tgt_in[None, :t], tgt_out[None, :t]
            with FlopCounterMode(display=False) as counter:
                logits = model(src, tgt_in, output_mask=tgt_out != 0)
                label_smoothed_nll(logits, tgt_out[0], 0.1)[0].backward()
            pairs = cfg.N_enc * s * s + cfg.N_dec * (t * t + t * s)
            total += counter.get_total_flops() + per_pair * pairs
    return total


def test_training_writes_logs_and_summary(tiny_corpus, tmp_path, monkeypatch):
    trained, collate = [], trainer_module.collate
    monkeypatch.setattr(
        trainer_module,
        "collate",
        lambda data, i: trained.append((data, collate(data, i))) or trained[-1][1],
    )
    trainer = Trainer(config(tiny_corpus, tmp_path / "run", max_updates=4, validate=True))
    start = time.monotonic()
    summary = trainer.run()
    wall = time.monotonic() - start
    assert summary["updates"] == 4 and summary["valid_ppl"] > 1
    # the FLOPs of the micro-batches it trained on (not validation's), counted another way
    batches = [batch for data, batch in trained if data is trainer.train_data]
    assert len(batches) == 4 * trainer.update_freq
    expected = _flops_by_counting_ops(trainer.model_cfg, batches)
    assert summary["counted_flops"] == pytest.approx(expected, rel=1e-9)
    # MFU: those FLOPs over what a peak does in the training time (validation and checkpoints
    # excluded, so less than the run's wall time); the trainer measures no peak itself
    assert 0 < summary["elapsed_s"] < wall and "mfu" not in summary
    cost = trainer.cost(peak=2e11)
    assert cost["mfu"] == pytest.approx(expected / (summary["elapsed_s"] * 2e11), rel=1e-9)
    assert cost["paper_cost_flops"] == pytest.approx(summary["elapsed_s"] * 2e11, rel=1e-9)
    records = [json.loads(line) for line in (tmp_path / "run/log.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records if "loss" in r] == [1, 2, 3, 4]
    assert records[-1]["valid_ppl"] == summary["valid_ppl"]
    # TensorBoard holds the logged numbers (float32), at their updates
    board = EventAccumulator(str(tmp_path / "run/tensorboard"))
    board.Reload()
    for tag in ("loss", "valid_ppl"):
        logged = [(r["update"], pytest.approx(r[tag], rel=1e-6)) for r in records if tag in r]
        assert logged and [(e.step, e.value) for e in board.Scalars(tag)] == logged, tag
    saved = json.loads((latest_checkpoint(tmp_path / "run/checkpoints") / "meta.json").read_text())
    assert saved["train_config"]["max_updates"] == 4 and saved["model_config"]["d_model"] == 32


def test_aiayn_train_reports_the_cost_against_the_peak_it_measures(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    import aiayn.runtime.flops

    asked = []
    monkeypatch.setattr(
        aiayn.runtime.flops, "measure_matmul_peak", lambda *args: asked.append(args) or 1e11
    )
    cfg_path = _write(config(tiny_corpus, tmp_path / "run", max_updates=2), tmp_path / "c.json")
    code, out, err = run_cli(capsys, "train", cfg_path, "--device", "cpu")
    assert code == 0, err
    printed = json.loads(out)
    assert asked == [(torch.device("cpu"), None)]  # fp32: the device's own peak, once
    assert printed["matmul_peak_flops"] == 1e11
    assert printed["mfu"] == pytest.approx(
        printed["counted_flops"] / (printed["elapsed_s"] * 1e11), rel=1e-9
    )
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved == {
        k: v
        for k, v in printed.items()
        if k not in ("matmul_peak_flops", "mfu", "paper_cost_flops")
    }


# --- validation BLEU -------------------------------------------------------------------------


def test_validation_bleu_is_what_evaluate_gives_the_checkpoint(tiny_corpus, tmp_path):
    n, beam = 8, 2
    cfg = config(
        tiny_corpus,
        tmp_path / "run",
        validate=True,
        valid_bleu_sentences=n,
        valid_beam=beam,
        valid_bleu_lang="es",
        max_updates=40,
    )
    summary = Trainer(cfg).run()
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    vocab = Vocab.load(ckpt / "spm.model")
    valid = TokenDataset(tiny_corpus, "valid")
    sources = [vocab.decode(valid.src(i)) for i in range(n)]
    references = [vocab.decode(valid.tgt(i)) for i in range(n)]
    # The text spells the very ids the trainer decoded from (so evaluate reads the same input).
    assert [vocab.encode_source(s) for s in sources] == [[*valid.src(i), 3] for i in range(n)]
    model, _ = load_transformer(ckpt)
    expected = evaluate_model(
        model,
        vocab,
        sources,
        references,
        SearchRequest(DecodeConfig.preset("translation", beam=beam)),
        lang="es",
    )
    recorded = json.loads((ckpt / "meta.json").read_text())["valid"]
    logged = json.loads((tmp_path / "run/log.jsonl").read_text().splitlines()[-1])
    for scores in (recorded, logged, summary):
        assert scores["valid_bleu"] == expected.sacrebleu > 0
        assert scores["valid_paper_bleu"] == expected.paper_bleu
        assert scores["valid_bleu_signature"] == expected.signature


def test_validation_bleu_is_deterministic_and_leaves_train_mode(tiny_corpus, tmp_path):
    trainer = Trainer(config(tiny_corpus, tmp_path, validate=True, valid_bleu_sentences=6))
    trainer.train_update(iter(trainer.sampler))
    trainer.model.train()
    first = trainer.validate()
    assert trainer.model.training
    assert trainer.validate() == first and "valid_bleu" in first


def test_the_training_plot_shows_the_logged_validation_bleu(tmp_path, monkeypatch):
    from aiayn.analysis import plots

    log = [
        {"update": 1, "elapsed_s": 30.0, "loss": 5.0},
        {"update": 1, "elapsed_s": 30.0, "valid_ppl": 90.0, "valid_bleu": 1.5},
        {"update": 2, "elapsed_s": 90.0, "valid_ppl": 60.0, "valid_bleu": 4.0},
    ]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    plots.plot_training(tmp_path / "log.jsonl", tmp_path / "training.png")
    (fig,) = figures
    assert len(fig.axes) == 3 and "BLEU" in fig.axes[2].get_title()
    x, y = fig.axes[2].lines[0].get_data()
    assert list(x) == [0.5, 1.5] and list(y) == [1.5, 4.0]


# --- the moving average of the weights -------------------------------------------------------


@pytest.mark.parametrize("warmup", [False, True])
def test_ema_is_the_moving_average_of_the_weights_after_each_update(tiny_corpus, tmp_path, warmup):
    decay = 0.75
    cfg = config(
        tiny_corpus,
        tmp_path / "run",
        max_updates=5,
        ema_decay=decay,
        ema_warmup=warmup,
        validate=True,
    )
    trainer = Trainer(cfg)
    seen = [dict((k, p.detach().clone()) for k, p in trainer.model.named_parameters())]
    trainer.optimizer.register_step_post_hook(
        lambda *_: seen.append({k: p.detach().clone() for k, p in trainer.model.named_parameters()})
    )
    trainer.run()
    assert len(seen) == 6  # the initial weights and those after each of the 5 updates
    expected = seen[0]
    for n, weights in enumerate(seen[1:], start=1):
        # warm-up: 2/11, 3/12, 4/13, 5/14, 6/15, all below 0.75, so the warm-up rules each one
        d = min(decay, (1 + n) / (10 + n)) if warmup else decay
        expected = {k: d * expected[k] + (1 - d) * weights[k] for k in expected}
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    ema, _ = load_transformer(ckpt / "ema")  # a checkpoint of its own: translate reads it
    for name, p in ema.named_parameters():
        assert torch.allclose(p, expected[name], rtol=0, atol=1e-6), name
    last = seen[-1]["src_embed.tokens.weight"]
    assert not torch.allclose(ema.src_embed.tokens.weight, last, atol=1e-4)  # not the last weights
    # Validation measures the averaged weights, not the last ones.
    recorded = json.loads((ckpt / "meta.json").read_text())["valid"]
    assert recorded["valid_ppl"] == trainer._valid_loss(ema)["valid_ppl"]
    assert recorded["valid_ppl"] != trainer._valid_loss(trainer.model)["valid_ppl"]


def test_average_ema_averages_the_moving_averages(tiny_corpus, tmp_path, capsys):
    cfg = config(tiny_corpus, tmp_path / "run", max_updates=2, save_every_updates=1, ema_decay=0.5)
    Trainer(cfg).run()
    ckpts = tmp_path / "run" / "checkpoints"
    code, out, _ = run_cli(
        capsys, "average", ckpts, "--last", "2", "--ema", "--out", tmp_path / "avg"
    )
    assert code == 0 and "update_0000001/ema .. update_0000002/ema" in out
    averaged, _ = load_transformer(tmp_path / "avg")
    ema = [load_transformer(ckpts / checkpoint_name(u) / "ema")[0] for u in (1, 2)]
    for name, p in averaged.named_parameters():
        mean = (dict(ema[0].named_parameters())[name] + dict(ema[1].named_parameters())[name]) / 2
        assert torch.allclose(p, mean, atol=1e-7), name
    code, _, err = run_cli(capsys, "average", ckpts, "--ema", "--out", tmp_path / "avg2")
    assert code == 0  # every checkpoint has one
    shutil.rmtree(ckpts / checkpoint_name(1) / "ema")
    code, _, err = run_cli(capsys, "average", ckpts, "--ema", "--out", tmp_path / "avg3")
    assert code == 2
    one_line_error(err, "update_0000001 holds no moving average", "ema_decay")


def test_a_moving_average_checkpoint_is_refused_for_resuming(tiny_corpus, tmp_path, capsys):
    cfg = config(tiny_corpus, tmp_path / "run", max_updates=1, ema_decay=0.5)
    Trainer(cfg).run()
    ema = latest_checkpoint(tmp_path / "run" / "checkpoints") / "ema"
    with pytest.raises(UserError, match="holds no trainer state"):
        Trainer(cfg).run(resume=ema)


# --- what a resumed run may change -------------------------------------------------------------


def test_resuming_refuses_keys_that_shape_the_updates_naming_them(tiny_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = config(tiny_corpus, out, max_updates=1, ema_decay=0.5)
    Trainer(cfg).run()
    saved = {p: (out / p).read_bytes() for p in ("config.json", "checkpoints/latest")}
    # the EMA run resumed without ema_decay used to drop the average and rewrite config.json
    for changed, needles in (
        ({"ema_decay": None}, ["ema_decay 0.5 -> None"]),
        ({"seed": 2, "warmup": 20, "max_updates": 2}, ["seed 1 -> 2", "warmup 10 -> 20"]),
    ):
        again = config(tiny_corpus, out, **{"max_updates": 1, "ema_decay": 0.5, **changed})
        with pytest.raises(UserError, match="resuming would change what the run was trained") as e:
            Trainer(again).run()
        assert all(n in str(e.value) for n in needles) and "max_updates" not in str(e.value)
        assert {p: (out / p).read_bytes() for p in saved} == saved
    assert list_checkpoints(out / "checkpoints")[-1].name == checkpoint_name(1)


def test_resuming_applies_the_keys_that_may_change_and_says_so(tiny_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    Trainer(config(tiny_corpus, out, max_updates=1, ema_decay=0.5, amp="auto")).run()
    capsys.readouterr()
    more = config(tiny_corpus, out, max_updates=2, ema_decay=0.5, amp="none", log_every=5)
    summary = Trainer(more).run()
    lines = [line for line in capsys.readouterr().err.splitlines() if "resuming" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"train: resuming {out} from update 1 (")
    for change in ("max_updates 1 -> 2", "amp 'auto' -> 'none'", "log_every 1 -> 5"):
        assert change in lines[0]
    assert summary["updates"] == 2
    written = json.loads((out / "config.json").read_text())
    assert (written["max_updates"], written["amp"], written["ema_decay"]) == (2, "none", 0.5)
    assert (latest_checkpoint(out / "checkpoints") / "ema" / "model.safetensors").is_file()
    capsys.readouterr()
    Trainer(more).run()  # nothing changed: only where it resumes from
    lines = [line for line in capsys.readouterr().err.splitlines() if "resuming" in line]
    checkpoint = latest_checkpoint(out / "checkpoints")
    assert lines == [f"train: resuming {out} from update 2 ({checkpoint})"]


def test_resuming_into_another_model_names_only_the_keys_that_differ(tiny_corpus, tmp_path):
    out = tmp_path / "run"
    Trainer(config(tiny_corpus, out, max_updates=1)).run()
    again = config(tiny_corpus, out, max_updates=2, model={**TINY, "d_ff": 128, "P_drop": 0.2})
    with pytest.raises(UserError) as e:
        Trainer(again).run()
    message = str(e.value)
    assert "\n" not in message and "resuming would change the model" in message
    assert "P_drop 0.1 -> 0.2, d_ff 64 -> 128;" in message
    assert "d_model" not in message and "vocab_size" not in message  # unchanged: not named


# --- validation BLEU's language: the dataset's, never a default ---------------------------------


def test_validation_bleu_takes_the_target_language_the_dataset_records(tiny_corpus, tmp_path):
    trainer = Trainer(config(tiny_corpus, tmp_path / "a", validate=True, valid_bleu_sentences=2))
    assert trainer.bleu_lang == "es"  # the bundled slice is English -> Spanish
    with pytest.raises(UserError, match="valid_bleu_lang=de, but .*meta.json records .* es"):
        Trainer(
            config(
                tiny_corpus,
                tmp_path / "b",
                validate=True,
                valid_bleu_sentences=2,
                valid_bleu_lang="de",
            )
        )


def test_prepare_bundled_records_the_languages_validation_bleu_takes(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    import aiayn.data

    root = tiny_corpus.parent  # the slice's text: the bundled corpus, shorter
    slice_paths = {s: (root / f"{s}.en", root / f"{s}.es") for s in ("train", "valid", "test")}
    monkeypatch.setattr(aiayn.data, "bundled_corpus_paths", lambda: slice_paths)
    options = ["--out", tmp_path / "data", "--vocab-size", "300", "--max-len", "48"]
    code, _, err = run_cli(capsys, "prepare", "--bundled", *options)
    assert code == 0, err
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert meta["record"] == {"src_lang": "en", "tgt_lang": "es"}
    cfg = config(tmp_path / "data", tmp_path / "run", validate=True, valid_bleu_sentences=2)
    assert Trainer(cfg).bleu_lang == "es"


def test_validation_bleu_without_a_recorded_language_asks_for_valid_bleu_lang(
    tiny_corpus, tmp_path, capsys
):
    text, vocab = _other_text(tmp_path, suffixes=("src", "tgt")), tiny_corpus / "spm.model"
    data = _prepare(capsys, text, tmp_path / "data", "--vocab", vocab)  # no language named
    assert "record" not in json.loads((data / "meta.json").read_text())
    cfg = config(data, tmp_path / "run", validate=True, valid_bleu_sentences=2)
    with pytest.raises(UserError, match=r"meta.json records no language: set valid_bleu_lang"):
        Trainer(cfg)
    given = config(
        data, tmp_path / "run", validate=True, valid_bleu_sentences=2, valid_bleu_lang="fr"
    )
    assert Trainer(given).bleu_lang == "fr"
    assert Trainer(config(data, tmp_path / "run", validate=True)).bleu_sample is None  # no BLEU


def test_the_demo_recipe_validates_a_german_dataset_with_german_tokenisation(
    tiny_corpus, tmp_path, capsys
):
    # the text is the bundled Spanish; what matters is the language the files say
    text, vocab = _other_text(tmp_path, suffixes=("en", "de")), tiny_corpus / "spm.model"
    data = _prepare(capsys, text, tmp_path / "de", "--vocab", vocab)
    assert json.loads((data / "meta.json").read_text())["record"]["tgt_lang"] == "de"
    assert load_train_config("demo", [f"data={data}"]).valid_bleu_lang == "de"
    given = load_train_config("demo", [f"data={data}", "valid_bleu_lang=fr"])
    assert given.valid_bleu_lang == "fr"  # the user's, not the recipe's: the trainer checks it


def test_the_demo_recipe_refuses_a_dataset_that_records_no_language(tiny_corpus, tmp_path, capsys):
    text, vocab = _other_text(tmp_path, suffixes=("src", "tgt")), tiny_corpus / "spm.model"
    data = _prepare(capsys, text, tmp_path / "own", "--vocab", vocab)
    run = tmp_path / "run"
    sets = [f"data={data}", f"out={run}", "max_updates=1", "preset=tiny"]
    sets += [f"model.{k}={v}" for k, v in TINY.items()]
    code, _, err = run_cli(capsys, "train", "demo", *(a for s in sets for a in ("--set", s)))
    assert code == 2
    one_line_error(err, "valid_bleu_lang=es is the demo recipe's", "records no language")
    assert not run.exists()
    user = load_train_config("demo", [f"data={data}", "valid_bleu_lang=de"])
    assert user.valid_bleu_lang == "de"  # said by the user: taken


def test_resuming_a_fine_tuned_run_without_init_from_keeps_its_own(tiny_run, tiny_corpus, tmp_path):
    source = latest_checkpoint(tiny_run / "checkpoints")
    out = tmp_path / "ft"
    Trainer(config(tiny_corpus, out, init_from=str(source), max_updates=1)).run()
    Trainer(config(tiny_corpus, out, max_updates=2)).run()  # --init-from left out: resumes
    assert json.loads((out / "config.json").read_text())["init_from"] == str(source)
    with pytest.raises(UserError, match=r"init_from .* -> '/elsewhere'"):
        Trainer(config(tiny_corpus, out, init_from="/elsewhere", max_updates=3)).run()


# --- the best checkpoint and early stopping --------------------------------------------------


def script_validation(monkeypatch, metric: str, values: list[float]) -> None:
    """Trainer.validate reports ``values[update - 1]`` as ``metric``."""
    monkeypatch.setattr(Trainer, "validate", lambda self: {metric: values[self.update - 1]})


def _logged(out: Path, metric: str) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["update"]: r[metric] for r in records if metric in r}


@pytest.mark.parametrize(
    "metric, values, best",
    [
        ("valid_ppl", [5.0, 3.0, 4.0, 6.0, 3.5, 7.0], 2),
        ("valid_bleu", [1.0, 4.0, 9.0, 2.0, 8.0, 3.0], 3),
    ],
)
def test_best_names_the_best_logged_validation_and_survives_pruning(
    tiny_corpus, tmp_path, monkeypatch, metric, values, best
):
    script_validation(monkeypatch, metric, values)
    cfg = config(
        tiny_corpus,
        tmp_path / "run",
        validate=True,
        save_every_updates=1,
        keep_last=2,
        best_metric=metric,
        **({"valid_bleu_sentences": 4} if metric == "valid_bleu" else {}),
    )
    summary = Trainer(cfg).run()
    logged = _logged(tmp_path / "run", metric)
    assert list(logged.values()) == values
    pick = min if metric == "valid_ppl" else max
    assert pick(logged, key=logged.__getitem__) == best
    ckpts = tmp_path / "run" / "checkpoints"
    assert best_checkpoint(ckpts).name == checkpoint_name(best)
    assert [p.name for p in list_checkpoints(ckpts)] == [checkpoint_name(u) for u in (best, 5, 6)]
    assert summary["best"]["update"] == best and summary["best"]["value"] == values[best - 1]
    assert summary["best"]["checkpoint"] == str((ckpts / checkpoint_name(best)).resolve())


def test_average_best_takes_the_k_best_by_the_runs_metric(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    script_validation(monkeypatch, "valid_ppl", [5.0, 3.0, 4.0, 6.0, 3.5, 7.0])
    cfg = config(tiny_corpus, tmp_path / "run", validate=True, save_every_updates=1, keep_last=3)
    Trainer(cfg).run()
    ckpts = tmp_path / "run" / "checkpoints"
    code, out, _ = run_cli(capsys, "average", ckpts, "--best", "2", "--out", tmp_path / "avg")
    assert code == 0 and "update_0000002, update_0000005" in out
    meta = json.loads((tmp_path / "avg" / "meta.json").read_text())
    assert meta["averaged_from"] == ["update_0000002", "update_0000005"]


def test_average_best_needs_a_recorded_validation(tiny_run, tmp_path, capsys):
    code, _, err = run_cli(
        capsys, "average", tiny_run / "checkpoints", "--best", "2", "--out", tmp_path / "avg"
    )
    assert code == 2
    one_line_error(err, "records a validation valid_ppl", "use --last")


def test_patience_stops_after_that_many_validations_without_a_better_one(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    script_validation(monkeypatch, "valid_ppl", [5.0, 4.0, 4.5, 4.2, 6.0, 3.0, 2.0, 1.0])
    cfg = config(
        tiny_corpus,
        tmp_path / "run",
        validate=True,
        save_every_updates=1,
        patience=3,
        max_updates=8,
    )
    summary = Trainer(cfg).run()
    assert (summary["updates"], summary["stopped"]) == (5, "patience")
    assert "stopped: no better valid_ppl in 3 validations" in capsys.readouterr().err  # the bar
    assert best_checkpoint(tmp_path / "run" / "checkpoints").name == checkpoint_name(2)
    assert Trainer(config(tiny_corpus, tmp_path / "b", max_updates=2)).run()["stopped"] == (
        "max_updates"
    )


_PATIENCE = """
import json, sys
from pathlib import Path
from aiayn.train import TrainConfig, distributed
from aiayn.train.trainer import Trainer

values = [5.0, 4.0, 4.5, 4.2, 6.0, 3.0, 2.0, 1.0]
Trainer.validate = lambda self: {"valid_ppl": values[self.update - 1]}  # called on rank 0 only
trainer = Trainer(TrainConfig(**json.loads(Path(sys.argv[1]).read_text())), device="cpu")
trainer.run(resume=None)
done = {"update": trainer.update, "stopped": trainer.stopped}
Path(sys.argv[2], f"rank{trainer.dist.rank}.json").write_text(json.dumps(done))
distributed.teardown()
"""


@pytest.mark.slow  # several processes, or one killed and resumed: 10-25 s each
def test_patience_stops_every_process_on_the_same_update(tiny_corpus, tmp_path):
    cfg = config(
        tiny_corpus,
        tmp_path / "run",
        validate=True,
        save_every_updates=1,
        patience=3,
        max_updates=8,
    )
    script = tmp_path / "patience.py"
    script.write_text(_PATIENCE)
    _torchrun_two(script, cfg, tmp_path)
    for rank in (0, 1):
        done = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert done == {"update": 5, "stopped": "patience"}, rank


# --- fine-tuning: a new run from another run's checkpoint ------------------------------------


def _other_text(
    tmp_path: Path, start: int = 3000, n: int = 60, suffixes: tuple[str, str] = ("en", "es")
) -> tuple[Path, Path]:
    """``n`` pairs of the bundled corpus that the tiny runs never saw, in files named
    ``other.SUFFIX`` (prepare reads a language from a suffix like ``en``)."""
    from aiayn.data import bundled_corpus_paths
    from aiayn.files import iter_lines

    paths = []
    for side, path in zip(suffixes, bundled_corpus_paths()["train"]):
        lines = [line for i, line in enumerate(iter_lines(path)) if start <= i < start + n]
        paths.append(tmp_path / f"other.{side}")
        paths[-1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths[0], paths[1]


def _prepare(capsys, text: tuple[Path, Path], out: Path, *options: str) -> Path:
    src, tgt = text
    # valid is train here (a perplexity to compare, not a score): kept although they overlap
    splits = ["--train-src", src, "--train-tgt", tgt, "--valid-src", src, "--valid-tgt", tgt]
    options = ("--keep-overlap", *options)
    code, _, err = run_cli(capsys, "prepare", *splits, "--out", out, "--max-len", "48", *options)
    assert code == 0, err
    return out


def _all_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_fine_tuning_lowers_the_perplexity_on_the_new_text_and_leaves_the_source_alone(
    tiny_run, tmp_path, capsys
):
    source_run = Path(shutil.copytree(tiny_run, tmp_path / "source"))
    before_bytes = _all_bytes(source_run)
    source = latest_checkpoint(source_run / "checkpoints")
    data = _prepare(
        capsys, _other_text(tmp_path), tmp_path / "new", "--vocab", source / "spm.model"
    )
    cfg = config(data, tmp_path / "ft", init_from=str(source), validate=True, max_updates=15)
    trainer = Trainer(cfg)
    trainer.init_from(source)
    before = trainer.validate()["valid_ppl"]
    summary = trainer.run()
    assert summary["valid_ppl"] < 0.8 * before
    assert _all_bytes(source_run) == before_bytes
    # A new run, not a resumed one: its own update count, written under its own out.
    assert summary["updates"] == 15 and summary["checkpoint"].startswith(str(tmp_path / "ft"))


@pytest.mark.parametrize(
    "keep, adam_step, schedule_step",
    [("", 2, 2), ("optimizer", 5, 2), ("schedule", 2, 5), ("optimizer,schedule", 5, 5)],
)
def test_init_from_keep_carries_the_optimizer_and_the_schedule(
    tiny_run, tiny_corpus, tmp_path, keep, adam_step, schedule_step
):
    source = latest_checkpoint(tiny_run / "checkpoints")  # 3 updates
    cfg = config(
        tiny_corpus, tmp_path / "ft", init_from=str(source), init_from_keep=keep, max_updates=2
    )
    trainer = Trainer(cfg)
    rates = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, *_: rates.append(opt.param_groups[0]["lr"])
    )
    trainer.run()
    state = torch.load(latest_checkpoint(tmp_path / "ft/checkpoints") / "trainer.pt")
    steps = {float(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {adam_step} and state["scheduler"]["last_epoch"] == schedule_step
    # The rate of the first update is the schedule's, not the one a carried optimizer held.
    assert rates[0] == noam_rate(schedule_step - 1, 32, cfg.warmup)


@pytest.mark.parametrize(
    "change, message",
    [
        ("vocabulary", "has another vocabulary than"),
        ("model", "says otherwise (d_ff: 64 there, 128 here)"),
        ("inside out", "is inside out="),
    ],
)
def test_init_from_refuses_what_cannot_be_fine_tuned(tiny_run, tmp_path, capsys, change, message):
    run = Path(shutil.copytree(tiny_run, tmp_path / "source"))
    source = latest_checkpoint(run / "checkpoints")
    text = _other_text(tmp_path)
    if change == "vocabulary":
        data = _prepare(capsys, text, tmp_path / "new", "--vocab-size", "120")
    else:
        data = _prepare(capsys, text, tmp_path / "new", "--vocab", source / "spm.model")
    model = {**TINY, "d_ff": 128} if change == "model" else TINY
    out = run if change == "inside out" else tmp_path / "ft"
    cfg = _write(config(data, out, model=model, max_updates=1), tmp_path / "c.json")
    before = _all_bytes(run / "checkpoints")
    code, _, err = run_cli(capsys, "train", cfg, "--device", "cpu", "--init-from", source)
    assert code == 2
    one_line_error(err, message)
    assert not (tmp_path / "ft" / "checkpoints").exists()
    assert _all_bytes(run / "checkpoints") == before


# --- configuration --------------------------------------------------------------------------


def test_config_rejects_unknown_and_mistyped_keys(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: tiny\nwarmpu: 10\n")
    with pytest.raises(ValueError, match="unknown key.*warmpu"):
        load_train_config(bad)
    bad.write_text("preset: tiny\nwarmup: ten\n")
    with pytest.raises(ValueError, match="warmup: expected int"):
        load_train_config(bad)
    bad.write_text("preset: tiny\nmodel: {d_modle: 8}\n")
    with pytest.raises(ValueError, match="d_modle"):
        load_train_config(bad)


def test_config_layers_preset_file_and_sets(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('preset = "D-ls0.2"\nwarmup = 100\n')
    cfg = load_train_config(path, ["lr_scale=2", "model.d_ff=1024"])
    assert (cfg.eps_ls, cfg.warmup, cfg.lr_scale) == (
        0.2,
        100,
        2.0,
    )  # row D's eps_ls from the preset
    assert cfg.model_config(None).d_ff == 1024
    with pytest.raises(ValueError, match="cannot read 'x' as int"):
        load_train_config(path, ["max_updates=x"])


def test_the_trainers_valid_perplexity_is_evaluates_on_the_same_sentences(tiny_corpus, tmp_path):
    """One yardstick: Trainer.validate on a binarised valid split and evaluate's
    reference_perplexity on the raw text it was prepared from give the same perplexity."""
    from aiayn.data import Vocab, prepare_corpus
    from aiayn.evaluate import reference_perplexity
    from aiayn.files import read_lines
    from aiayn.train import TrainConfig
    from aiayn.train.trainer import Trainer

    raw = tiny_corpus.parent
    splits = {s: (raw / f"{s}.en", raw / f"{s}.es") for s in ("train", "valid")}
    meta = prepare_corpus(splits, tmp_path / "data", vocab_size=300, max_len=250)
    sources, references = (read_lines(p) for p in splits["valid"])
    assert meta["splits"]["valid"]["pairs"] == len(sources)  # nothing dropped: the same sentences
    cfg = TrainConfig(
        data=str(tmp_path / "data"),
        out=str(tmp_path / "run"),
        preset="tiny",
        model={"N_enc": 1, "N_dec": 1, "d_model": 32, "d_ff": 64, "h": 2},
        max_updates=1,
        num_threads=1,
        amp="none",  # evaluate's reference_perplexity is fp32
    )
    trainer = Trainer(cfg)
    got = trainer.validate()["valid_ppl"]
    vocab = Vocab.load(tmp_path / "data" / "spm.model")
    want = reference_perplexity(trainer.model, vocab, sources, references)
    assert got == pytest.approx(want, rel=1e-4)


def test_a_set_equal_to_the_preset_default_still_beats_the_file():
    # parsing-sample.yaml says norm: pre; post is the preset's (and the paper's) default
    cfg = load_train_config("parsing-sample", ["model.norm=post", "model.P_drop=0.1"])
    model = cfg.model_config(None)
    assert (model.norm, model.P_drop) == ("post", 0.1)


def test_a_preset_named_by_set_brings_its_training_overrides(tmp_path):
    cfg = load_train_config("wmt14-base", ["preset=big"])
    assert (cfg.preset, cfg.max_updates, cfg.keep_last) == ("big", 300_000, 20)
    path = tmp_path / "c.yaml"
    path.write_text("preset: base\nkeep_last: 7\n")
    cfg = load_train_config(path, ["preset=big", "max_updates=50"])
    assert (cfg.max_updates, cfg.keep_last) == (50, 7)  # explicit keys beat the preset's
    path.write_text("preset: big\n")
    cfg = load_train_config(path, ["preset=base"])
    assert (cfg.max_updates, cfg.keep_last) == (100_000, 5)  # big's overrides left with big


# Values to draw from, each list holding some preset's default so that "equal to the default"
# is drawn often: the case that was dropped.
MODEL_VALUES = {
    "P_drop": [0.0, 0.1, 0.3],
    "norm": ["post", "pre"],
    "d_ff": [64, 1024, 2048, 4096],
    "attention_dropout": [0.0, 0.1],
    "share_embeddings": [True, False],
}
TRAIN_VALUES = {
    "eps_ls": [0.0, 0.1, 0.2],
    "keep_last": [3, 5, 20],
    "max_updates": [7, 100_000, 300_000],
    "warmup": [300, 4000],
}
KEYS = [("model", k) for k in MODEL_VALUES] + [("train", k) for k in TRAIN_VALUES]
PRESET_OR_NONE = st.none() | st.sampled_from(sorted(PRESETS))


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(KEYS),
    file_preset=PRESET_OR_NONE,
    set_presets=st.lists(st.sampled_from(sorted(PRESETS)), max_size=2),
    data=st.data(),
)
@pytest.mark.slow
def test_the_resolved_value_is_the_last_one_given(key, file_preset, set_presets, data):
    section, name = key
    values = st.sampled_from((MODEL_VALUES if section == "model" else TRAIN_VALUES)[name])
    in_file = data.draw(st.none() | values, label="file value")
    in_sets = data.draw(st.lists(values, max_size=2), label="--set values")
    file: dict = {} if file_preset is None else {"preset": file_preset}
    if in_file is not None:
        file.update({"model": {name: in_file}} if section == "model" else {name: in_file})
    prefix = "model." if section == "model" else ""
    sets = [f"preset={p}" for p in set_presets] + [f"{prefix}{name}={v}" for v in in_sets]
    cfg = resolve_train_config(file, sets)

    preset = (set_presets or [file_preset or "base"])[-1]
    if section == "model":
        given_last = [PRESETS[preset].fields.get(name, getattr(ModelConfig(), name)), in_file]
        resolved = getattr(cfg.model_config(None), name)
    else:
        given_last = [PRESETS[preset].train.get(name, getattr(TrainConfig(), name)), in_file]
        resolved = getattr(cfg, name)
    expected = [v for v in given_last + in_sets if v is not None][-1]
    assert cfg.preset == preset and resolved == expected


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"patience": 0}, "patience must be >= 1"),
        ({"patience": 3, "validate": False}, "patience needs validation"),
        ({"valid_bleu_sentences": -1}, "valid_bleu_sentences must be >= 0"),
        ({"valid_beam": 0}, "valid_beam must be >= 1"),
        ({"best_metric": "valid_bleu", "validate": True}, "needs validation BLEU"),
        ({"ema_decay": 1.0}, r"ema_decay must be in \(0, 1\)"),
        ({"tokens_per_update": 0}, "tokens_per_update must be >= 1"),
        ({"tokens_per_update": 800, "update_freq": 2}, "set one of them, not both"),
        ({"ema_decay": 0.0}, r"ema_decay must be in \(0, 1\)"),
        ({"compile": "sometimes"}, r"compile must be one of \(True, False, 'auto'\)"),
        ({"amp": "fp8"}, r"amp must be one of"),
        ({"ema_warmup": True}, "ema_warmup warms up the moving average: set ema_decay too"),
    ],
)
def test_config_checks_the_selection_and_stopping_keys(tiny_corpus, tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        config(tiny_corpus, tmp_path, **overrides)


# --- what amp and compile resolve to, and that the run says so --------------------------------
# (the rules themselves: tests/test_measured.py)


def test_the_run_says_which_precision_it_used_and_why(
    tiny_corpus, tmp_path, monkeypatch, capsys, bf16_answer
):
    """Under a table where bf16 training pays on the native class: a native CPU trains in bf16,
    one without in fp32, and the summary, config.json, log.jsonl, meta.json and the progress line
    all say so with the reason."""
    from aiayn.runtime import figures as measured

    table = tmp_path / "measured.json"
    figure = {
        "fp32_tokens_per_s": 1000,
        "bf16_tokens_per_s": 1500,
        "fp32_valid_ppl": 100.0,
        "bf16_valid_ppl": 100.0,
        "updates": 100,
        **{"cpu": "c", "threads": 2, "torch": "t", "date": "d", "command": "x"},
    }
    table.write_text(json.dumps({"cpu-avx512_bf16": {"train_bf16": figure}}))
    monkeypatch.setattr(measured, "TABLE", table)
    if bf16_answer == "native":
        want = ("bf16", "amp=auto and the CPU has avx512_bf16 (AIAYN_ASSUME_BF16=native); bf16 ")
    else:
        want = ("fp32", "amp=auto and the CPU has no native bf16 (AIAYN_ASSUME_BF16=emulated)")
    cfg = config(tiny_corpus, tmp_path / "run", max_updates=2, amp="auto")
    summary = Trainer(cfg).run()
    out = tmp_path / "run"
    saved = json.loads((out / "config.json").read_text())
    first = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    meta = json.loads((latest_checkpoint(out / "checkpoints") / "meta.json").read_text())
    for resolved in (summary["resolved"], saved["resolved"], first["resolved"], meta["resolved"]):
        assert resolved["amp"] == want[0] and resolved["amp_reason"].startswith(want[1])
        assert (
            resolved["compile"] is False
            and "compile=auto: no compile figure" in (resolved["compile_reason"])
        )
    assert f"precision {want[0]} ({want[1]}" in capsys.readouterr().err
    assert load_train_config(out / "config.json") == cfg  # the saved config loads back as it was


@pytest.mark.oracle
@pytest.mark.compile
def test_compile_true_compiles_every_layer_to_the_same_updates(tiny_corpus, tmp_path):
    eager = Trainer(config(tiny_corpus, tmp_path / "eager", model={**TINY, "P_drop": 0.0}))
    compiled = Trainer(
        config(tiny_corpus, tmp_path / "compiled", model={**TINY, "P_drop": 0.0}, compile=True)
    )
    layers = [*compiled.model.encoder, *compiled.model.decoder]
    assert all(layer._compiled_call_impl is not None for layer in layers)
    assert compiled.model.state_dict().keys() == eager.model.state_dict().keys()
    for _ in range(2):
        a = eager.train_update(iter(eager.sampler))
        b = compiled.train_update(iter(compiled.sampler))
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert_same_weights(eager.model.state_dict(), compiled.model.state_dict())
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0
    assert compiled.validate() == pytest.approx(eager.validate())  # run eagerly: no new graph
    assert counters["stats"]["unique_graphs"] == graphs


def test_fine_tuning_takes_the_model_from_the_checkpoint(tiny_run, tiny_corpus, tmp_path, capsys):
    """A fine-tuning config that names only data, out and the schedule trains the checkpoint's
    model (dropout from the config); one whose model section disagrees is one line."""
    from aiayn.checkpoint import read_meta

    source = latest_checkpoint(tiny_run / "checkpoints")
    saved = read_meta(source)["model_config"]
    plain = {"data": str(tiny_corpus), "out": str(tmp_path / "ft"), "max_updates": 1}
    plain |= {"amp": "none", "compile": False, "model": {"P_drop": 0.3}}
    (tmp_path / "c.json").write_text(json.dumps(plain))
    code, _, err = run_cli(capsys, "train", tmp_path / "c.json", "--device", "cpu", "--init-from", source)  # fmt: skip
    assert code == 0, err
    tuned = read_meta(latest_checkpoint(tmp_path / "ft" / "checkpoints"))["model_config"]
    assert tuned == {**saved, "P_drop": 0.3} and saved["d_model"] != 512  # not base's
    cfg = TrainConfig(**{**plain, "out": str(tmp_path / "ft2"), "model": {"d_ff": 128}})
    with pytest.raises(UserError, match=r"says otherwise \(d_ff: 64 there, 128 here\)"):
        Trainer(dataclasses.replace(cfg, init_from=str(source))).run()
