"""bf16 against fp32 training on this CPU, in one command: ours and the peers (torch.nn.Transformer,
HF Marian) in fp32 and in CPU bf16 autocast, tokens/s interleaved on the same batches
(train_throughput.py's step, small shape, dropout 0.1, fused Adam for all); then the demo recipe
in fp32 and bf16 for the same updates, A-B-B-A: tokens/s and the validation perplexity.

It stops on a CPU without native bf16 (no avx512_bf16 or AMX), where PyTorch emulates bf16
through fp32 and every bf16 row would be slower than fp32.

Cost on 2 cores: about 20 minutes; --quick about 5 (3 repetitions, 20 updates a run, A-B: a
check of the command and a first look, not figures to quote). Run it with nothing else on the
machine: a second job changes the ratios.

    PYTHONPATH=src .venv/bin/python benchmarks/bf16_training.py
    PYTHONPATH=src .venv/bin/python benchmarks/bf16_training.py --quick

The verdicts are issue 40's goals: ours bf16 >= 1.6x ours fp32 on both measures, validation
perplexity within 3% after the same updates, ours bf16 >= 1.3x the fastest peer in its faster
precision. Peers that are not installed are skipped with a message.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from measure_auto import train
from train_throughput import SHAPES, bench_shape

from aiayn import hardware
from aiayn.data import prepare_bundled
from aiayn.policy import resolve_attention
from aiayn.runtime import BF16_MATMULS

OURS = "ours+lsloss+fusedadam"  # the trainer's step: its loss, fused Adam
DEVICE = torch.device("cpu")
PEERS = ("torch.nn", "hf-marian")


def throughput(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """tokens/s of every repetition, by system and precision (fp32, bf16), interleaved."""
    names = {"ours": OURS, **{p: f"{p}+fusedadam" for p in args.peers}}
    # ours in bf16 takes the attention path the trainer would (resolve_attention)
    ours_bf16 = (
        OURS + "+bf16" + ("+mmattn" if resolve_attention("bf16", DEVICE) == BF16_MATMULS else "")
    )
    bf16_row = {base: ours_bf16 if base == OURS else f"{base}+bf16" for base in names.values()}
    rows = [n for base in names.values() for n in (base, bf16_row[base])]
    bench = argparse.Namespace(
        batches=args.batches,
        batch=32,
        max_len=30,
        min_len=20,
        seed=1234,
        warmup=args.warmup,
        reps=args.reps,
        steps=args.steps,
        adam="fused",
    )
    rates = bench_shape(SHAPES[args.config], rows, bench)
    return {
        system: {"fp32": rates[base], "bf16": rates[bf16_row[base]]}
        for system, base in names.items()
        if base in rates  # a peer that is not installed was skipped
    }


def demo_recipe(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The demo recipe's summaries per precision, fresh runs from the same seed, A-B-B-A."""
    if not (args.data / "meta.json").exists():  # prepared by us or by aiayn demo
        prepare_bundled(args.data)
    order = ("none", "bf16") if args.quick else ("none", "bf16", "bf16", "none")
    runs: dict[str, list[dict[str, Any]]] = {"fp32": [], "bf16": []}
    with tempfile.TemporaryDirectory(prefix="bf16_training-") as tmp:
        for i, amp in enumerate(order):
            summary = train(args.data, Path(tmp) / f"{i}-{amp}", args, amp=amp, compile=False)
            runs["fp32" if amp == "none" else "bf16"].append(summary)
            print(
                f"  demo recipe amp={amp}: {summary['tokens_per_s']:.0f} tokens/s, "
                f"valid ppl {summary['valid_ppl']:.2f}, {summary['attention']}",
                flush=True,
            )
    return runs


