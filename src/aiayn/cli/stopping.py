"""Stopping a long command (``prepare``, ``demo``, ``experiment``) by SIGTERM or Ctrl-C outside training:
one line saying how to continue and a shell's exit status, not a traceback or a silent end.
Training inside them keeps its own handlers (``train.preemption``), which save first."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM, raised where the command is, as Python raises KeyboardInterrupt for SIGINT: a
    ``BaseException`` like it, so that only cleanup code (``finally``) sees it on its way."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


@contextmanager
def one_line_on_signal(command: str, again: str) -> Iterator[None]:
    """Inside, SIGTERM and Ctrl-C end ``aiayn COMMAND`` with ``stopped by SIG...; AGAIN`` on
    stderr and status 143 or 130; the SIGTERM handler from before is restored on leaving."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    except (KeyboardInterrupt, Terminated) as err:
        name = signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT
        print(f"aiayn {command}: stopped by {name.name}; {again}", file=sys.stderr)
        raise SystemExit(128 + name.value) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
