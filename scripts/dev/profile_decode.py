"""Where a decode step's time goes, by part, beside CTranslate2's step on the same weights.

    # benchmarks/decode_throughput.py's d256 3+3 model (random weights), beam 4, exactly 40
    # output tokens, at batch 1 and 32, against CTranslate2 (its own process):
    PYTHONPATH=src .venv/bin/python scripts/dev/profile_decode.py --shape d256 --threads 1 \
        [--quantize int8] [--record records]
    # a checkpoint on the first --lines test verses, as ``aiayn evaluate`` decodes them:
    PYTHONPATH=src .venv/bin/python scripts/dev/profile_decode.py \
        --checkpoint runs/demo/averaged --lines 300 --threads 1
    # another tree's code, the same measurement (e.g. before a change; this tree's script):
    PYTHONPATH=/path/to/other/src .venv/bin/python scripts/dev/profile_decode.py ...

Each job is decoded once to warm up, once timed (the wall time a step, no profiler) and once
under ``torch.profiler``, with the search's functions marked (``record_function``), so that
every operator dispatched from Python (nested ones counted in their caller) falls in a part:
the decoder layers' projections (``W_QKV``, ``W_Q``, ``W_O``, the feed-forward), their
attention (the batched products and softmax over the cache), the cache's writes and masks
(``advance``, ``write``), the decoder's other operators (norms, residuals, the embedding,
laying the heads out), the output projection, the cache reorder as beams and sentences move
(``_leave``: ``select``), ``log_softmax`` + top-k (``output_log_probs``, ``expand``), the
search's own ``finish`` and ``prune``, its other operators, and the encoder with the memory's
keys and values (once a batch, here a share of each step). "Python between ops" is the step's
wall time less the time of all its operators: the interpreter's share. The profiler adds its
own overhead to each operator: compare parts and trees, not the sum with the wall time of
another tool. The operators a step dispatches are a count that the machine's load does not
move. ``--record DIR`` (``--shape`` only): one record a batch size (topic decoding).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from aiayn.decode import beam as beam_module
from aiayn.decode import cache as cache_module
from aiayn.records import make_record, package_version, write_record
from aiayn.runtime.ready import for_decoding

# aiayn is imported first, from PYTHONPATH (another tree's too): decode_throughput puts this
# tree's src on sys.path, which then no longer decides which aiayn runs
ROOT = Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository
sys.path.insert(0, str(ROOT / "benchmarks"))  # the throughput benchmark's model and sources
from decode_throughput import (  # noqa: E402
    BEAM,
    CONFIGS,
    OUT_LEN,
    Ct2Process,
    ct2_model,
    our_model,
    run_ct2,
    run_ours,
    sources,
)

TEST = ROOT / "src" / "aiayn" / "corpus" / "bible" / "test.en.gz"
OPS = ("aten::", "mkldnn::", "quantized::")  # what an operator's profiler event is named
LAYERS = "decoder layers"  # a part split further by operator (LAYER_OPS)
LAYER_OPS = {
    "projections": {
        "mkldnn::_linear_pointwise",
        "aten::linear",
        "aten::addmm",
        "aten::mm",
        "aten::matmul",
        "quantized::linear_dynamic",
    },
    "attention": {"aten::baddbmm", "aten::bmm", "aten::softmax", "aten::_softmax"},
}
# the functions marked, by where they live, and the part their operators count in
MARKS: list[tuple[Any, str, str]] = [
    (beam_module, "decode_step", "output projection"),  # what decode_state leaves: generator
    (cache_module, "decode_state", LAYERS),
    (cache_module.DecoderCache, "advance", "cache writes and masks"),
    (cache_module.LayerCache, "write", "cache writes and masks"),
    (beam_module, "_leave", "cache reorder (select)"),
    (beam_module, "output_log_probs", "log_softmax + top-k"),
    (beam_module, "expand", "log_softmax + top-k"),
    (beam_module, "finish", "search: finish, prune"),
    (beam_module, "prune", "search: finish, prune"),
    (beam_module, "new_cache", "encoder, memory k/v (once a batch)"),
]
ENCODE = "encoder, memory k/v (once a batch)"  # the model's encode, marked on the instance
OTHER_LAYER, OTHER_SEARCH = "decoder: other ops", "search: other ops"
PYTHON = "Python between ops"


@dataclass(frozen=True)
class Step:
    """A decode step as a whole: its wall time without and with the profiler, and the operators
    dispatched from Python in it (nested ones not counted)."""

    ms: float
    profiled_ms: float
    ops: float
    ops_by_part: dict[str, float]  # a step's operators per part
    ops_by_name: dict[tuple[str, str], float]  # and per part and operator


@contextmanager
def marked(model: Any, steps: list[int]) -> Iterator[None]:
    """The search's functions (``MARKS``) and ``model.encode`` wrapped in ``record_function``
    under their own names while inside; ``steps[0]`` counts the calls of ``decode_step``."""

    def wrap(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        def inner(*args: Any, **kwargs: Any) -> Any:
            steps[0] += name == "decode_step"
            with record_function(name):
                return fn(*args, **kwargs)

        return inner

    with ExitStack() as stack:
        for owner, name, _ in MARKS:
            stack.enter_context(mock.patch.object(owner, name, wrap(getattr(owner, name), name)))
        if hasattr(model, "encode"):
            stack.enter_context(mock.patch.object(model, "encode", wrap(model.encode, "encode")))
        yield


def part_of(event: Any) -> str:
    """The part an operator's time counts in: its nearest marked caller's, the decoder layers'
    split by operator (``LAYER_OPS``)."""
    names = {name: part for _, name, part in MARKS} | {"encode": ENCODE}
    parent = event.cpu_parent
    while parent is not None and parent.name not in names:
        parent = parent.cpu_parent
    if parent is None:
        return OTHER_SEARCH
    part = names[parent.name]
    if part != LAYERS:
        return part
    return next((p for p, ops in LAYER_OPS.items() if event.name in ops), OTHER_LAYER)


def profile_parts(decode: Callable[[], Any], model: Any) -> tuple[dict[str, float], Step, Any]:
    """``decode()`` warmed up, timed and profiled: per part its milliseconds a step (``PYTHON``
    the wall time left over), the step as a whole, and the profile."""
    with profile(activities=[ProfilerActivity.CPU]):  # the profiler's own start-up cost
        decode()  # warm-up: oneDNN's primitives, the allocator's pages
    steps = [0]
    with marked(model, steps):
        start = time.perf_counter()
        decode()
        wall, timed_steps = time.perf_counter() - start, steps[0]
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            decode()
        profiled = time.perf_counter() - start
    per_step: dict[str, float] = defaultdict(float)
    ops: dict[tuple[str, str], float] = defaultdict(float)
    for event in prof.events():
        if event.name.startswith(OPS) and not _under_op(event):
            part = part_of(event)
            per_step[part] += event.cpu_time_total / 1e3 / timed_steps  # us -> ms
            ops[part, event.name] += 1 / timed_steps
    parts = dict(sorted(per_step.items(), key=lambda kv: -kv[1]))
    parts[PYTHON] = wall * 1e3 / timed_steps - sum(parts.values())
    by_part = {part: sum(n for (p, _), n in ops.items() if p == part) for part in parts}
    ms, profiled_ms = wall * 1e3 / timed_steps, profiled * 1e3 / timed_steps
    return parts, Step(ms, profiled_ms, sum(ops.values()), by_part, dict(ops)), prof


def _under_op(event: Any) -> bool:
    return event.cpu_parent is not None and event.cpu_parent.name.startswith(OPS)


def print_parts(
    title: str, parts: dict[str, float], step: Step, ct2_ms: float | None, show_ops: bool
) -> None:
    """A step by part: each part's milliseconds, share of the wall time and operators."""
    print(f"{title}: {step.ms:.3f} ms a step without the profiler", end="")
    print(f", {step.profiled_ms:.3f} ms with it, {step.ops:.1f} ops a step")
    if ct2_ms is not None:
        print(f"  CTranslate2 {ct2_ms:.3f} ms a step: ours / CTranslate2 speed", end=" ")
        print(f"{ct2_ms / step.ms:.2f}x")
    for part, ms in parts.items():
        print(f"  {part:<38} {ms:8.3f} ms {ms / step.ms:6.1%}", end="")
        print(f" {step.ops_by_part[part]:6.1f} ops" if step.ops_by_part[part] else "")
    if show_ops:
        for (part, name), n in sorted(step.ops_by_name.items()):
            print(f"    {part:<38} {name:<40} {n:6.2f} a step")


