"""The paper's experiments, and the ones it left open, as commands (``aiayn experiment NAME``).

    aiayn experiment table1                      # Table 1 measured on this CPU (~3 minutes)
    aiayn experiment table3                      # Table 3 in miniature around the demo preset
    aiayn experiment heads --checkpoint runs/demo/averaged
    aiayn experiment scaling | restricted | extrapolation | low-resource

Each module builds an ``Experiment`` (its rows, report and plots) and ``runner.run_rows``
runs it resumably into ``OUT/results.json``, ``OUT/results.md`` and PNGs. Costs and the
results measured on the project's machine: docs/experiments.md.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..errors import UserError

# name -> module; every module has plan(budget, out, **inputs) -> Experiment
MODULES = {
    "table1": "table1",
    "table3": "table3",
    "scaling": "scaling",
    "restricted": "restricted",
    "extrapolation": "extrapolation",
    "low-resource": "low_resource",
    "heads": "heads",
}
TRAINING = ("table3", "scaling", "restricted", "extrapolation", "low-resource")

__all__ = ["MODULES", "TRAINING", "run_experiment"]


def run_experiment(
    name: str,
    out: Path,
    budget: Any,
    command: str = "",
    report_only: bool = False,
    seeds: int = 1,
    **inputs: Any,
) -> dict[str, Any]:
    """Plan experiment ``name`` (a ``runner.Budget``, ``inputs`` such as the corpus or the
    checkpoint) and run it into ``out`` (``report_only``: write the report of the rows
    finished so far, run none; ``seeds``: run each training row that many times, with the
    recipe's seed and the next ones). Imported lazily: the CLI lists the names cheaply."""
    from .runner import run_rows

    if name not in MODULES:
        raise UserError(f"unknown experiment {name!r}; choose one of: {', '.join(MODULES)}")
    module = importlib.import_module(f".{MODULES[name]}", __name__)
    plan = module.plan(budget, out, **inputs)
    return run_rows(plan, budget, out, command, report_only, seeds=seeds)
