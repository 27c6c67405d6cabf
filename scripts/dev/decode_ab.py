"""Decoding speed of two source trees of this project, old against new, interleaved in one run.

    .venv/bin/python scripts/dev/decode_ab.py --old ../aiayn-old --new . \
        --checkpoint runs/demo/averaged --lines 300 --rounds 2

Two jobs, each run as old, new, new, old per round (A-B-B-A, so that a drift of the machine's
load hits both alike), every run a process of its own with this interpreter and ``PYTHONPATH``
set to the tree's ``src`` (the same torch for both trees):
- ``evaluate``: ``aiayn evaluate --quiet`` on the first ``--lines`` verses of the bundled test
  split (``--precision`` fp32 by default; ``--new-precision bf16`` decodes the new tree in
  bf16 against the old in ``--precision``); its own ``decode_s``, SacreBLEU, and how many
  output lines the two trees share (the search is exact: all of them, unless the model's
  arithmetic changed);
- ``throughput``: each tree's own ``benchmarks/decode_throughput.py --configs d256 --peers``
  (random weights, beam 4, 40 output tokens) at batch 1 and 32, target tokens/s.

- ``search``: beam search (beam 4, 40 tokens, batch 1 and 32) on the d256 shape's random
  weights, the two trees' packages copied as two packages of **one** process and their searches
  interleaved (old, new, new, old, ... ``--rounds`` x 8 each): on a shared VM, where runs of
  separate processes differ by 15% from one to the next, the only figure steady enough to see
  3%; also whether the outputs are equal.

Prints every run, then per job the median of each tree and new/old (> 1: new is faster). Costs
about (2 x rounds) x (the evaluate time + ~1 min) on 2 cores. A shared machine makes single
figures noisy; compare the ratios within one run. ``--threads`` sets OMP_NUM_THREADS for
every run (default: PyTorch's own choice).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository
TEST = ROOT / "src" / "aiayn" / "corpus" / "bible"


def run(tree: Path, args: list[str], threads: int | None) -> str:
    """stdout of ``args`` run with ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def evaluate(
    tree: Path, opts: argparse.Namespace, data: Path, out: Path, precision: str
) -> dict[str, float]:
    """One ``aiayn evaluate --quiet``: decode seconds and SacreBLEU; outputs written to ``out``."""
    args = ["-m", "aiayn", "evaluate", "--checkpoint", opts.checkpoint, "--quiet"]
    args += ["--src", str(data / "src"), "--ref", str(data / "ref"), "--output", str(out)]
    args += ["--precision", precision]
    report = json.loads(run(tree, args, opts.threads))
    return {"decode_s": report["decode_s"], "sacrebleu": report["sacrebleu"]}


def throughput(tree: Path, opts: argparse.Namespace) -> dict[str, float]:
    """Our target tokens/s at batch 1 and 32 (``decode_throughput.py``, no peers)."""
    script = tree / "benchmarks" / "decode_throughput.py"
    args = [str(script), "--configs", "d256", "--peers", "--repeats", "2"]
    args += ["--n1", str(opts.n1), "--n32", "64", "--threads", str(opts.threads or 2)]
    found = re.findall(r"batch\s+(\d+): tok/s\s+aiayn\s+([\d.]+)", run(tree, args, opts.threads))
    return {f"batch {size} tok/s": float(rate) for size, rate in found}


FOR_DECODING = ("runtime.ready", "decode.quantize")  # where for_decoding lives, newest first


