"""What every experiment shares: a typed budget, resumable rows, progress bars, the report.

An experiment is a list of rows (a model trained and scored, a sequence length measured ...).
``run_rows`` runs the rows not yet in ``OUT/results.json``, saving the file after each one,
so an interrupted run continues where it stopped and a finished row is never recomputed.
Several processes may fill one table (one per GPU or core, the same command): each row is
claimed with an exclusive lock on ``OUT/locks/ROW`` (the OS releases it when the process ends,
so a crashed row is taken by the next run), a process skips the rows another one holds, and
results.json is re-read and merged under its own lock before every write.
One tqdm bar counts the rows (its ETA is weighted by each row's estimated cost); a row that
trains shows the trainer's own bar beneath it. At the end it writes ``OUT/results.md`` (the
experiment's table) and its PNG plots. Written by hand because no library runs resumable
experiment tables this small (hydra/optuna sweep parameters; they do not write a paper table).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..config import with_overrides
from ..errors import UserError
from ..files import exclusive_lock, write_text_atomic
from .seeds import seeds_report, seeds_summary


@dataclass
class Budget:
    """How much an experiment may spend. Defaults size the full runs for 2 CPU cores;
    ``--budget key=value`` changes any field (the tests use ``preset=tiny updates=2``)."""

    preset: str = "demo"  # the base model every training row changes (config.PRESETS)
    updates: int = 1000  # per row, the same for every row (as Table 3); cost: docs/experiments.md
    sentences: int = 200  # validation sentences decoded for BLEU per row (beam 4)
    max_tokens: int = 1024  # source (and target) tokens per batch: the demo's batches
    seconds: float = 180.0  # table1: wall-clock budget for all sequence lengths
    threads: int = (
        2  # CPU threads (table1 on a shared machine: 1, or spin-waiting threads distort it)
    )

    def __post_init__(self) -> None:  # read_budget names "--budget" before these messages
        for name in ("updates", "sentences", "max_tokens", "threads"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):  # nan > 0 is False too
            raise UserError(f"seconds must be a positive, finite number, got {self.seconds}")


def read_budget(assignments: Sequence[str]) -> Budget:
    """``["updates=600", "preset=tiny"]`` -> Budget, every key and value type-checked."""
    return with_overrides(Budget(), list(assignments), where="--budget")


@dataclass
class Row:
    """One line of an experiment's table: ``run()`` returns its measurements, or None when
    the budget is spent (the row is left for a rerun with a larger budget).

    ``reseed(k)``: the same row's run with the recipe's seed plus k (k >= 1), for ``--seeds``
    (None: a row that trains nothing, or fixes its own seed, runs once). A repeat names the
    row it repeats (``repeat_of``) and its k (``repeat``)."""

    name: str
    run: Callable[[], dict[str, Any] | None]
    cost: float = 1.0  # relative cost estimate: weights the overall ETA
    reseed: Callable[[int], Callable[[], dict[str, Any] | None]] | None = None
    repeat_of: str | None = None
    repeat: int = 0


def repeat_name(name: str, k: int) -> str:
    """The name (and directory) of row ``name``'s run with the recipe's seed plus ``k``."""
    return f"{name} seed+{k}"


@dataclass
class Experiment:
    """Rows, and how to turn their results into a markdown report and plots."""

    name: str
    rows: list[Row]
    report: Callable[[list[dict[str, Any]]], str]  # markdown below the title
    plot: Callable[[list[dict[str, Any]], Path], list[Path]]
    budget_keys: tuple[str, ...]  # the Budget fields a finished row's numbers depend on
    inputs: dict[str, Any] = field(default_factory=dict)  # data, checkpoint ...: recorded
    baseline: str | None = None  # the row --seeds tests the others against (None: the first)


def with_seeds(experiment: Experiment, seeds: int) -> Experiment:
    """``experiment`` with each row that can be reseeded run ``seeds`` times: the row itself
    (the recipe's seed), then its repeats with seed + 1 ... + seeds - 1, each its own row,
    so that a rerun resumes them and a larger ``seeds`` adds to the ones measured."""
    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")
    if seeds == 1:
        return experiment
    if not any(row.reseed for row in experiment.rows):
        raise UserError(
            f"experiment {experiment.name} has no row to repeat with other seeds "
            "(its rows train nothing): --seeds needs a training experiment"
        )
    rows = []
    for row in experiment.rows:
        rows.append(row)
        for k in range(1, seeds if row.reseed is not None else 1):
            assert row.reseed is not None
            name = repeat_name(row.name, k)
            rows.append(Row(name, row.reseed(k), row.cost, repeat_of=row.name, repeat=k))
    return dataclasses.replace(experiment, rows=rows)


def run_rows(
    experiment: Experiment,
    budget: Budget,
    out: Path,
    command: str = "",
    report_only: bool = False,
    seeds: int = 1,
) -> dict[str, Any]:
    """Run the rows missing from ``out/results.json`` that no other process holds (none when
    ``report_only``: a look at a table still being filled), each ``seeds`` times where it can
    be (``with_seeds``); write results.json/.md and plots (of every row finished so far, by
    any process)."""
    planned = experiment
    experiment = with_seeds(experiment, seeds)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    relevant = {k: getattr(budget, k) for k in experiment.budget_keys}
    with exclusive_lock(out / "locks" / "results.json"):
        results = _load(path, experiment, relevant)
    total = sum(row.cost for row in experiment.rows)
    bar = tqdm(
        total=total,
        initial=sum(row.cost for row in experiment.rows if _finished(results, row.name)),
        unit="row-cost",
        desc=experiment.name,
        dynamic_ncols=True,
        file=sys.stderr,
        disable=report_only,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| elapsed {elapsed}, ETA {remaining}",
    )
    for row in [] if report_only else experiment.rows:
        if _finished(results, row.name):
            continue
        with exclusive_lock(out / "locks" / row.name, wait=False) as mine:
            if not mine:  # another process is running this row
                continue
            with exclusive_lock(out / "locks" / "results.json"):
                results = _load(path, experiment, relevant)  # it may have been finished meanwhile
            if _finished(results, row.name):
                continue
            bar.set_description(f"{experiment.name} [{row.name}]")
            start = time.monotonic()
            measured = row.run()
            if measured is None:  # out of budget: stop here, a rerun continues
                break
            finished = {"name": row.name, **measured, "wall_s": time.monotonic() - start}
            if row.repeat_of is not None:
                finished |= {"repeat_of": row.repeat_of, "repeat": row.repeat}
            with exclusive_lock(out / "locks" / "results.json"):
                results = _merge(_load(path, experiment, relevant), finished, experiment)
                write_text_atomic(path, json.dumps(results, indent=2, ensure_ascii=False))
        bar.update(row.cost)
    bar.close()
    return _write_report(planned, out, relevant, command)


def _write_report(
    experiment: Experiment, out: Path, relevant: dict[str, Any], command: str
) -> dict[str, Any]:
    """results.md and the plots from the rows in results.json: the experiment's own report
    and plots of each row's first run, then the seeds' table when there are repeats (those
    of an earlier ``--seeds`` too: a rerun with fewer seeds keeps and reports them)."""
    path = out / "results.json"
    with exclusive_lock(out / "locks" / "results.json"):
        results = _load(path, experiment, relevant)
        rows = results["rows"]
        firsts = [r for r in rows if "repeat_of" not in r]
        repeats = len(rows) - len(firsts)
        header = (
            f"# {experiment.name}\n\n{_date()}; command: `{command or 'aiayn experiment ' + experiment.name}`; "
            f"budget: {', '.join(f'{k}={v}' for k, v in relevant.items())}; "
            f"{len(firsts)} of {len(experiment.rows)} rows"
            + (f", and {repeats} repeats with other seeds" if repeats else "")
            + ".\n\n"
        )
        body = experiment.report(firsts) if firsts else "No row fitted in the budget yet."
        if repeats:
            results["seeds"] = seeds_summary(rows, experiment.baseline or experiment.rows[0].name)
            body += "\n\n" + seeds_report(results["seeds"])
        write_text_atomic(out / "results.md", header + body + "\n")
        results["plots"] = [p.name for p in experiment.plot(firsts, out)] if firsts else []
        write_text_atomic(path, json.dumps(results, indent=2, ensure_ascii=False))
    return results


def _finished(results: dict[str, Any], name: str) -> bool:
    return any(r["name"] == name for r in results["rows"])


def _merge(
    results: dict[str, Any], finished: dict[str, Any], experiment: Experiment
) -> dict[str, Any]:
    """``results`` with ``finished`` added, rows in the experiment's order, each row's repeats
    after it by seed. The repeats of a planned row are kept even when this run does not plan
    them (they were measured with a larger ``--seeds``)."""
    done = {r["name"]: r for r in results["rows"]} | {finished["name"]: finished}
    order = {row.name: i for i, row in enumerate(experiment.rows)}
    kept = [r for r in done.values() if r.get("repeat_of", r["name"]) in order]
    return {
        **results,
        "rows": sorted(
            kept, key=lambda r: (order[r.get("repeat_of", r["name"])], r.get("repeat", 0))
        ),
    }


def _load(path: Path, experiment: Experiment, relevant: dict[str, Any]) -> dict[str, Any]:
    """Earlier results of the same experiment with the same budget, or a fresh record."""
    fresh = {
        "experiment": experiment.name,
        "budget": relevant,
        "inputs": _plain(experiment.inputs),
        "started": _date(),
        "rows": [],
    }
    if not path.exists():
        return fresh
    old = json.loads(path.read_text(encoding="utf-8"))
    if old.get("experiment") != experiment.name:
        raise UserError(
            f"{path} holds experiment {old.get('experiment')!r}, not {experiment.name!r}: "
            "choose another --out"
        )
    for key, saved in (("budget", relevant), ("inputs", _plain(experiment.inputs))):
        if old.get(key) != saved:
            raise UserError(
                f"{path} was measured with {key} {old.get(key)}, now {saved}: "
                "rerun with the same values or choose another --out"
            )
    return old


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(values, default=str))


def _date() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
