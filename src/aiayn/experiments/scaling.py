"""Open question: how much does dropping the 1/sqrt(d_k) scaling hurt? (no ablation in the paper)

    aiayn experiment scaling

Section 3.2.1 argues that for large d_k the dot products grow large and push the softmax into
regions of tiny gradients, hence the scaling. Four rows on the demo recipe, the same number of
updates each: scaled and unscaled attention at the base d_k (d_model / h) and at d_k = d_model
(one head), where the argument predicts the larger harm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import ModelConfig
from .inputs import Corpus
from .runner import Budget, Experiment
from .tables import markdown_table
from .training import training_experiment, variant_rows


def plan(budget: Budget, out: Path, corpus: Corpus) -> Experiment:
    base = ModelConfig.preset(budget.preset)
    variants: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for h in (base.h, 1):
        d_k = base.d_model // h
        for scaled in (True, False):
            name = f"d_k={d_k} {'scaled' if scaled else 'unscaled'}"
            variants[name] = ({"h": h, "d_k": d_k, "d_v": d_k, "scale_attention": scaled}, {})
    return training_experiment(
        "scaling",
        variant_rows(out, budget, corpus, variants),
        corpus=corpus,
        report=report,
        plot=plot,
    )


def report(rows: list[dict[str, Any]]) -> str:
    by_name = {r["name"]: r for r in rows}
    lines = []
    for r in rows:
        scaled = by_name.get(r["name"].replace("unscaled", "scaled"))
        lines.append(
            [
                r["name"],
                r["variant"]["h"],
                r["valid_ppl"],
                r["bleu"],
                r["valid_ppl"] / scaled["valid_ppl"] if scaled else None,
            ]
        )
    return (
        markdown_table(["row", "h", "dev PPL", "BLEU", "PPL / scaled PPL at the same d_k"], lines)
        + "\n\nThe paper predicts the ratio above 1, and larger at the larger d_k."
    )


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    from ..analysis.plots import plt, save_figure

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [r["name"] for r in rows]
    colors = ["tab:blue" if "unscaled" not in n else "tab:red" for n in names]
    for ax, key, label in ((axes[0], "valid_ppl", "dev perplexity"), (axes[1], "bleu", "BLEU")):
        ax.bar(range(len(rows)), [r[key] for r in rows], color=colors)
        ax.set_xticks(range(len(rows)), names, rotation=20, fontsize=8)
        ax.set(ylabel=label, title=f"{label}: scaled (blue) vs unscaled (red)")
    return [save_figure(fig, out / "scaling.png")]