def search(trees: dict[str, Path], opts: argparse.Namespace, tmp: Path) -> dict[str, dict]:
    """The ``search`` job: both trees in one child process (``--interleave``), per tree
    {"batch B tok/s": the median}, and "outputs equal" per batch."""
    for name, tree in trees.items():  # relative imports: a copy under another name just works
        shutil.copytree(tree / "src" / "aiayn", tmp / f"{name}_aiayn")
    env = {**os.environ, "PYTHONPATH": str(tmp)}
    if opts.threads is not None:
        env["OMP_NUM_THREADS"] = str(opts.threads)
    args = [sys.executable, __file__, "--interleave", str(opts.rounds * 8), "--old", "-"]
    done = subprocess.run(args + ["--checkpoint", "-"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"search: the interleaved child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def interleave(repeats: int) -> None:
    """The child of ``search``: prints its JSON."""
    import importlib

    import torch

    fields = dict(N_enc=3, N_dec=3, d_model=256, h=4, d_ff=1024, vocab_size=8000)
    packages = {}
    for name in ("old", "new"):
        pkg = f"{name}_aiayn"
        mod = importlib.import_module(f"{pkg}.model")
        for where in FOR_DECODING:
            try:
                ready = importlib.import_module(f"{pkg}.{where}")
                break
            except ModuleNotFoundError:
                continue
        torch.manual_seed(0)  # the same weights in both
        model = ready.for_decoding(mod.Transformer(mod.ModelConfig(**fields)).eval(), None)
        decode = importlib.import_module(f"{pkg}.decode")
        beam = importlib.import_module(f"{pkg}.decode.beam").beam_search
        packages[name] = (model, decode.DecodeConfig(beam=4, max_len_a=0, max_len_b=40), beam)
    result: dict[str, dict] = {"old": {}, "new": {}, "equal": {}}
    for batch in (1, 32):
        src = torch.randint(4, 8000, (batch, 20), generator=torch.Generator().manual_seed(0))
        times: dict[str, list[float]] = {"old": [], "new": []}
        outputs = {}
        with torch.inference_mode():
            for r in range(repeats + 2):  # two rounds of warm-up, not counted
                for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    model, config, beam_search = packages[name]
                    start = time.perf_counter()
                    found = beam_search(model, src, config, min_len=40)
                    if r >= 2:
                        times[name].append(time.perf_counter() - start)
                    outputs[name] = [[h.tokens for h in hyps] for hyps in found]
        for name in ("old", "new"):
            result[name][f"batch {batch} tok/s"] = batch * 40 / statistics.median(times[name])
        result["equal"][f"batch {batch}"] = outputs["old"] == outputs["new"]
    print(json.dumps(result))


def first_lines(n: int, out: Path) -> Path:
    """The first ``n`` test verses and their references, as plain files in ``out``."""
    for name, lang in (("src", "en"), ("ref", "es")):
        with gzip.open(TEST / f"test.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")[:n]
        (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--new", type=Path, default=ROOT)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--lines", type=int, default=300, help="first test verses to decode")
    parser.add_argument("--rounds", type=int, default=2, help="A-B-B-A rounds")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument(
        "--new-precision",
        choices=["fp32", "bf16"],
        help="evaluate: the new tree's precision, if not --precision (e.g. bf16 against fp32)",
    )
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of every run")
    parser.add_argument("--n1", type=int, default=8, help="throughput: sentences at batch 1")
    parser.add_argument("--jobs", nargs="+", default=["evaluate", "throughput"])
    parser.add_argument("--record", help="write the figures as a record (topic decoding) here")
    parser.add_argument("--interleave", type=int, help=argparse.SUPPRESS)  # search's child
    opts = parser.parse_args()
    if opts.interleave:
        return interleave(opts.interleave)
    trees = {"old": opts.old.resolve(), "new": opts.new.resolve()}
    precisions = {"old": opts.precision, "new": opts.new_precision or opts.precision}
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    same: tuple[int, int] | None = None  # evaluate's outputs equal, of
    ratios: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = first_lines(opts.lines, Path(tmp))
        outputs = {name: Path(tmp) / f"{name}.out" for name in trees}
        for job in opts.jobs:
            if job == "search":
                found = search(trees, opts, Path(tmp))
                results[job] = {name: [found[name]] for name in trees}
                print(f"[search] {found}", flush=True)
                equal = all(found["equal"].values())
                ratios["search outputs equal"] = "yes" if equal else "no"
                continue
            results[job] = {name: [] for name in trees}
            for _ in range(opts.rounds):
                for name in ("old", "new", "new", "old"):
                    if job == "evaluate":
                        figures = evaluate(trees[name], opts, data, outputs[name], precisions[name])
                    else:
                        figures = throughput(trees[name], opts)
                    results[job][name].append(figures)
                    print(f"[{job}] {name}: {figures}", flush=True)
            if job == "evaluate":
                old, new = (outputs[n].read_text().splitlines() for n in ("old", "new"))
                same = (sum(a == b for a, b in zip(old, new)), len(old))
                print(f"[evaluate] outputs equal: {same[0]} / {same[1]}")
    for job, by_tree in results.items():
        for key in by_tree["old"][0]:
            old, new = (statistics.median(r[key] for r in by_tree[n]) for n in ("old", "new"))
            line = f"[{job}] {key}: old {old:.2f}  new {new:.2f}"
            if key == "decode_s":
                line += f"  new/old speed {old / new:.2f}"
                ratios[f"{job} {key}: new / old speed"] = f"{old / new:.3f}x"
            elif key.endswith("tok/s"):
                line += f"  new/old speed {new / old:.2f}"
                ratios[f"{job} {key}: new / old speed"] = f"{new / old:.3f}x"
            print(line)
    if opts.record:
        write(opts, ratios, same)


def write(opts: argparse.Namespace, ratios: dict[str, str], same: tuple[int, int] | None) -> None:
    """The A-B as a record (topic decoding): the old tree named by its commit."""
    sys.path.insert(0, str(opts.new.resolve() / "src"))
    from aiayn.records import make_record, write_record

    old = subprocess.run(
        ["git", "-C", str(opts.old), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip() or str(opts.old)
    figures: dict[str, float | int | str] = dict(ratios)
    if same is not None:
        figures["evaluate outputs equal"] = f"{same[0]} / {same[1]}"
    record = make_record(
        topic="decoding",
        what=f"decoding, {opts.precision}, this commit against {old} (A-B-B-A; "
        f"{', '.join(opts.jobs)}; {opts.threads or 'default'} thread(s))",
        figures=figures,
        command="scripts/dev/decode_ab.py " + " ".join(sys.argv[1:]),
        threads=opts.threads,
        notes=f"{opts.rounds} A-B-B-A round(s), jobs {' '.join(opts.jobs)}"
        + (f" ({opts.lines} test verses)" if "evaluate" in opts.jobs else "")
        + ", the median per tree",
    )
    print(f"wrote {write_record(record, opts.record)}")


if __name__ == "__main__":
    main()
