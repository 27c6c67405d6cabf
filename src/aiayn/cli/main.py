"""The ``aiayn`` command line. Each sub-command parses its arguments and calls the library.

aiayn demo                      # the bundled English->Spanish translator, end to end
aiayn info --presets            # parameter counts next to Table 3
aiayn prepare --bundled --out work/bible
aiayn shortlist --data work/bible      # for translate --shortlist work/bible/shortlist.json
aiayn train --set data=work/bible --set out=runs/demo --set preset=demo --set max_minutes=15
torchrun --nproc_per_node 8 -m aiayn train wmt14-base   # a bundled recipe (aiayn/configs/) or a file
aiayn average runs/demo/checkpoints --last 5 --out runs/demo/averaged
aiayn evaluate --checkpoint runs/demo/averaged --src src/aiayn/corpus/bible/test.en.gz --ref src/aiayn/corpus/bible/test.es.gz --lang es
aiayn compare runs/demo other.hyp.es --ref src/aiayn/corpus/bible/test.es.gz   # intervals, p-values
echo "In the beginning ..." | aiayn translate --checkpoint runs/demo/averaged
aiayn score --checkpoint runs/demo/averaged --src src/aiayn/corpus/bible/test.en.gz --ref src/aiayn/corpus/bible/test.es.gz
aiayn serve --checkpoint runs/demo/averaged --port 8000   # then open http://127.0.0.1:8000/
aiayn export --checkpoint runs/demo/averaged --to ctranslate2 --out runs/demo/ct2
aiayn measure decode_bf16 --checkpoint runs/demo/averaged   # this machine's figures for auto
aiayn import opus-mt-en-es --out runs/opus/imported   # a MarianMT directory as a checkpoint
aiayn distill runs/demo/averaged --data work/bible --out runs/distill   # a 3x faster student
"""

from __future__ import annotations

import argparse
import errno
import sys
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import UserError
from . import (
    compare,
    data,
    demo,
    distill,
    experiment,
    export,
    measure,
    parse,
    score,
    serve,
    train,
    translate,
)
from .common import check_device, follow_checkpoint_pointers

# The sub-commands in the order `aiayn --help` lists them.
COMMANDS = (
    data.add_info,
    data.add_prepare,
    data.add_shortlist,
    train.add_train,
    train.add_average,
    translate.add_evaluate,
    compare.add_compare,
    translate.add_translate,
    score.add_score,
    serve.add_serve,
    translate.add_diagnose,
    demo.add_demo,
    distill.add_distill,
    measure.add_measure,
    experiment.add_experiment,
    export.add_export,
    export.add_import,
    parse.add_parse,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(sub)
    return parser


# The OSErrors that are about the user's own paths and disks: one line. Any other (an invalid
# argument, a failed allocation, a socket) is a bug or the system's, and keeps its traceback.
PATH_ERRORS = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    BrokenPipeError,  # the reader went away (aiayn translate ... | head)
)
PATH_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.ENAMETOOLONG,
        errno.ELOOP,
        errno.EFBIG,
        errno.EADDRINUSE,  # serve --port: taken
    }
)


def is_path_error(err: BaseException) -> bool:
    """Whether ``err`` is bad input (``UserError``) or an ``OSError`` about the user's paths:
    not found, permission, is (not) a directory, disk full, read-only, name too long."""
    if isinstance(err, UserError):
        return True
    return isinstance(err, PATH_ERRORS) or (isinstance(err, OSError) and err.errno in PATH_ERRNOS)


def _one_line(command: str) -> Callable[..., str]:
    """``warnings.formatwarning`` for a command: the library's warnings as the command's own
    lines (``aiayn import: warning: ...``), not a file and line of our code. The format, not
    ``showwarning``, so that ``warnings.catch_warnings(record=True)`` still records them."""

    def format_warning(message: Warning | str, *args: Any, **kwargs: Any) -> str:
        return f"aiayn {command}: warning: {message}\n"

    return format_warning


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    previous, warnings.formatwarning = warnings.formatwarning, _one_line(args.command)
    try:
        if "device" in args:  # once, here, for every command that takes it
            args.device = check_device(args.device)
        follow_checkpoint_pointers(args)  # OUT/checkpoints/latest or best: what it names
        args.func(args)
    except KeyboardInterrupt:  # also while a handler still imports the library (seconds)
        print(f"aiayn {args.command}: stopped by SIGINT", file=sys.stderr)
        raise SystemExit(130) from None
    except (UserError, OSError) as err:
        if not is_path_error(err):
            raise  # a bug keeps its traceback
        print(f"aiayn {args.command}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        warnings.formatwarning = previous