def shape_job(args: argparse.Namespace) -> None:
    """The throughput benchmark's model at each batch size, ours by part beside CTranslate2."""
    precision = args.quantize or "fp32"
    fp32 = our_model(CONFIGS[args.shape])
    model = for_decoding(our_model(CONFIGS[args.shape]), args.quantize)
    srcs = sources(max(args.batches) * args.chunks, model.cfg.vocab_size)
    with tempfile.TemporaryDirectory() as tmp:
        ct2, vocab = None, None
        if not args.no_ct2:
            ct2_dir, vocab = ct2_model(fp32, tmp)
            ct2 = Ct2Process(ct2_dir, "int8" if args.quantize else "float32", args.threads)
        for size in args.batches:
            chunk = srcs[: size * args.chunks]
            parts, step, _ = profile_parts(partial(run_ours, model, chunk, size), model)
            ct2_ms = None
            if ct2 is not None:
                run_ct2(ct2, vocab, chunk[:size], size)  # warm-up
                ct2_ms = run_ct2(ct2, vocab, chunk, size) * 1e3 / (args.chunks * OUT_LEN)
            title = f"[{args.shape} {precision}, beam {BEAM}, batch {size}]"
            print_parts(title, parts, step, ct2_ms, args.ops)
            if args.record:
                record(args, size, (parts, step), ct2_ms)
        if ct2 is not None:
            ct2.close()