def report(rates: dict[str, dict[str, list[float]]], runs: dict[str, list[dict[str, Any]]]) -> None:
    """The table of tokens/s (median and best repetition), bf16 over fp32, and the goals."""
    print("\n| system | fp32 tokens/s (median / best) | bf16 | bf16 / fp32 (median / best) |")
    print("|---|---:|---:|---:|")
    best = {s: {p: max(v) for p, v in by.items()} for s, by in rates.items()}
    for system, by in rates.items():
        med = {p: statistics.median(v) for p, v in by.items()}
        print(
            f"| {system} | {med['fp32']:,.0f} / {best[system]['fp32']:,.0f} | "
            f"{med['bf16']:,.0f} / {best[system]['bf16']:,.0f} | "
            f"{med['bf16'] / med['fp32']:.2f}x / {best[system]['bf16'] / best[system]['fp32']:.2f}x |"
        )
    fp32 = statistics.median(s["tokens_per_s"] for s in runs["fp32"])
    bf16 = statistics.median(s["tokens_per_s"] for s in runs["bf16"])
    ppl32, ppl16 = runs["fp32"][-1]["valid_ppl"], runs["bf16"][-1]["valid_ppl"]
    updates = runs["bf16"][-1]["updates"]
    print(
        f"\ndemo recipe, {updates} updates a run: fp32 {fp32:,.0f}, bf16 {bf16:,.0f} tokens/s "
        f"(median of each precision's runs); valid perplexity fp32 {ppl32:.2f}, bf16 {ppl16:.2f}"
    )
    ours = best["ours"]["bf16"] / best["ours"]["fp32"]
    goals = [(f"ours bf16 / fp32, step (best reps): {ours:.2f}x >= 1.6x", ours >= 1.6)]
    goals.append((f"ours bf16 / fp32, demo recipe: {bf16 / fp32:.2f}x >= 1.6x", bf16 >= 1.6 * fp32))
    gap = abs(ppl16 / ppl32 - 1)
    goals.append((f"valid perplexity bf16 against fp32: {gap:.1%} <= 3%", gap <= 0.03))
    peers = {(s, p): v for s in rates if s != "ours" for p, v in best[s].items()}
    if peers:
        (peer, precision), fastest = max(peers.items(), key=lambda kv: kv[1])
        ratio = best["ours"]["bf16"] / fastest
        goals.append(
            (f"ours bf16 / fastest peer ({peer} {precision}): {ratio:.2f}x >= 1.3x", ratio >= 1.3)
        )
    for line, met in goals:
        print(f"  {'met' if met else 'NOT met'}: {line}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few minutes: fewer reps and updates")
    p.add_argument("--peers", default=",".join(PEERS), help="comma list of: " + ", ".join(PEERS))
    p.add_argument("--config", default="small", choices=list(SHAPES), help="the step's shape")
    p.add_argument("--reps", type=int, help="interleaved repetitions (10; --quick 3)")
    p.add_argument("--steps", type=int, help="steps per row per repetition (4; --quick 2)")
    p.add_argument("--updates", type=int, help="per demo-recipe run (100; --quick 20)")
    p.add_argument("--data", type=Path, default=Path("work/bible"), help="prepared if absent")
    p.add_argument("--preset", help="a model preset in place of the demo's (tiny: a check)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    quick = args.quick
    args.reps = args.reps or (3 if quick else 10)
    args.steps = args.steps or (2 if quick else 4)
    args.updates = args.updates or (20 if quick else 100)
    args.warmup, args.batches = (1, 8) if quick else (3, 16)
    args.peers = [p for p in args.peers.split(",") if p]
    unknown = set(args.peers) - set(PEERS)
    if unknown:
        p.error(f"--peers: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PEERS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    support = hardware.bf16_support(torch.device("cpu"))
    if not support.native:
        sys.exit(
            f"bf16_training: {support.reason}: PyTorch emulates bf16 here, slower than fp32; "
            "nothing to measure (run it on a CPU with avx512_bf16 or AMX)"
        )
    torch.set_num_threads(args.threads)
    print(
        f"bf16_training on {hardware.cpu_description()} ({support.reason}), torch "
        f"{torch.__version__}, {args.threads} threads, {args.reps} reps x {args.steps} steps"
        + (" (--quick)" if args.quick else ""),
        flush=True,
    )
    rates = throughput(args)
    runs = demo_recipe(args)
    report(rates, runs)


if __name__ == "__main__":
    main()
