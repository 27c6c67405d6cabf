"""``aiayn compare``: is one system's output better than another's, or luck? Torch-free.

    aiayn compare runs/demo runs/demo-fp32 --ref src/aiayn/corpus/bible/test.es.gz
    aiayn compare base.hyp.es new.hyp.es --ref test.es --json

Two or more systems' outputs on one test set, the first the baseline: each system's BLEU, chrF
and TER with a 95% bootstrap interval, the p-values of each difference against the baseline
(paired bootstrap resampling and approximate randomization, ``aiayn.metrics.significance``:
sacrebleu's own tests, so its numbers are ``sacrebleu --paired-bs``'s), and how many lines
each wins, loses and ties against the baseline's by sentence chrF (or sentence BLEU).

A system is a hypothesis file, or a training run's directory (``aiayn train`` / ``aiayn
demo``) holding its test hypotheses (``test.hyp.*``, as the demo writes them). Runs add
what runs can tell: the configuration keys in which they differ (``config.json``) and a chart
of their validation curves (``log.jsonl``): perplexity and BLEU against updates and minutes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import check_not_input, read_jsonl, read_lines
from ..metrics.significance import (
    BOOTSTRAP,
    LOWER_IS_BETTER,
    METRICS,
    TRIALS,
    Significance,
    sentence_scores,
    significance,
    wins_losses,
    with_interval,
)

SENTENCE_METRICS = {"chrf": "chrF2", "bleu": "BLEU"}  # --sentence-metric -> what it is called
IGNORED_KEYS = frozenset({"out"})  # where a run was written says nothing about it


@dataclass(frozen=True)
class System:
    """One output to compare: its name (as given), its hypothesis file, its run directory."""

    name: str
    hypotheses: Path
    run: Path | None = None


def find_system(given: str) -> System:
    """A hypothesis file as it is, or a run directory and its test hypotheses."""
    path = Path(given)
    if not path.exists():
        raise UserError(f"{given}: no such file or directory")
    if not path.is_dir():
        return System(given, path)
    for needed in ("config.json", "log.jsonl"):
        if not (path / needed).is_file():
            raise UserError(f"{given} is a directory without {needed}: not a training run")
    found = sorted(path.glob("test.hyp.*"))
    if not found:
        raise UserError(
            f"{given} holds no test hypotheses (test.hyp.*): write them with "
            f"aiayn evaluate --checkpoint {path / 'averaged'} ... --output {path / 'test.hyp.LANG'}"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise UserError(f"{given} holds several test hypotheses ({names}): give the file")
    return System(given, found[0], path)


def read_systems(
    given: Sequence[str], ref_path: str | Path
) -> tuple[list[System], list[list[str]], list[str]]:
    """(the systems, their hypotheses, the references): at least two systems, each given
    once, each with exactly one line per reference line."""
    if len(given) < 2:
        raise UserError(
            f"compare needs at least 2 systems (the first is the baseline), got {len(given)}"
        )
    systems = [find_system(g) for g in given]
    seen: dict[Path, str] = {}
    for system in systems:
        key = system.hypotheses.resolve()
        if key in seen:
            raise UserError(f"{system.name} is {seen[key]} again: give each system once")
        seen[key] = system.name
    references = read_lines(ref_path)
    if not references:
        raise UserError(f"the reference file {ref_path} is empty: nothing to compare")
    outputs = []
    for system in systems:
        lines = read_lines(system.hypotheses)
        if len(lines) != len(references):
            raise UserError(
                f"{system.hypotheses} has {len(lines)} lines but {ref_path} has "
                f"{len(references)}: each output line must translate the reference's line"
            )
        outputs.append(lines)
    return systems, outputs, references


def compare(
    systems: Sequence[System],
    outputs: Sequence[Sequence[str]],
    references: Sequence[str],
    *,
    metrics: Sequence[str] = tuple(METRICS),
    sentence_metric: str = "chrf",
    bootstrap: int = BOOTSTRAP,
    trials: int = TRIALS,
) -> dict[str, Any]:
    """The comparison as plain data (what ``--json`` prints; ``format_report`` reads it)."""
    tested = significance(
        [(s.name, out) for s, out in zip(systems, outputs)],
        references,
        metrics,
        bootstrap=bootstrap,
        trials=trials,
    )
    per_line = [sentence_scores(out, references, sentence_metric) for out in outputs]
    return {
        "references": len(references),
        "baseline": systems[0].name,
        "signatures": tested.signatures,
        "lower_is_better": sorted(set(tested.signatures) & LOWER_IS_BETTER),
        "bootstrap": bootstrap,
        "trials": trials,
        "sentence_metric": SENTENCE_METRICS[sentence_metric],
        "systems": _system_records(systems, tested, per_line),
    }


def _system_records(
    systems: Sequence[System], tested: Significance, per_line: Sequence[Sequence[float]]
) -> list[dict[str, Any]]:
    """Each system's scores (with its difference from the baseline) and per-line record."""
    records = []
    for i, system in enumerate(systems):
        scores = {}
        for metric, score in tested.scores[i].items():
            scores[metric] = score.as_dict()
            if i:
                scores[metric]["delta"] = score.score - tested.scores[0][metric].score
        record: dict[str, Any] = {"name": system.name, "hypotheses": str(system.hypotheses)}
        record["scores"] = scores
        if i:
            record["sentences"] = wins_losses(per_line[i], per_line[0])
        records.append(record)
    return records