def record(
    args: argparse.Namespace,
    size: int,
    profiled: tuple[dict[str, float], Step],
    ct2_ms: float | None,
) -> None:
    """One batch size's step by part as a record (topic decoding), CTranslate2's step first."""
    parts, step = profiled
    figures: dict[str, float | int | str] = {}
    if ct2_ms is not None:
        figures["ours / CTranslate2 step speed"] = f"{ct2_ms / step.ms:.2f}x"
        figures["CTranslate2 ms a step"] = round(ct2_ms, 3)
    figures |= {"ours ms a step": round(step.ms, 3)}
    figures |= {f"{part} ms": round(ms, 3) for part, ms in parts.items()}
    figures |= {"ops a step": round(step.ops, 1), "profiled ms a step": round(step.profiled_ms, 3)}
    precision = args.quantize or "fp32"
    against = "" if ct2_ms is None else " against CTranslate2"
    rec = make_record(
        topic="decoding",
        what=f"one decode step by part, {args.shape}, beam {BEAM}, batch {size}, {precision}"
        + f"{against}, {args.threads} thread(s)",
        figures=figures,
        command="scripts/dev/profile_decode.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        peers={} if ct2_ms is None else {"ctranslate2": package_version("ctranslate2")},
        notes=f"{args.chunks} batches of {OUT_LEN} steps after a warm-up; parts under "
        "torch.profiler (its overhead in each op), Python = the wall time without it less them",
    )
    print(f"wrote {write_record(rec, args.record)}")


def checkpoint_job(args: argparse.Namespace) -> None:
    """A checkpoint on the test split, as ``aiayn evaluate`` decodes: by part and by operator."""
    from aiayn.checkpoint import load_translator
    from aiayn.decode.translate import decode_ids

    model, vocab = load_translator(args.checkpoint)
    model = for_decoding(model, args.quantize, args.precision)
    with gzip.open(TEST, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")[: args.lines]
    ids = [vocab.encode_source(line) for line in lines]
    parts, step, prof = profile_parts(lambda: decode_ids(model, ids), model)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    precision = args.quantize or args.precision
    print_parts(
        f"[{len(ids)} verses, {precision}, {args.threads} thread(s)]", parts, step, None, args.ops
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    job = parser.add_mutually_exclusive_group(required=True)
    job.add_argument("--shape", choices=list(CONFIGS), help="decode_throughput.py's model")
    job.add_argument("--checkpoint", help="a checkpoint, on the bundled test split")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--chunks", type=int, default=4, help="--shape: batches a size")
    parser.add_argument("--no-ct2", action="store_true", help="--shape: ours alone")
    parser.add_argument("--lines", type=int, default=300, help="--checkpoint: test verses")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--quantize", choices=["int8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=15, help="--checkpoint: operators listed")
    parser.add_argument("--ops", action="store_true", help="list each part's operators")
    parser.add_argument("--record", help="--shape: write each batch size's parts here")
    args = parser.parse_args()
    if args.record and not args.shape:
        parser.error(
            "--record writes --shape's profile (a checkpoint's has no CTranslate2 beside it)"
        )
    torch.set_num_threads(args.threads)
    if args.shape:
        shape_job(args)
    else:
        checkpoint_job(args)


if __name__ == "__main__":
    main()
