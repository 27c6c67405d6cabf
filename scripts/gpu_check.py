"""One command that checks, and measures, what only a GPU runs: no line of aiayn had run on one.

    python scripts/gpu_check.py --out runs/gpu_check               # one GPU: under 8 minutes
    python scripts/gpu_check.py --device cpu --out /tmp/gpu_check  # the same code on tiny
                                                                      # shapes: < 1 min, 2 cores

A CUDA build of torch first (docs/install.md: `make setup TORCH=torch TORCH_INDEX=...`).
Sections, in order; each one records its own failure with the traceback, and the next runs:

  environment  device, driver, CUDA / cuDNN / NCCL, the torch build, the CPU
  data         the bundled corpus prepared into OUT/data (a 400-pair slice on a CPU), or --data
  sdpa         which SDPA backend runs, seen, not assumed: the ATen attention ops a training
               update and a beam search call by default, and each backend alone (sdpa_kernel):
               ok, or the reasons PyTorch gives for not running it
  train        Trainer.train_update's tokens/s and MFU, shapes base and big, in fp32, bf16
               autocast and fp16 with the gradient scaler; MFU against the device's datasheet
               peak (SPEC_PEAKS) and against the matmul peak measured here (aiayn.runtime.flops)
  resume       `aiayn train` killed with SIGKILL once a checkpoint is out, resumed from it:
               its weights against an uninterrupted run's, bit for bit
  torchrun     N processes (NCCL, one a GPU; gloo and 2 on a CPU) against one process with
               update_freq N, the same global batches
  decode       beam 4, exactly 40 output tokens, batch 1 and 64: ours, and CTranslate2 where
               its wheel sees the device (decode_throughput.py's sources and worker)
  syncs        host reads (host_reads.py) of a training update and per beam step, with and
               without constraints; on a GPU also the syncs torch.cuda.set_sync_debug_mode
               reports
  demo         the demo recipe trained on the device for --demo-minutes (3 on a GPU, skipped
               on a CPU unless asked), then SacreBLEU of its last checkpoint on the test split

Writes OUT/gpu_check.json (every figure; "checks": resume bit-exact, SDPA backend reported,
syncs counted, torchrun equal to update_freq) after every section, so a check cut short keeps
what it finished, and prints OUT/gpu_check.md, the short table. Exit status 1 when a section
failed or a check did not hold.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
# the checkout's package; the decoding benchmark's sources and CTranslate2 worker, so that both
# time the same decoding; the counter of host reads whose counts tests/test_host_reads.py pins
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks"), str(ROOT / "tests")]

from decode_throughput import BEAM, OUT_LEN, Ct2Process, batches, ct2_model, run_ct2, sources
from host_reads import HostReads
from safetensors.torch import load_file

from aiayn import ModelConfig, Transformer
from aiayn.checkpoint import checkpoint_name, latest_checkpoint, load_translator, read_meta
from aiayn.data import TokenDataset, bundled_corpus_paths, collate, prepare_bundled
from aiayn.data import read_meta as read_data_meta
from aiayn.data.prepare import prepare_bundled_slice
from aiayn.decode import DecodeConfig, SearchRequest, beam_search
from aiayn.decode.constraints import OutputConstraint
from aiayn.decode.translate import eval_mode
from aiayn.errors import UserError
from aiayn.evaluate import evaluate_model
from aiayn.files import read_lines, write_text_atomic
from aiayn.runtime.cpu import cpu_description
from aiayn.runtime.flops import measure_matmul_peak
from aiayn.runtime.kernels import use_fast_paths
from aiayn.train import TrainConfig
from aiayn.train.trainer import Trainer

MARKER = ".gpu_check"  # in OUT: this script made it, so a rerun may replace what is inside
AMP = {"fp32": "none", "bf16": "bf16", "fp16": "fp16"}  # the train rows: TrainConfig.amp
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Dense (no sparsity) FLOP/s from NVIDIA's datasheets, by a part of the device's name, the most
# specific first: what MFU is read against. fp32 rows use "tf32" when torch lets matmuls use it.
SPEC_PEAKS = {
    "H200 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12},
    "H200": {"bf16": 989.5e12, "fp16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12},
    "H100 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12},
    "H100 PCIe": {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "fp32": 51e12},
    "H100": {"bf16": 989.5e12, "fp16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
# the ATen op that F.scaled_dot_product_attention chose -> its backend
ATTENTION_OPS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_attention_math": "math",
}
MAX_SKIPPED = 30  # fp16 updates the scaler may skip in a train row's warm-up
TINY = {"preset": "tiny", "model": {"N_enc": 1, "N_dec": 1, "d_model": 32, "d_ff": 64, "h": 2}}


@dataclass(frozen=True)
class Plan:
    """What differs between a GPU's check and a CPU's: sizes, never the code that runs."""

    device: torch.device
    shapes: dict[str, dict[str, Any]]  # the train rows' models: TrainConfig preset and model
    tokens: int  # max_src_tokens = max_tgt_tokens of a train row's batch
    small: dict[str, Any]  # the model of the sdpa, resume, torchrun and syncs sections
    small_tokens: int
    warmup: int  # updates before a train row is timed
    updates: int  # updates timed
    decode_model: dict[str, Any]  # ModelConfig fields, random weights
    decode_sizes: dict[int, int]  # batch size -> sentences decoded
    threads: int | None  # each training subprocess's CPU threads
    demo_minutes: float
    demo_sets: tuple[str, ...] = ()  # --set overrides of the demo recipe
    demo_test_limit: int | None = None  # test sentences the demo's model translates


def make_plan(device: torch.device, demo_minutes: float | None) -> Plan:
    if device.type == "cpu":
        return Plan(
            device,
            shapes={"tiny": TINY},
            tokens=400,
            small=TINY,
            small_tokens=400,
            warmup=1,
            updates=2,
            decode_model=dict(N_enc=1, N_dec=1, d_model=32, d_ff=64, h=2, vocab_size=300),
            decode_sizes={1: 2, 64: 8},
            threads=1,  # the training subprocesses run side by side on 2 cores
            demo_minutes=demo_minutes or 0.0,
            demo_sets=("preset=tiny",),
            demo_test_limit=20,
        )
    return Plan(
        device,
        shapes={"base": {"preset": "base"}, "big": {"preset": "big"}},
        tokens=25_000,  # section 5.1's batch, on one GPU
        small={"preset": "demo", "model": {"P_drop": 0.1}},
        small_tokens=4096,
        warmup=3,
        updates=10,
        decode_model=dict(N_enc=6, N_dec=6, d_model=512, h=8, d_ff=2048, vocab_size=8000),
        decode_sizes={1: 16, 64: 256},
        threads=None,
        demo_minutes=3.0 if demo_minutes is None else demo_minutes,
    )


@dataclass
class Check:
    plan: Plan
    out: Path
    data: Path | None = None  # set by the data section
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def device(self) -> torch.device:
        return self.plan.device

    @property
    def runs(self) -> Path:
        return self.out / "runs"

    def config(self, model: dict[str, Any], out: Path, **keys: Any) -> TrainConfig:
        """A short training run of ``model`` on the check's data."""
        assert self.data is not None, "the data section runs first"
        base = dict(
            data=str(self.data),
            out=str(out),
            preset=model["preset"],
            model=dict(model.get("model", {})),
            max_src_tokens=self.plan.small_tokens,
            max_tgt_tokens=self.plan.small_tokens,
            warmup=100,
            max_updates=6,
            save_every_minutes=None,
            validate=False,
            num_threads=self.plan.threads,
            log_every=1,
            compile=False,
        )
        return TrainConfig(**{**base, **keys})

    def trainer(self, amp: str = "auto", model: dict[str, Any] | None = None, **keys) -> Trainer:
        cfg = self.config(model or self.plan.small, self.runs / "scratch", amp=amp, **keys)
        return Trainer(cfg, device=str(self.device))

    def sources(self, n: int) -> torch.Tensor:
        """The first n test sources, padded: (n, S) on the device."""
        assert self.data is not None
        return collate(TokenDataset(self.data, "test"), list(range(n))).src.to(self.device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- environment and data ------------------------------------------------------------------


def environment(check: Check) -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": cpu_description(),
        "threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "device": "cpu",
    }
    if check.device.type != "cuda":
        return info
    props = torch.cuda.get_device_properties(check.device)
    return info | {
        "device": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "gpus": torch.cuda.device_count(),
        "driver": nvidia_driver(),
        "cudnn": torch.backends.cudnn.version(),
        "nccl": nccl_version(),
    }


def nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (RuntimeError, AttributeError, TypeError):  # a build without NCCL
        return None


def nvidia_driver() -> str | None:
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        result = subprocess.run(query, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else None


def data(check: Check, given: Path | None = None) -> dict[str, Any]:
    """The bundled corpus prepared (reused from an earlier check into the same OUT), a slice
    of it on a CPU, or ``--data``."""
    target = given or check.out / "data"
    if given is None and check.device.type == "cpu":
        target = check.out / "slice" / "data"
        if not (target / "meta.json").is_file():
            pairs = {"train": 400, "valid": 40, "test": 40}
            prepare_bundled_slice(target.parent, pairs, vocab_size=300, max_len=48)
    elif given is None:
        prepare_bundled(target)
    check.data = target
    meta = read_data_meta(target)
    pairs = {split: s["pairs"] for split, s in meta["splits"].items()}
    return {"path": str(target), "pairs": pairs, "vocab_size": meta["vocab_size"]}


# --- which attention kernel runs -----------------------------------------------------------


class AttentionOps(TorchDispatchMode):
    """Counts the SDPA backend ops a block calls (forward ops: backward ones pair with them)."""

    def __init__(self) -> None:
        super().__init__()
        self.backends: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = func.overloadpacket.__name__
        if name in ATTENTION_OPS:
            self.backends[ATTENTION_OPS[name]] += 1
        return func(*args, **(kwargs or {}))


def sdpa(check: Check) -> dict[str, Any]:
    """Per precision: the backends a training update and a beam search call by default, and
    whether each backend alone runs them (ok, or PyTorch's reasons why not)."""
    result = {}
    for precision in ("fp32", "bf16"):
        result[precision] = sdpa_in(check, precision)
        free_memory()
    return result


def sdpa_in(check: Check, precision: str) -> dict[str, Any]:
    trainer = check.trainer(AMP[precision])
    batches = iter(trainer.sampler)
    src = check.sources(4)

    def step() -> None:
        trainer.train_update(batches)
        with eval_mode(trainer.model), autocast(check.device, trainer.amp_dtype):
            beam_search(trainer.model, src, DecodeConfig(beam=4, max_len_a=0, max_len_b=6))

    step()  # lazy set-up out of the way
    with AttentionOps() as ops:
        step()
    alone = {name: only_backend(backend, step) for name, backend in BACKENDS.items()}
    return {"default": dict(ops.backends), "alone": alone}


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def only_backend(backend: SDPBackend, step: Callable[[], None]) -> str:
    """ "ok", or "fails: " and the reasons SDPA warned of when it found no kernel."""
    with warnings.catch_warnings(record=True) as caught, sdpa_kernel([backend]):
        warnings.simplefilter("always")
        try:
            step()
            return "ok"
        except RuntimeError as e:
            reasons = dict.fromkeys(str(w.message).strip() for w in caught)
            return f"fails: {str(e).splitlines()[0]} " + " | ".join(list(reasons)[:4])


# --- training speed ------------------------------------------------------------------------


def train(check: Check) -> dict[str, Any]:
    """tokens/s and MFU of Trainer.train_update, per shape and precision; each row records
    its own failure (fp16 on a CPU, say) and the others run."""
    name = torch.cuda.get_device_name(check.device) if check.device.type == "cuda" else "cpu"
    peaks = {p: spec_peak(name, p) for p in AMP}
    measured = measured_peaks(check.device)
    rows = []
    for shape, model in check.plan.shapes.items():
        for precision, amp in AMP.items():
            row: dict[str, Any] = {"shape": shape, "precision": precision}
            try:
                row |= train_row(check, model, amp)
                flops = row.pop("flops_per_s")
                if peaks[precision] is not None:
                    row["mfu_spec"] = flops / peaks[precision][1]
                row["mfu_measured"] = flops / measured[precision]
            except Exception:
                row["error"] = traceback.format_exc()
            rows.append(row)
            free_memory()
    return {"rows": rows, "spec_peaks": peaks, "measured_peaks": measured}


def spec_peak(device_name: str, precision: str) -> tuple[str, float] | None:
    """(the datasheet row, its FLOP/s) for ``precision`` on this device; None if not listed."""
    if precision == "fp32" and torch.get_float32_matmul_precision() != "highest":
        precision = "tf32"
    for part, peaks in SPEC_PEAKS.items():
        if part in device_name:
            return precision, peaks[precision]
    return None


def measured_peaks(device: torch.device) -> dict[str, float]:
    """aiayn.runtime.flops's matmul peak per precision; on a CPU the fp32 one for all (reduced
    precision there may be emulated, minutes a probe, as Trainer.peak_dtype says)."""
    if device.type == "cpu":
        fp32 = measure_matmul_peak(device, torch.float32, seconds=0.5)
        return dict.fromkeys(AMP, fp32)
    return {p: measure_matmul_peak(device, DTYPES[p]) for p in AMP}


def train_row(check: Check, model: dict[str, Any], amp: str) -> dict[str, Any]:
    plan = check.plan
    tokens = {"max_src_tokens": plan.tokens, "max_tgt_tokens": plan.tokens}
    trainer = check.trainer(amp, model, **tokens)
    batches = iter(trainer.sampler)
    for i in range(plan.warmup + MAX_SKIPPED):  # fp16: until the scaler's scale lets a step
        if trainer.train_update(batches).get("stepped") and i + 1 >= plan.warmup:
            break
    if check.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(check.device)
    sync(check.device)
    update, seen, flops = trainer.update, sum(trainer.tokens.values()), trainer.flops
    start = time.perf_counter()
    for _ in range(plan.updates):
        trainer.train_update(batches)
    sync(check.device)
    seconds = time.perf_counter() - start
    row = {
        "updates": trainer.update - update,  # fp16: the scaler may skip some; only these count
        "tokens_per_s": (sum(trainer.tokens.values()) - seen) / seconds,
        "flops_per_s": (trainer.flops - flops) / seconds,
        "resolved": trainer.resolved.line(),
    }
    if check.device.type == "cuda":
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated(check.device) / 2**30
    return row


# --- resume after SIGKILL, and torchrun ----------------------------------------------------


@dataclass
class Run:
    """A training process and the file its output goes to."""

    process: subprocess.Popen
    log: Path

    def finish(self, timeout: float = 300) -> None:
        """Wait for it; its failure raised with the end of its output."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if code != 0:
            tail = self.log.read_text(encoding="utf-8")[-3000:]
            raise RuntimeError(f"{' '.join(self.process.args)} exited {code}:\n{tail}")

    def stop(self) -> None:
        """End it if it still runs (a section that failed half-way leaves nothing behind);
        SIGTERM first, which torchrun passes on to its workers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def train_process(check: Check, cfg: TrainConfig, name: str, *extra: str, torchrun: int = 0) -> Run:
    """``aiayn train`` (under torchrun with that many processes) in a process of its own, on
    this checkout's code; its config in RUNS/NAME.json, its output in RUNS/NAME.log."""
    check.runs.mkdir(parents=True, exist_ok=True)
    config = check.runs / f"{name}.json"
    config.write_text(json.dumps(dataclasses.asdict(cfg)), encoding="utf-8")
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(torchrun)]
    command = [sys.executable, *(launcher if torchrun else []), "-m", "aiayn", "train", str(config)]
    paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    log = check.runs / f"{name}.log"
    with open(log, "w", encoding="utf-8") as out:
        command += ["--device", check.device.type, *extra]
        return Run(subprocess.Popen(command, stdout=out, stderr=out, env=env), log)