# ----------------------------------------------------------------------------------------
# Runs: what their configurations differ in, and their validation curves


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"P_drop": 0.1}}`` -> ``{"model.P_drop": 0.1}``."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(runs: Sequence[Path]) -> dict[str, list[Any]]:
    """Each ``config.json`` key (nested keys dotted) whose value is not the same in every
    run, with the value in each (None where a run lacks the key); ``out`` is left out."""
    configs = []
    for run in runs:
        try:
            configs.append(flatten(json.loads((run / "config.json").read_text(encoding="utf-8"))))
        except json.JSONDecodeError as err:
            raise UserError(f"{run / 'config.json'}: not JSON ({err})") from None
    keys = sorted({k for c in configs for k in c} - IGNORED_KEYS)
    values = {k: [c.get(k) for c in configs] for k in keys}
    return {k: v for k, v in values.items() if any(x != v[0] for x in v)}


def validation_curve(run: Path) -> list[dict[str, float]]:
    """The validations in ``run/log.jsonl``: update, minutes, perplexity, BLEU (if scored)."""
    points = []
    for record in read_jsonl(run / "log.jsonl"):
        if "valid_ppl" in record:
            point = {"update": record["update"], "minutes": record["elapsed_s"] / 60}
            point["ppl"] = record["valid_ppl"]
            if "valid_bleu" in record:
                point["bleu"] = record["valid_bleu"]
            points.append(point)
    return points


