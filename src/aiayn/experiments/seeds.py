"""What ``aiayn experiment NAME --seeds N`` adds to a table: each row's mean and standard
deviation over its N runs (seeds: the recipe's, then + 1 ... + N - 1), and the paired test of
its difference from the baseline row.

One run per row cannot tell a change from luck: two seeds of one recipe land apart by as much
as many of the changes being measured (docs/experiments.md). Run i of a row and run i of the
baseline share their seed (initialisation and batch order, where the shapes allow), so their
difference is paired; ``aiayn.metrics.significance.paired_permutation`` tests the mean of
those differences exactly, assuming nothing about how runs spread.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..metrics.significance import paired_permutation
from .tables import markdown_table

# The measurements every training row has (BLEU unless the experiment scores it per bucket).
MEASURES = (("valid_ppl", "dev PPL"), ("bleu", "BLEU"))


def _runs(rows: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], dict[str, Any]]]:
    """Row name -> {its runs' pairing key: result}, in the table's order. Runs pair by the
    seed they trained with (a row that fixes its own seed pairs with the baseline's run of
    that seed), or by their repeat number where a result does not record its seed."""
    grouped: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for r in rows:
        key = ("seed", r["seed"]) if "seed" in r else ("repeat", r.get("repeat", 0))
        grouped.setdefault(r.get("repeat_of", r["name"]), {})[key] = r
    return grouped


def seeds_summary(rows: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Per row: its runs, and per measure their mean, sample standard deviation (None with
    one run) and, for a row other than ``baseline``, the mean paired difference from it over
    the seeds both ran, with the permutation test's p-value (None without a pair)."""
    grouped = _runs(rows)
    base = grouped.get(baseline, {})
    summary = []
    for name, runs in grouped.items():
        entry: dict[str, Any] = {"row": name, "runs": len(runs), "baseline": name == baseline}
        for key, _ in MEASURES:
            values = [r[key] for r in runs.values() if isinstance(r.get(key), (int, float))]
            if not values:
                continue
            found: dict[str, Any] = {
                "mean": statistics.fmean(values),
                "sd": statistics.stdev(values) if len(values) > 1 else None,
            }
            shared = [k for k in sorted(runs) if key in runs[k] and key in base.get(k, {})]
            if name != baseline and shared:
                ours, theirs = [runs[k][key] for k in shared], [base[k][key] for k in shared]
                found["diff"] = statistics.fmean(o - t for o, t in zip(ours, theirs))
                found["pairs"] = len(shared)
                found["p"] = paired_permutation(ours, theirs)
            entry[key] = found
        summary.append(entry)
    return summary


def seeds_report(summary: list[dict[str, Any]]) -> str:
    """The summary as a markdown table, and how to read it."""
    baseline = next((e["row"] for e in summary if e["baseline"]), None)
    measures = [(k, label) for k, label in MEASURES if any(k in e for e in summary)]
    headers = ["row", "runs"]
    for _, label in measures:
        headers += [f"{label} mean ± sd", f"{label} vs {baseline} (p)"]
    lines = []
    for e in summary:
        cells: list[Any] = [e["row"], e["runs"]]
        for key, _ in measures:
            m = e.get(key)
            cells += [_spread(m), _paired(m)] if m else [None, None]
        lines.append(cells)
    return (
        "## Over seeds\n\n"
        + markdown_table(headers, lines)
        + "\n\nEach row trained with the recipe's seed and the next ones; mean ± sample "
        f"standard deviation over its runs. vs {baseline}: the mean difference from the "
        "baseline's run with the same seed, and in brackets the two-sided p-value of the "
        "exact paired permutation test (sign flips of the differences); with n pairs it "
        "cannot go below 2 / 2^n, so 6 seeds are the fewest that can show p < 0.05."
    )


def _spread(m: dict[str, Any]) -> str:
    return f"{m['mean']:.3g}" + ("" if m["sd"] is None else f" ± {m['sd']:.2g}")


def _paired(m: dict[str, Any]) -> str | None:
    if "diff" not in m:
        return None
    return f"{m['diff']:+.3g} (p = {m['p']:.3g}, {m['pairs']} pairs)"
