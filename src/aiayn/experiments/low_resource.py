"""Open question: does the model hold up with less data? (the paper trains on 4.5M / 36M pairs)

    aiayn experiment low-resource

10, 25, 50 and 100% of the training pairs (a fixed random sample, seed 1, each a subset of the
next; the vocabulary and the validation split unchanged), the same number of updates each, so
the small rows see their data many more times: dev perplexity and BLEU against the number of
pairs.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..data.binarize import TokenDataset, read_meta, subset_dataset
from .inputs import Corpus
from .runner import Budget, Experiment, Row, repeat_name
from .tables import markdown_table
from .training import train_row, training_experiment

FRACTIONS = (0.10, 0.25, 0.50, 1.00)


def plan(budget: Budget, out: Path, corpus: Corpus) -> Experiment:
    n = len(TokenDataset(corpus.data, "train"))
    order = np.random.default_rng(1).permutation(n)

    def runner(fraction: float, k: int = 0):
        def run() -> dict[str, Any]:
            keep = np.sort(order[: max(1, round(fraction * n))])
            data = corpus.data if fraction == 1.0 else out / "data" / f"{fraction:.2f}"
            if data != corpus.data:
                subset_dataset(corpus.data, data, "train", keep)
            name = repeat_name(f"{fraction:.0%}", k) if k else f"{fraction:.0%}"
            result = train_row(out / "rows" / name, corpus, budget, {}, data=data, repeat=k)
            split = read_meta(data)["splits"]["train"]
            seen = result["tokens_per_s"] * result["train_s"]  # source + target tokens trained on
            return {
                **result,
                "fraction": fraction,
                "pairs": len(keep),
                "epochs": seen / (split["src_tokens"] + split["tgt_tokens"]),
            }

        return run

    return training_experiment(
        "low-resource",
        [Row(f"{f:.0%}", runner(f), reseed=partial(runner, f)) for f in FRACTIONS],
        corpus=corpus,
        report=report,
        plot=plot,
        baseline="100%",
    )


def report(rows: list[dict[str, Any]]) -> str:
    return markdown_table(
        ["training pairs", "share", "epochs in the budget", "dev PPL", "BLEU"],
        [[r["pairs"], r["name"], r["epochs"], r["valid_ppl"], r["bleu"]] for r in rows],
    )


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    from ..analysis.plots import plt, save_figure

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    pairs = [r["pairs"] for r in rows]
    for ax, key, label in ((axes[0], "valid_ppl", "dev perplexity"), (axes[1], "bleu", "BLEU")):
        ax.plot(pairs, [r[key] for r in rows], marker="o")
        ax.set(
            xscale="log", xlabel="training pairs", ylabel=label, title=f"{label} against data size"
        )
        ax.set_xticks(
            pairs, [f"{p:,}" for p in pairs]
        )  # one label a row (log minor labels overlap)
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    return [save_figure(fig, out / "low_resource.png")]
