"""What several commands share, written once: the decoding options and the ``DecodeConfig``
they make, the device, the thread count, the training run, and the line saying where a
command wrote."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    from ..decode import DecodeConfig

# (beam help, alpha help) as each decode preset's commands state its defaults.
_PRESET_HELP = {
    "translation": (
        "beam size (translation preset: 4)",
        "GNMT length penalty alpha (translation preset: 0.6)",
    ),
    "parsing": ("beam size (paper: 21)", "GNMT length penalty alpha (paper: 0.3)"),
}


def say_wrote(command: str, *paths: str | Path) -> None:
    """Where a command wrote, as absolute paths: relative ones resolve against the working directory."""
    print(
        f"aiayn {command}: wrote {', '.join(str(Path(p).resolve()) for p in paths)}",
        file=sys.stderr,
    )


def add_decode_args(p: argparse.ArgumentParser, preset: str | None = None) -> None:
    """The options of every command that decodes with a checkpoint (translate, evaluate, parse
    evaluate, parse parse): every decoding option belongs here.

    ``preset=None`` lets ``--decode-preset`` choose (the translation commands); ``"parsing"``
    fixes the preset and adds its constrained search.
    """
    p.add_argument("--checkpoint", required=True, help="checkpoint or averaged directory")
    if preset is None:
        p.add_argument("--decode-preset", default="translation", choices=list(_PRESET_HELP))
    else:
        p.set_defaults(decode_preset=preset)
    beam_help, alpha_help = _PRESET_HELP[preset or "translation"]
    p.add_argument("--beam", type=int, help=beam_help)
    p.add_argument("--alpha", type=float, help=alpha_help)
    if preset == "parsing":
        p.add_argument(
            "--constrained",
            action="store_true",
            help="search only well-formed trees with one leaf per word (not in the paper; "
            "default: the paper's search, then repair)",
        )
    add_device_arg(p)
    if preset is None:
        add_quantize_arg(p)


def add_device_arg(p: argparse.ArgumentParser, default: str = "cpu") -> None:
    """``--device`` of every command that runs a model; ``main`` checks it (``check_device``)
    before the command starts."""
    p.add_argument(
        "--device", default=default, help=f"cpu, cuda, cuda:N or auto (default: {default})"
    )


def check_device(name: str) -> str:
    """``--device`` as torch takes it ("auto": cuda where there is one, else cpu), or a
    one-line ``UserError``: torch names a device it cannot use in a traceback from deep
    inside loading a checkpoint or starting a run."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cpu" or (device.type == "mps" and torch.backends.mps.is_available()):
        return name
    if device.type != "cuda":
        raise UserError(f"--device {name}: not available here; use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine; use cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UserError(f"--device {name}: this machine has {count} CUDA devices (0-{count - 1})")
    return name


def add_quantize_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize",
        choices=["int8"],
        help="int8 weights for the Linear layers (CPU; quantized after loading)",
    )


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """The preset ``add_decode_args`` chose, with ``--beam`` and ``--alpha`` where given."""
    from ..decode import DecodeConfig

    overrides = {k: v for k, v in (("beam", args.beam), ("alpha", args.alpha)) if v is not None}
    return DecodeConfig.preset(args.decode_preset, **overrides)


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


def add_train_args(
    p: argparse.ArgumentParser, recipe: str, set_example: str, resume_help: str
) -> None:
    """The options of a training command: a config (``recipe`` names a bundled one), overrides,
    resumption and the device."""
    p.add_argument(
        "config",
        nargs="?",
        help=f"YAML/TOML/JSON file of TrainConfig keys, or a bundled recipe: {recipe}",
    )
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help=f"override, e.g. {set_example}"
    )
    p.add_argument("--resume", default="auto", help=resume_help)
    p.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="fine-tune: start a new run from this checkpoint's weights (its vocabulary: "
        "prepare the new text with --vocab CHECKPOINT/spm.model); OUT's own latest "
        "checkpoint, when there is one, is resumed instead",
    )
    p.add_argument(
        "--init-from-keep",
        metavar="PARTS",
        help="also carry over its optimizer, schedule or both (optimizer,schedule); "
        "default: fresh ones",
    )
    add_device_arg(p, default="auto")


def run_training(args: argparse.Namespace, command: str, **defaults: str) -> None:
    """Train as ``add_train_args`` parsed (``defaults``: TrainConfig keys, e.g. the preset, that
    a config and ``--set`` override); the main process prints the summary and where it wrote."""
    from ..train import distributed, load_train_config
    from ..train.trainer import Trainer

    sets = list(args.set or [])
    if args.init_from is not None:
        sets.append(f"init_from={args.init_from}")
    if args.init_from_keep is not None:
        sets.append(f"init_from_keep={args.init_from_keep}")
    cfg = load_train_config(args.config, sets, **defaults)
    trainer = Trainer(cfg, device=args.device)
    summary = trainer.run(resume=args.resume)
    if trainer.dist.is_main:
        print(json.dumps(summary, indent=2))
        say_wrote(command, cfg.out)
    distributed.teardown()
