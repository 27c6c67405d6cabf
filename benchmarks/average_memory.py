"""Peak memory of averaging K checkpoints (``aiayn average``, section 6.1), against the size of
one checkpoint: averaging accumulates one checkpoint at a time, so the peak should stay near
two checkpoints' tensors (the fp32 sums and the one being added) whatever K.

    PYTHONPATH=src .venv/bin/python benchmarks/average_memory.py --preset base --count 20

It writes K checkpoints of a randomly initialised model of the preset into a temporary
directory (``--preset base``: 20 x 250 MB), then averages them in a fresh child process and
reports that process's peak resident memory (``ru_maxrss``) beside the peak of a child that only
imports torch and aiayn and loads one checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from aiayn import ModelConfig, Transformer
from aiayn.checkpoint import WEIGHTS, save_checkpoint

CHILD = """
import resource, sys
from pathlib import Path
from aiayn.averaging import average_checkpoints
from aiayn.checkpoint import list_checkpoints, load_state
root = Path(sys.argv[1])
if sys.argv[2] == "average":
    average_checkpoints(list_checkpoints(root / "checkpoints"), root / "averaged")
else:
    load_state(list_checkpoints(root / "checkpoints")[0])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
"""


def peak_mib(root: Path, what: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), what], check=True, capture_output=True, text=True
    )
    return int(out.stdout.split()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=37000, help="the paper's shared vocabulary")
    args = parser.parse_args()
    cfg = dataclasses.replace(ModelConfig.preset(args.preset), vocab_size=args.vocab)
    with tempfile.TemporaryDirectory(prefix="average_memory-") as tmp:
        root = Path(tmp)
        for update in range(1, args.count + 1):
            torch.manual_seed(update)
            meta = {"update": update, "model_config": dataclasses.asdict(cfg)}
            save_checkpoint(root / "checkpoints", update, Transformer(cfg), meta, None, None)
        size = (root / "checkpoints" / "update_0000001" / WEIGHTS).stat().st_size / 2**20
        one, averaged = peak_mib(root, "load"), peak_mib(root, "average")
    print(
        f"{args.count} checkpoints of preset {args.preset} (vocab {args.vocab}), {size:.0f} MiB each"
    )
    print(f"peak RSS loading one: {one:.0f} MiB; averaging all {args.count}: {averaged:.0f} MiB")
    print(
        f"averaging costs {(averaged - one) / size:.1f} checkpoints beyond loading one "
        f"(all {args.count} at once would be {args.count - 1} more)"
    )


if __name__ == "__main__":
    main()