def plot_curves(curves: dict[str, list[dict[str, float]]], out: Path) -> Path:
    """One chart, written atomically: validation perplexity (top) and BLEU (bottom) against
    updates (left) and training minutes (right), one line a run."""
    from .plots import plt, save_figure  # the one way a figure is written (and torch with it)

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), squeeze=False)
    for name, points in curves.items():
        for row, key in enumerate(("ppl", "bleu")):
            for col, x in enumerate(("update", "minutes")):
                xy = [(p[x], p[key]) for p in points if key in p]
                if xy:
                    axes[row][col].plot(*zip(*xy), marker="o", ms=3, label=name)
    for col, x in enumerate(("updates", "training minutes")):
        axes[0][col].set(xlabel=x, ylabel="perplexity / subword", yscale="log")
        axes[1][col].set(xlabel=x, ylabel="SacreBLEU (valid subset)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle("validation curves (log.jsonl)")
    return save_figure(fig, out)


def compare_runs(
    systems: Sequence[System], chart: Path | None, inputs: Sequence[Path]
) -> dict[str, Any]:
    """What the runs among ``systems`` add: their configuration differences (two runs or
    more) and, when ``chart`` is given, the chart of their validation curves (never written
    over one of the ``inputs``)."""
    runs = {s.name: s.run for s in systems if s.run is not None}
    if chart is not None and not runs:
        raise UserError("--chart draws runs' validation curves: give run directories")
    found: dict[str, Any] = {"runs": list(runs)}
    if len(runs) > 1:
        found["differences"] = config_differences(list(runs.values()))
    if chart is not None:
        check_not_input(chart, inputs, option="--chart")
        curves = {name: validation_curve(run) for name, run in runs.items()}
        if not any(curves.values()):
            raise UserError(f"no validation in the logs of {', '.join(runs)}: nothing to draw")
        found["chart"] = str(plot_curves(curves, chart))
    return found


# ----------------------------------------------------------------------------------------
# The readable report


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def _score_rows(report: dict[str, Any]) -> list[list[str]]:
    """A line of scores per system (score, then bootstrap mean ± half-width), and under each
    system but the baseline its difference and p-values (bootstrap / AR); * when both < 0.05."""
    metrics = list(report["signatures"])
    header = ["system", *(f"{m} (lower is better)" if m in LOWER_IS_BETTER else m for m in metrics)]
    rows = [header]
    for system in report["systems"]:
        scores = system["scores"]
        rows.append([system["name"]] + [with_interval(s) for s in scores.values()])
        if "sentences" in system:
            rows.append(["  vs baseline"] + [_difference(scores[m]) for m in metrics])
    return rows


def _difference(score: dict[str, Any]) -> str:
    star = " *" if max(score["p_bootstrap"], score["p_ar"]) < 0.05 else ""
    return f"{score['delta']:+.2f} p = {score['p_bootstrap']:.4f} / {score['p_ar']:.4f}{star}"


def format_report(report: dict[str, Any]) -> str:
    """The comparison as a table a person reads (``compare``'s data, with ``compare_runs``'s
    under ``"runs"`` when runs were given)."""
    lines = [
        f"{len(report['systems'])} systems on {report['references']:,} reference lines; "
        f"baseline: {report['baseline']}",
        f"score (mean ± half-width of sacrebleu's 95% bootstrap interval, "
        f"{report['bootstrap']} resamples)",
        f"p: paired bootstrap resampling ({report['bootstrap']} resamples) / approximate "
        f"randomization ({report['trials']} trials) against the baseline; * both below 0.05",
        "",
        *_columns(_score_rows(report)),
        "",
        f"lines against the baseline's, by sentence {report['sentence_metric']}: "
        "wins / losses / ties",
        *_columns(
            [
                [s["name"], " / ".join(str(s["sentences"][k]) for k in ("wins", "losses", "ties"))]
                for s in report["systems"][1:]
            ]
        ),
        "",
        "signatures:",
        *_columns([["  " + m, sig] for m, sig in report["signatures"].items()]),
    ]
    runs = report.get("runs", {})
    if "differences" in runs:
        lines += ["", "the runs' configurations differ in (config.json):"]
        if runs["differences"]:
            rows = [["  key", *runs["runs"]]]
            rows += [["  " + k, *map(_cell, v)] for k, v in runs["differences"].items()]
            lines += _columns(rows)
        else:
            lines += ["  nothing: the same configuration (another seed would show here)"]
    if "chart" in runs:
        lines += ["", f"validation curves: {runs['chart']}"]
    elif runs.get("runs"):
        lines += ["", "(--chart FILE.png draws the runs' validation curves)"]
    return "\n".join(lines)


def _cell(value: Any, width: int = 40) -> str:
    """A configuration value in a table cell: JSON, long text cut short (--json has it whole)."""
    text = "-" if value is None else json.dumps(value, ensure_ascii=False).strip('"')
    return text if len(text) <= width else text[: width - 3] + "..."