def train_here(check: Check, cfg: TrainConfig) -> None:
    """A training run in this process: where no process boundary is under test, a process of
    its own would only import torch and aiayn again and measure the matmul peak for a summary
    nobody reads (most of a CPU check's time)."""
    Trainer(cfg, device=str(check.device)).run()
    free_memory()


def resume(check: Check) -> dict[str, Any]:
    """Kill a run (SIGKILL: no clean-up at all) once its update-n checkpoint is out, resume it
    to 2n in a process of its own, and compare its weights with a run that went straight to 2n
    (in this process, while the killed one starts); where they differ, a second straight run
    says whether two uninterrupted runs agree at all (kernels that are not deterministic on a
    GPU)."""
    n, small, runs = 3, check.plan.small, check.runs
    straight_cfg = check.config(small, runs / "straight", max_updates=2 * n)
    killed_cfg = check.config(small, runs / "killed", max_updates=10_000, save_every_updates=n)
    first = runs / "killed" / "checkpoints" / checkpoint_name(n)
    started = [train_process(check, killed_cfg, "killed")]
    try:
        # a thread watches for the checkpoint, so the kill is not late while this trains
        with ThreadPoolExecutor(max_workers=1) as watcher:
            killing = watcher.submit(kill_once_written, started[0], first / "meta.json")
            train_here(check, straight_cfg)
            killing.result()
        resumed_cfg = check.config(small, runs / "killed", max_updates=2 * n)
        started.append(train_process(check, resumed_cfg, "resumed", "--resume", str(first)))
        started[-1].finish()
    finally:
        for run in started:
            run.stop()
    last = checkpoint_name(2 * n)
    straight_last = runs / "straight" / "checkpoints" / last
    same = compare(straight_last, runs / "killed" / "checkpoints" / last)
    result = {"killed_at_update": n, "compared_at_update": 2 * n}
    result |= {"bit_exact": same.bit_exact, "max_abs_diff": same.max_abs_diff}
    if not same.bit_exact:
        train_here(check, check.config(small, runs / "control", max_updates=2 * n))
        again = compare(straight_last, runs / "control" / "checkpoints" / last)
        result["two_straight_runs_bit_exact"] = again.bit_exact
    return result


