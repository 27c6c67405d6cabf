"""Open question: restricted self-attention (Table 1's r), proposed but never tested.

    aiayn experiment restricted

Each query attends to the keys within r positions (``attention_window``, encoder and decoder
self-attention; encoder-decoder attention stays full), r in {1, 2, 4, 8, 16} and full, the
same number of updates each: dev perplexity, BLEU, training tokens/s and decoding speed. The
window is a mask on the full score matrix, so it does not make the fused kernel cheaper: any
speed difference here is the mask's overhead, not Table 1's O(r n d) (table1 measures that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .inputs import Corpus
from .runner import Budget, Experiment
from .tables import markdown_table
from .training import training_experiment, variant_rows

RADII: list[int | None] = [1, 2, 4, 8, 16, None]


def _name(r: int | None) -> str:
    return "full" if r is None else f"r={r}"


def plan(budget: Budget, out: Path, corpus: Corpus) -> Experiment:
    variants: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        _name(r): ({"attention_window": r}, {}) for r in RADII
    }
    return training_experiment(
        "restricted",
        variant_rows(out, budget, corpus, variants),
        corpus=corpus,
        report=report,
        plot=plot,
        baseline="full",
    )


def report(rows: list[dict[str, Any]]) -> str:
    return markdown_table(
        ["attention", "dev PPL", "BLEU", "train tokens/s", "decode sentences/s"],
        [
            [r["name"], r["valid_ppl"], r["bleu"], r["tokens_per_s"], r["decode_sent_per_s"]]
            for r in rows
        ],
    )


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    from ..analysis.plots import plt, save_figure

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [r["name"] for r in rows]
    for ax, key, label in ((axes[0], "valid_ppl", "dev perplexity"), (axes[1], "bleu", "BLEU")):
        ax.plot(range(len(rows)), [r[key] for r in rows], marker="o")
        ax.set_xticks(range(len(rows)), names)
        ax.set(xlabel="self-attention neighbourhood", ylabel=label, title=f"{label} against r")
        ax.grid(alpha=0.3)
    return [save_figure(fig, out / "restricted.png")]
