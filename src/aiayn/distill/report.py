"""Teacher and student side by side: both decode the test split as ``aiayn evaluate`` does
(fp32, the same threads and workers), scored with intervals, tested against each other
(paired bootstrap and approximate randomization) and the difference given with its own
interval; then the speed grid (``distill.speed``) and the size on disk, as records."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..metrics.significance import paired_difference, significance, with_interval
from ..records import make_record, write_record
from ..translator import Translator
from .speed import size_on_disk, speed_grid

METRICS = ("bleu", "chrf")


def side_by_side(
    models: dict[str, Sequence[Path]],
    test: tuple[list[str], list[str]],
    out: Path,
    shortlist: Path,
    *,
    lang: str | None,
    speed: int,
    bars: bool = False,
) -> dict[str, Any]:
    """The report's evaluation of ``models`` ("teacher" first, then "student"; name -> its
    checkpoints) on ``test`` (sources, references); their hypotheses go to
    ``out/test.NAME.hyp``, and the first ``speed`` sentences make the speed grid."""
    sources, references = test
    evaluated, hyps = {}, []
    for name, checkpoints in models.items():
        with Translator(list(checkpoints), precision="fp32") as translator:
            found = translator.evaluate(
                sources, references, lang=lang, progress=bars, hyp_path=out / f"test.{name}.hyp"
            )
        evaluated[name] = found.as_dict()
        hyps.append((name, found.hypotheses))
    tested = significance(hyps, references, METRICS)
    student = tested.scores[1]
    teacher_s, student_s = (evaluated[name]["decode_s"] for name in models)
    grid = speed_grid(models, sources[:speed], references[:speed], shortlist)
    return {
        "test": evaluated,
        "paired": {m: {"p_bootstrap": s.p_bootstrap, "p_ar": s.p_ar} for m, s in student.items()},
        "difference": {
            m: paired_difference(hyps[0][1], hyps[1][1], references, m).as_dict() for m in METRICS
        },
        "speed_up": teacher_s / student_s if student_s > 0 else 0.0,
        "speed": [t.as_dict() for t in grid],
        "speed_sentences": min(speed, len(sources)),
        "sizes": {
            name: dict(zip(("bytes", "parameters"), size_on_disk(checkpoints)))
            for name, checkpoints in models.items()
        },
    }


def _signed(score: dict[str, float]) -> str:
    return f"{score['score']:+.2f} ({score['mean']:+.2f} ± {score['ci']:.2f})"


def summary_figures(report: dict[str, Any]) -> dict[str, float | int | str]:
    """The run's headline: the difference in SacreBLEU with its interval, the speed-up on the
    test split, each side's scores, the paired p-value, the corpus and the student's cost."""
    t, s = report["test"]["teacher"], report["test"]["student"]
    return {
        "student - teacher SacreBLEU": _signed(report["difference"]["bleu"]),
        "speed-up": f"{report['speed_up']:.2f}x",
        "teacher SacreBLEU": with_interval(t["intervals"]["BLEU"]),
        "student SacreBLEU": with_interval(s["intervals"]["BLEU"]),
        "student - teacher chrF2": _signed(report["difference"]["chrf"]),
        "teacher chrF2": with_interval(t["intervals"]["chrF2"]),
        "student chrF2": with_interval(s["intervals"]["chrF2"]),
        "p (paired bootstrap)": round(report["paired"]["BLEU"]["p_bootstrap"], 4),
        "teacher sentences/s": round(t["sentences_per_s"], 2),
        "student sentences/s": round(s["sentences_per_s"], 2),
        "distilled pairs": report["distilled"]["kept"],
        "student updates": report["training"]["updates"],
        "end to end": f"{report['end_to_end_s'] / 60:.1f} min",
    }


def _forms(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, float | int | str]]:
    """Each (model, form)'s figures across the threads of the speed grid."""
    rows: dict[tuple[str, str], dict[str, float | int | str]] = {}
    for timed in report["speed"]:
        row = rows.setdefault((timed["model"], timed["form"]), {})
        threads = "thread" if timed["threads"] == 1 else "threads"
        row[f"sentences/s, {timed['threads']} {threads}"] = round(timed["sentences_per_s"], 2)
        row["SacreBLEU"], row["chrF2"] = round(timed["bleu"], 2), round(timed["chrf"], 2)
    for (model, _), row in rows.items():
        size = report["sizes"][model]
        row["size"] = f"{size['bytes'] / 1e6:.1f} MB"
        row["parameters"] = f"{size['parameters'] / 1e6:.2f}M"
    return rows


def write_records(report: dict[str, Any], directory: Path) -> list[Path]:
    """The run's records: its summary, and a row for each model in each form (the trade-off
    table of docs/distill.md)."""
    name = f"`{report['student']['preset']}` student of {report['teacher_label']}"
    n, k = report["test"]["teacher"]["sentences"], report["speed_sentences"]
    summary = make_record(
        topic="distill",
        what=f"distilled {name}: test split of {n:,} sentences, fp32",
        figures=summary_figures(report),
        command=report["command"],
        threads=torch.get_num_threads(),
        notes=f"counts of the filter: {report['distilled']}",
    )
    paths = [write_record(summary, directory)]
    for (model, form), figures in _forms(report).items():
        row = make_record(
            topic="distill",
            what=f"distilled {name}: the {model}, {form}",
            figures=figures,
            command=report["command"],
            threads=max(t["threads"] for t in report["speed"]),
            notes=f"the first {k:,} test sentences; --workers auto (a process a thread)",
        )
        paths.append(write_record(row, directory))
    return paths