def kill_once_written(run: Run, path: Path, timeout: float = 300) -> None:
    """SIGKILL ``run`` (no clean-up at all) as soon as ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if run.process.poll() is not None or time.monotonic() > deadline:
            run.finish(timeout=0)  # raises with its output unless it ended well
            raise RuntimeError(f"{' '.join(run.process.args)} ended without writing {path}")
        time.sleep(0.01)
    run.process.send_signal(signal.SIGKILL)
    run.process.wait()


@dataclass(frozen=True)
class Comparison:
    bit_exact: bool
    max_abs_diff: float
    close: bool  # allclose(atol 1e-5, rtol 1e-4), tests/test_train.py's tolerance


def compare(a: Path, b: Path, skip_key_bias: bool = False) -> Comparison:
    """Two checkpoints' weights. ``skip_key_bias``: without the key biases, whose gradient is
    zero in exact arithmetic and rounding noise in floats, which Adam turns into steps of size
    lr (tests/test_train.py's assert_same_weights)."""
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    if x.keys() != y.keys():
        raise RuntimeError(f"{a} and {b} hold different weights")
    exact, close, worst = True, True, 0.0
    for name in x:
        p, q = x[name], y[name]
        if skip_key_bias and name.endswith("self_attn.W_QKV.bias"):
            d = p.numel() // 3  # [q | k | v]
            p, q = torch.cat([p[:d], p[2 * d :]]), torch.cat([q[:d], q[2 * d :]])
        elif skip_key_bias and name.endswith("src_attn.W_KV.bias"):
            p, q = p[p.numel() // 2 :], q[q.numel() // 2 :]  # [k | v]
        exact &= torch.equal(p, q)
        close &= torch.allclose(p, q, atol=1e-5, rtol=1e-4)
        worst = max(worst, (p.double() - q.double()).abs().max().item())
    return Comparison(exact, worst, close)


def torchrun(check: Check) -> dict[str, Any]:
    """N processes with torchrun against one process (this one) accumulating N micro-batches:
    the same global batch per update (trainer.py), so the same weights up to float summation
    order.
    Dropout off: each process draws its own masks, which one process cannot repeat."""
    cuda = check.device.type == "cuda"
    procs = torch.cuda.device_count() if cuda else 2
    small = {**check.plan.small, "model": {**check.plan.small.get("model", {}), "P_drop": 0.0}}
    per_update = check.plan.small_tokens * max(procs, 2)
    runs = check.runs
    single_cfg = check.config(small, runs / "single", max_updates=3, tokens_per_update=per_update)
    ddp_cfg = check.config(small, runs / "ddp", max_updates=3, tokens_per_update=per_update)
    ddp = train_process(check, ddp_cfg, "ddp", torchrun=procs)
    try:
        train_here(check, single_cfg)  # while torchrun starts its processes
        ddp.finish()
    finally:
        ddp.stop()
    last = checkpoint_name(3)
    metas = {name: read_meta(runs / name / "checkpoints" / last) for name in ("single", "ddp")}
    same = compare(
        runs / "single" / "checkpoints" / last, runs / "ddp" / "checkpoints" / last, True
    )
    return {
        "processes": procs,
        "backend": ("nccl" if cuda else "gloo") if procs > 1 else "none (one process)",
        "update_freq": {name: meta["update_freq"] for name, meta in metas.items()},
        "world_size": {name: meta["world_size"] for name, meta in metas.items()},
        "max_abs_diff": same.max_abs_diff,
        "equal": same.close and metas["single"]["tokens"] == metas["ddp"]["tokens"],
    }


# --- decoding speed ------------------------------------------------------------------------


def decode(check: Check) -> dict[str, Any]:
    """Beam 4, exactly OUT_LEN output tokens (eos forbidden before), random weights, fp32."""
    plan, device = check.plan, check.device
    torch.manual_seed(0)
    model = Transformer(ModelConfig(P_drop=0.0, **plan.decode_model)).eval()
    srcs = sources(max(plan.decode_sizes.values()), model.cfg.vocab_size)
    ct2 = ct2_rows(check, model, srcs)  # converts the CPU copy of the weights
    model.to(device)
    config = DecodeConfig(beam=BEAM, alpha=0.6, max_len_a=0, max_len_b=OUT_LEN)
    rows = []
    for size, n in plan.decode_sizes.items():
        chunks = [src.to(device) for _, src in batches(srcs[:n], size)]

        def ours(chunks: list[torch.Tensor] = chunks) -> None:
            with torch.inference_mode():
                for src in chunks:
                    beam_search(model, src, config, min_len=OUT_LEN)

        seconds = best_seconds(ours, device, warmup=lambda: ours(chunks[:1]))
        rows.append(decode_row("aiayn", size, n, seconds))
    return {"rows": rows + ct2["rows"], "ctranslate2": ct2["status"]}


def decode_row(system: str, size: int, n: int, seconds: float) -> dict[str, Any]:
    steps = math.ceil(n / size) * OUT_LEN
    return {
        "system": system,
        "batch": size,
        "sentences": n,
        "tokens_per_s": OUT_LEN * n / seconds,
        "ms_per_step": 1000 * seconds / steps,  # one decoder step of one batch, all beams
    }


def best_seconds(
    run: Callable[[], None], device: torch.device, warmup: Callable[[], None], repeats: int = 2
) -> float:
    warmup()
    best = math.inf
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def ct2_rows(check: Check, model: Transformer, srcs: list[list[int]]) -> dict[str, Any]:
    """CTranslate2 on the same weights and sources, in its worker process: on CUDA where its
    wheel sees a GPU, on the CPU in the CPU check."""
    probe = "import ctranslate2, json; print(json.dumps([ctranslate2.__version__, ctranslate2.get_cuda_device_count()]))"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if found.returncode != 0:
        return {"rows": [], "status": "not installed"}
    version, gpus = json.loads(found.stdout)
    if check.device.type == "cuda" and not gpus:
        return {"rows": [], "status": f"ctranslate2 {version}: its wheel sees no GPU"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir, vocab = ct2_model(model, tmp)
        threads = torch.get_num_threads()
        worker = Ct2Process(ct2_dir, "float32", threads, device=check.device.type)
        try:
            for size, n in check.plan.decode_sizes.items():
                run_ct2(worker, vocab, srcs[:size], size)  # warm-up
                seconds = min(run_ct2(worker, vocab, srcs[:n], size) for _ in range(2))
                rows.append(decode_row("ctranslate2", size, n, seconds))
        finally:
            worker.close()
    return {"rows": rows, "status": f"ctranslate2 {version} on {check.device.type}"}


# --- host syncs ----------------------------------------------------------------------------


@contextmanager
def cuda_syncs(device: torch.device) -> Iterator[list[warnings.WarningMessage] | None]:
    """The warnings torch.cuda.set_sync_debug_mode("warn") gives in the block: one per sync."""
    if device.type != "cuda":
        yield None
        return
    sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(0)


def count_syncs(step: Callable[[], None], device: torch.device) -> dict[str, Any]:
    """Host reads by aiayn site (host_reads.py) and, on a GPU, the syncs CUDA reports."""
    with HostReads() as reads, cuda_syncs(device) as caught:
        step()
    counted: dict[str, Any] = {"host_reads": reads.total, "sites": dict(reads.sites)}
    if caught is not None:
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        counted["cuda_syncs"] = len(syncs)
        counted["cuda_sites"] = dict(Counter(f"{w.filename}:{w.lineno}" for w in syncs))
    return counted


def syncs(check: Check) -> dict[str, Any]:
    """A training update (in the precision amp=auto picks), and beam steps, with and without
    constraints (eos forbidden until the length limit, so every search runs its steps)."""
    trainer = check.trainer()
    batches = iter(trainer.sampler)
    trainer.train_update(batches)  # the first update's lazy set-up is not the step
    result = {"train_update": count_syncs(lambda: trainer.train_update(batches), check.device)}
    src = check.sources(4)
    constraint = OutputConstraint([10], [[20, 21]])
    for name, given in (("beam_step", None), ("beam_step_constrained", constraint)):

        def search(steps: int, given=given) -> dict[str, Any]:
            config = DecodeConfig(beam=4, max_len_a=0, max_len_b=steps)
            with eval_mode(trainer.model):
                step = lambda: beam_search(  # noqa: E731
                    trainer.model, src, config, min_len=steps, constraint=given
                )
                return count_syncs(step, check.device)

        result[name] = per_step(search(8), search(16), 8)
    return result


def per_step(short: dict[str, Any], long: dict[str, Any], steps: int) -> dict[str, Any]:
    """What a search of 2n steps reads beyond one of n, per step (the once-a-search reads drop
    out), and those once-a-search reads."""
    result = {
        key: (long[key] - short[key]) / steps
        for key in ("host_reads", "cuda_syncs")
        if key in short
    }
    result["per_search"] = short["host_reads"] - steps * result["host_reads"]
    added = {site: (n - short["sites"].get(site, 0)) / steps for site, n in long["sites"].items()}
    result["sites"] = {site: n for site, n in added.items() if n}
    return result


# --- the demo recipe -----------------------------------------------------------------------


def demo(check: Check) -> dict[str, Any]:
    """The demo's recipe (configs/demo.yaml) trained on the device for the plan's minutes,
    then its last checkpoint (not averaged) decoded on the test split: SacreBLEU. On a CPU
    the tiny preset and 20 test sentences, for a run of seconds."""
    plan = check.plan
    if not plan.demo_minutes:
        return {"skipped": "--demo-minutes 0 (the default on a CPU)"}
    assert check.data is not None
    from aiayn.demo import demo_train_config  # here: it brings matplotlib, for its plots

    out = check.runs / "demo"
    cfg = demo_train_config(check.data, out, plan.demo_minutes, list(plan.demo_sets))
    trainer = Trainer(cfg, device=str(check.device))
    summary = trainer.run()
    cost = trainer.cost(measure_matmul_peak(trainer.device, trainer.peak_dtype))
    model, vocab = load_translator(latest_checkpoint(out / "checkpoints"), check.device)
    use_fast_paths(model)  # the kernels the commands decode with (loading gives weights only)
    sources, references = (
        read_lines(p)[: plan.demo_test_limit] for p in bundled_corpus_paths()["test"]
    )
    test = evaluate_model(model, vocab, sources, references, SearchRequest(), lang="es")
    return {
        "minutes": plan.demo_minutes,
        "sets": list(plan.demo_sets),
        "updates": summary["updates"],
        "tokens_per_s": summary["tokens_per_s"],
        "mfu": cost["mfu"],
        "resolved": summary["resolved"],
        "test": test.as_dict(),
    }


# --- the run, the JSON and the table -------------------------------------------------------

SECTIONS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "environment": environment,
    "sdpa": sdpa,
    "train": train,
    "resume": resume,
    "torchrun": torchrun,
    "decode": decode,
    "syncs": syncs,
    "demo": demo,
}


def run_section(check: Check, name: str, section: Callable[[], dict[str, Any]]) -> None:
    """Run one section, catching its failure (with the traceback) so the next one runs; the
    JSON is rewritten after each."""
    print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        result = {"ok": True, **section()}
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
    result["seconds"] = round(time.perf_counter() - start, 1)
    check.sections[name] = result
    write_text_atomic(
        check.out / "gpu_check.json", json.dumps(report(check), indent=2, default=str)
    )


def checks(sections: dict[str, dict[str, Any]]) -> dict[str, bool | None]:
    """The assertions, each None where its section did not run."""
    got = lambda name, *keys: _get(sections.get(name), *keys)  # noqa: E731
    syncs = sections.get("syncs")
    return {
        "every_section_ok": all(s["ok"] for s in sections.values()),
        "resume_bit_exact": got("resume", "bit_exact"),
        "sdpa_backend_reported": None
        if "sdpa" not in sections
        else bool(got("sdpa", "fp32", "default")),
        "syncs_counted": None
        if syncs is None
        else all(
            "host_reads" in syncs.get(phase, {})
            for phase in ("train_update", "beam_step", "beam_step_constrained")
        ),
        "torchrun_equals_update_freq": got("torchrun", "equal"),
    }


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def report(check: Check) -> dict[str, Any]:
    return {
        "command": " ".join(sys.argv),
        "started": check.started,
        "written": datetime.now(UTC).isoformat(),
        "device": str(check.device),
        "checks": checks(check.sections),
        "sections": check.sections,
    }


def table(check: Check) -> str:
    """The short table: a line per section (one per row for sdpa, train and decode)."""
    lines = ["| section | result | s |", "|---|---|---:|"]
    for name, result in check.sections.items():
        if not result["ok"]:
            last = result["error"].strip().splitlines()[-1]
            lines.append(f"| {name} | FAILED: {last[:120]} | {result['seconds']} |")
            continue
        for i, (label, text) in enumerate(SUMMARIES.get(name, _plain)(result)):
            lines.append(f"| {label or name} | {text} | {'' if i else result['seconds']} |")
    said = ", ".join(f"{k} {v}" for k, v in checks(check.sections).items())
    return "\n".join([*lines, "", f"checks: {said}"])


def _plain(result: dict[str, Any]) -> list[tuple[str, str]]:
    shown = {k: v for k, v in result.items() if k not in ("ok", "seconds")}
    return [("", json.dumps(shown, default=str)[:200])]


def _data(r: dict[str, Any]) -> list[tuple[str, str]]:
    pairs = ", ".join(f"{n:,} {split}" for split, n in r["pairs"].items())
    return [("", f"{pairs} pairs, vocabulary {r['vocab_size']}: {r['path']}")]


def _resume(r: dict[str, Any]) -> list[tuple[str, str]]:
    exact = "bit-exact" if r["bit_exact"] else f"differs by up to {r['max_abs_diff']:.2e}"
    control = r.get("two_straight_runs_bit_exact")
    told = "" if control is None else f"; two uninterrupted runs bit-exact: {control}"
    return [("", f"killed at update {r['killed_at_update']}, resumed: {exact}{told}")]


def _torchrun(r: dict[str, Any]) -> list[tuple[str, str]]:
    freq = r["update_freq"]
    return [
        (
            "",
            f"{r['processes']} x {r['backend']} (update_freq {freq['ddp']}) against 1 process "
            f"with update_freq {freq['single']}: largest difference {r['max_abs_diff']:.1e}, "
            f"equal {r['equal']}",
        )
    ]


def _demo(r: dict[str, Any]) -> list[tuple[str, str]]:
    if "skipped" in r:
        return [("", "skipped: " + r["skipped"])]
    t = r["test"]
    return [
        (
            "",
            f"{r['minutes']:g} min, {r['updates']} updates, {r['tokens_per_s']:,.0f} tokens/s: "
            f"test SacreBLEU {t['sacrebleu']:.2f} ({t['sentences']} sentences)",
        )
    ]


def _environment(r: dict[str, Any]) -> list[tuple[str, str]]:
    gpu = f", driver {r.get('driver')}, CUDA {r['torch_cuda']}" if "driver" in r else ""
    return [("", f"{r['device']}{gpu}, torch {r['torch']}; {r['cpu']}")]


def _sdpa(r: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for precision in ("fp32", "bf16"):
        alone = ", ".join(f"{k} {v.split(':')[0]}" for k, v in r[precision]["alone"].items())
        ran = ", ".join(f"{k} x{n}" for k, n in r[precision]["default"].items())
        out.append((f"sdpa {precision}", f"runs {ran}; alone: {alone}"))
    return out


def _train(r: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for row in r["rows"]:
        label = f"train {row['shape']} {row['precision']}"
        if "error" in row:
            out.append((label, "FAILED: " + row["error"].strip().splitlines()[-1][:100]))
            continue
        spec = f"MFU {row['mfu_spec']:.1%} of spec, " if "mfu_spec" in row else ""
        out.append(
            (
                label,
                f"{row['tokens_per_s']:,.0f} tokens/s, {spec}{row['mfu_measured']:.1%} of measured peak",
            )
        )
    return out


def _decode(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [
        (
            f"decode {row['system']} batch {row['batch']}",
            f"{row['tokens_per_s']:,.0f} tokens/s, {row['ms_per_step']:.2f} ms/step",
        )
        for row in r["rows"]
    ]
    return [*rows, ("decode ctranslate2", r["ctranslate2"])]


def _syncs(r: dict[str, Any]) -> list[tuple[str, str]]:
    def said(phase: dict[str, Any]) -> str:
        cuda = f" (CUDA: {phase['cuda_syncs']:g})" if "cuda_syncs" in phase else ""
        return f"{phase['host_reads']:g}{cuda}"

    return [
        (
            "syncs",
            f"train update {said(r['train_update'])}; per beam step {said(r['beam_step'])}, "
            f"constrained {said(r['beam_step_constrained'])}",
        )
    ]


SUMMARIES: dict[str, Callable[[dict[str, Any]], list[tuple[str, str]]]] = {
    "data": _data,
    "environment": _environment,
    "sdpa": _sdpa,
    "train": _train,
    "decode": _decode,
    "syncs": _syncs,
    "resume": _resume,
    "torchrun": _torchrun,
    "demo": _demo,
}


def start_out(out: Path) -> None:
    """OUT is new, empty, or an earlier check's (its runs/ are replaced, its data reused)."""
    if out.exists() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(f"--out {out}: exists and gpu_check.py did not make it; choose another")
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / MARKER, "made by scripts/gpu_check.py, which may replace it\n")
    if (out / "runs").is_dir():
        import shutil

        shutil.rmtree(out / "runs")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for the JSON, table, runs")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--data", type=Path, help="a prepared dataset to use instead of preparing one")
    p.add_argument("--demo-minutes", type=float, help="default: 3 on a GPU, 0 (skip) on a CPU")
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help="comma list of: " + ", ".join(SECTIONS)
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.sections.split(",")
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise UserError(
            f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--device cuda: this torch sees no CUDA device (--device cpu: the tiny check)"
        )
    start_out(args.out)
    check = Check(make_plan(torch.device(args.device), args.demo_minutes), args.out)
    run_section(check, "data", lambda: data(check, args.data))
    for name in names:
        run_section(check, name, lambda: SECTIONS[name](check))
    text = table(check)
    write_text_atomic(args.out / "gpu_check.md", text + "\n")
    print(text)
    return 0 if all(v is not False for v in checks(check.sections).values()) else 1


if __name__ == "__main__":
    # What the imports made is never garbage: frozen, it is not walked again by each section's
    # gc.collect (free_memory), which then costs what the section left, not all of torch.
    gc.freeze()
    try:
        sys.exit(main())
    except UserError as e:
        sys.exit(f"gpu_check: {e}")
