"""What every command shares, written once: the device, the thread count, a checkpoint given
as a run's pointer, progress, and the line saying where a command wrote."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def say_wrote(command: str, *paths: str | Path) -> None:
    """Where a command wrote, as absolute paths: relative ones resolve against the working directory."""
    print(
        f"aiayn {command}: wrote {', '.join(str(Path(p).resolve()) for p in paths)}",
        file=sys.stderr,
    )


def follow_checkpoint_pointers(args: argparse.Namespace) -> None:
    """``--checkpoint`` (each of them), ``--resume`` and ``--init-from`` given as a run's
    ``checkpoints/latest`` or ``checkpoints/best`` file: the checkpoint it names instead."""
    names = ("checkpoint", "resume", "init_from")
    given: dict[str, Any] = {name: getattr(args, name, None) for name in names}
    given = {name: value for name, value in given.items() if value not in (None, "auto")}
    if not given:
        return
    from ..checkpoint import follow_pointer

    for name, value in given.items():
        followed = [str(follow_pointer(v)) for v in value] if isinstance(value, list) else None
        setattr(args, name, followed if followed is not None else str(follow_pointer(value)))


def show_progress(quiet: bool) -> bool:
    """A progress bar on stderr: when it is a terminal, and without ``--quiet``."""
    return not quiet and sys.stderr.isatty()


def add_device_arg(p: argparse.ArgumentParser, default: str = "cpu") -> None:
    """``--device`` of every command that runs a model; ``main`` checks it (``check_device``)
    before the command starts."""
    p.add_argument(
        "--device", default=default, help=f"cpu, cuda, cuda:N or auto (default: {default})"
    )


def check_device(name: str) -> str:
    """``--device`` as torch takes it, or a one-line ``UserError`` (``hardware.resolve_device``,
    which ``aiayn.Translator`` resolves its device with too)."""
    from ..runtime.hardware import resolve_device

    return resolve_device(name)


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads (default: torch's); 1 is far faster on a busy machine",
    )


def set_threads(args: argparse.Namespace) -> None:
    """Apply ``--threads`` (``add_threads_arg``); without it torch keeps its default."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
