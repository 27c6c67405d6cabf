"""The demo recipe's training speed of two source trees of this project, old against new, in one
run: issue 59's A-B (the bf16 step against an older commit's on the same machine, and no
regression elsewhere).

    git worktree add /tmp/old 7874d75
    .venv/bin/python scripts/dev/train_ab.py --old /tmp/old --updates 400 --threads 2
    # the same with bf16 autocast in both trees (a CPU with native bf16: avx512_bf16 or AMX)
    .venv/bin/python scripts/dev/train_ab.py --old /tmp/old --updates 400 --amp bf16 \
        --record records

Every run is a process of its own with this interpreter and ``PYTHONPATH`` set to the tree's
``src`` (the same torch for both trees), in the order old, new, new, old per round (A-B-B-A, so
that a drift of the machine's load hits both alike). A run is the tree's own bundled demo recipe
(``recipe_config("demo")``) from seed 1 for ``--updates`` updates, ``--amp`` and ``compile`` as
given, no checkpoint schedule and no BLEU, on the bundled corpus that tree prepared itself
(once, under ``--work``). From each run's summary: tokens/s (source + target tokens over the
training seconds, the trainer's own yardstick) and the validation perplexity after the same
updates. Prints every run, then per tree the median tokens/s and new/old (> 1: new is faster)
and how far apart the perplexities are. Cost on 2 cores: about 4 x rounds x (updates x 0.65 s
in fp32) plus two preparations of the corpus (~1 min each). Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# what a run executes with a tree's code: aiayn.analysis.measure.train's run, written out because an older
# tree (7874d75) has no aiayn.analysis.measure; both have recipe_config, Trainer and prepare_bundled
RUN = """
import json, sys
from pathlib import Path
from aiayn.data.prepare import prepare_bundled
from aiayn.train.config import recipe_config
from aiayn.train.trainer import Trainer
data, out, updates, threads, amp, compile = sys.argv[1:7]
if not (Path(data) / "meta.json").exists():
    prepare_bundled(Path(data))
cfg = recipe_config(
    "demo", [], data=data, out=out, max_minutes=None, max_updates=int(updates),
    save_every_minutes=None, save_every_updates=None, valid_bleu_sentences=0,
    num_threads=int(threads), log_every=10, seed=1, amp=amp, compile=compile == "true",
)
summary = Trainer(cfg).run(resume=None)
print(json.dumps({k: summary[k] for k in ("tokens_per_s", "valid_ppl", "updates")}))
"""


def train(tree: Path, work: Path, run: str, opts: argparse.Namespace) -> dict[str, float]:
    """One run of the demo recipe with ``tree``'s code: its tokens/s, perplexity, updates."""
    tag = hashlib.blake2b(str(tree.resolve()).encode(), digest_size=4).hexdigest()
    data = work / f"data-{tree.name}-{tag}"  # prepared by the tree itself, reused across runs
    args = [str(data), str(work / run), str(opts.updates), str(opts.threads), opts.amp]
    args.append("true" if opts.compile else "false")
    env = {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
    done = subprocess.run(
        [sys.executable, "-c", RUN, *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the demo recipe failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", type=Path, required=True, help="the older source tree (a worktree)")
    p.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[2])
    p.add_argument("--updates", type=int, default=400)
    p.add_argument("--rounds", type=int, default=1, help="A-B-B-A rounds")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--amp", default="none", help="the trainer's amp in both trees: none, bf16")
    p.add_argument("--compile", action="store_true", help="compile=true in both trees")
    p.add_argument("--work", type=Path, help="runs and prepared data (default: a temporary one)")
    p.add_argument("--record", help="write the figures as a record (topic training) here")
    opts = p.parse_args()
    trees = {"old": opts.old, "new": opts.new}
    for which, tree in trees.items():
        if not (tree / "src" / "aiayn").is_dir():
            p.error(f"--{which} {tree}: not a source tree of this project (no src/aiayn)")
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = opts.work or Path(tmp)
        for r in range(opts.rounds):
            for i, which in enumerate(("old", "new", "new", "old")):
                result = train(trees[which], work, f"{r}-{i}-{which}", opts)
                runs[which].append(result)
                print(
                    f"  {which}: {result['tokens_per_s']:.0f} tokens/s, ppl "
                    f"{result['valid_ppl']:.2f} after {result['updates']} updates",
                    flush=True,
                )
    rate = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    ppl = {k: v[-1]["valid_ppl"] for k, v in runs.items()}
    apart = abs(ppl["new"] / ppl["old"] - 1)
    print(
        f"old {rate['old']:.0f} tokens/s, new {rate['new']:.0f}: new/old "
        f"{rate['new'] / rate['old']:.3f}x; perplexity {ppl['old']:.2f} against "
        f"{ppl['new']:.2f} ({apart:.1%} apart)"
    )
    if opts.record:
        write(opts, rate, ppl, apart)


def write(opts: argparse.Namespace, rate: dict[str, float], ppl: dict[str, float], apart: float):
    """The A-B as a record: the old tree named by its commit."""
    sys.path.insert(0, str(opts.new.resolve() / "src"))
    from aiayn.records import make_record, write_record

    old = subprocess.run(
        ["git", "-C", str(opts.old), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip() or str(opts.old)
    precision = "fp32" if opts.amp == "none" else opts.amp
    record = make_record(
        topic="training",
        what=f"the demo recipe's training, {precision}, this commit against {old} (A-B-B-A)",
        figures={
            "new / old tokens/s": f"{rate['new'] / rate['old']:.3f}x",
            "new tokens/s": round(rate["new"]),
            "old tokens/s": round(rate["old"]),
            f"perplexity after {opts.updates} updates, new / old": (
                f"{ppl['new']:.2f} / {ppl['old']:.2f} ({apart:.1%} apart)"
            ),
        },
        command="scripts/dev/train_ab.py " + " ".join(sys.argv[1:]),
        threads=opts.threads,
        notes=f"{opts.rounds} A-B-B-A round(s), {opts.updates} updates a run, the median per tree",
    )
    print(f"wrote {write_record(record, opts.record)}")


if __name__ == "__main__":
    main()
