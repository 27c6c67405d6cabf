"""``aiayn.Translator`` from Python against ``aiayn translate``: the same test split, decoded
A-B-B-A in fresh processes, timed from loading the checkpoint to the last line written.

    .venv/bin/python scripts/dev/translator_ab.py --checkpoint runs/demo/averaged --rounds 2

Each run is a process of its own (this interpreter), which imports first and then times one of:
- ``cli``: ``aiayn.cli.main.main(["translate", "--checkpoint", C, "--input", SRC, "--quiet"])``,
  its stdout sent to a file;
- ``python``: ``aiayn.Translator(C).translate(lines)``, the texts written to a file.
Both take the commands' defaults (``--precision auto``, ``--workers auto``). Prints every run,
the median seconds of each, python/cli speed (the goal: >= 0.97) and whether the two files
are the same bytes (they must be). Needs a quiet machine: on a shared one compare ratios
within a run only. ``--lines N``: the first N verses of the bundled test split (default: all).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository
TEST = ROOT / "src" / "aiayn" / "corpus" / "bible" / "test.en.gz"

_TIMED = """
import json, sys, time
from pathlib import Path
import aiayn
from aiayn.cli.main import main
how, checkpoint, src, out = sys.argv[1:5]
start = time.perf_counter()
if how == "cli":
    with open(out, "w", encoding="utf-8") as sink:
        sys.stdout = sink
        main(["translate", "--checkpoint", checkpoint, "--input", src, "--quiet"])
        sys.stdout = sys.__stdout__
else:
    lines = Path(src).read_text(encoding="utf-8").splitlines()
    with aiayn.Translator(checkpoint) as translator:
        texts = [r.text for r in translator.translate(lines)]
    Path(out).write_text("".join(t + "\\n" for t in texts), encoding="utf-8")
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def timed(how: str, checkpoint: str, src: Path, out: Path) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _TIMED, how, checkpoint, str(src), str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{how} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--rounds", type=int, default=2, help="A-B-B-A rounds (default: 2)")
    p.add_argument("--lines", type=int, help="the first N test verses (default: all)")
    opts = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with gzip.open(TEST, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()[: opts.lines]
        src = work / "test.en"
        src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        seconds: dict[str, list[float]] = {"cli": [], "python": []}
        for _ in range(opts.rounds):
            for how in ("cli", "python", "python", "cli"):
                s = timed(how, opts.checkpoint, src, work / f"{how}.out")
                seconds[how].append(s)
                print(f"{how:6} {s:8.2f} s", flush=True)
        same = (work / "cli.out").read_bytes() == (work / "python.out").read_bytes()
    cli, python = (statistics.median(seconds[k]) for k in ("cli", "python"))
    print(f"median: cli {cli:.2f} s, python {python:.2f} s; python/cli speed {cli / python:.3f}")
    print(f"outputs byte-identical: {same}")


if __name__ == "__main__":
    main()
