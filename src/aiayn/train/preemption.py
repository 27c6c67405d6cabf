"""Pre-emption: SIGTERM (what SLURM and Kubernetes send before they kill a job) and SIGINT
(Ctrl-C) ask a run to stop after the update in progress and save, instead of ending it at
once and losing every update since its last checkpoint.

    with stop_on_signals(trainer.request_stop):
        trainer.run()
    if trainer.preempted:
        raise SystemExit(exit_code(trainer.stopped))

The handlers only record the request; the trainer acts on it at its next update boundary,
where every process agrees to stop at the same update (``Trainer._stop_reason``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals(request: Callable[[int], None]) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT call ``request(signum)`` instead of ending the process;
    the handlers from before are restored on leaving (in the main thread: Python runs signal
    handlers there only).

    A repeated signal calls ``request`` again, which changes nothing: the save it asked for
    finishes, so a checkpoint is never cut short by a second Ctrl-C, nor by torchrun passing on
    the SIGINT the terminal already sent every process. SIGKILL stops a run without saving.
    """

    def handler(signum: int, frame: object) -> None:
        request(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def exit_code(name: str) -> int:
    """The exit status of a run stopped by signal ``name`` ("SIGTERM"): 128 + its number, what
    a shell reports for a process the signal ended (143 for SIGTERM, 130 for SIGINT), so that a
    scheduler or a script sees an interrupted run, not a finished one."""
    return 128 + signal.Signals[name].value
