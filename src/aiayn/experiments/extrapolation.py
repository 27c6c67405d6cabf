"""Open question: do sinusoidal positions extrapolate beyond the training lengths? (section 3.5
says they "may", untested; learned positions were "nearly identical" at trained lengths)

    aiayn experiment extrapolation

Both encodings train on the pairs whose longer side has at most L subwords, L the median of the
training split (so half of it), the same number of updates each. The validation split is then
bucketed by source length, from within L to three times L: perplexity (teacher-forced) and BLEU
(beam 4, at most ``sentences`` per bucket) per bucket. Learned positions past L never received
a gradient, so they stay at their random initialisation; sinusoids are defined everywhere.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..data import Vocab
from ..data.binarize import TokenDataset, subset_dataset
from .inputs import Corpus
from .runner import Budget, Experiment, Row, repeat_name
from .tables import markdown_table
from .training import score, train_row, training_experiment

BUCKETS = ((0.0, 1.0), (1.0, 1.5), (1.5, 2.0), (2.0, 3.0))  # source length / L


def plan(budget: Budget, out: Path, corpus: Corpus) -> Experiment:
    train = TokenDataset(corpus.data, "train")
    longest = np.maximum(train.src_lens, train.tgt_lens)
    L = int(np.median(longest))
    short = out / "data" / f"max{L}"

    def runner(positional: str, k: int = 0):
        def run() -> dict[str, Any]:
            subset_dataset(corpus.data, short, "train", np.flatnonzero(longest <= L))
            result = train_row(
                out / "rows" / (repeat_name(positional, k) if k else positional),
                corpus,
                budget,
                {"positional": positional},
                data=short,
                bleu=False,
                repeat=k,
            )
            checkpoint = Path(result.pop("checkpoint"))
            return {**result, "L": L, "buckets": buckets(checkpoint, corpus, L, budget.sentences)}

        return run

    return training_experiment(
        "extrapolation",
        [Row(p, runner(p), reseed=partial(runner, p)) for p in ("sinusoidal", "learned")],
        corpus=corpus,
        report=report,
        plot=plot,
    )


def buckets(checkpoint: Path, corpus: Corpus, L: int, limit: int) -> list[dict[str, Any]]:
    """Perplexity and BLEU of the validation pairs in each source-length bucket."""
    vocab = Vocab.load(checkpoint / "spm.model")
    sources, references = corpus.valid_pairs()
    lengths = [len(vocab.encode(s)) for s in sources]
    found = []
    for low, high in BUCKETS:
        chosen = [i for i, n in enumerate(lengths) if low * L < n <= high * L][:limit]
        if not chosen:
            continue
        result = score(
            checkpoint, [sources[i] for i in chosen], [references[i] for i in chosen], corpus.lang
        )
        found.append(
            {
                "bucket": f"({low:g}L, {high:g}L]",
                "min_len": int(low * L) + 1,
                "max_len": int(high * L),
                "sentences": len(chosen),
                "ppl": result["ppl"],
                "bleu": result["sacrebleu"],
            }
        )
    return found


def report(rows: list[dict[str, Any]]) -> str:
    L = rows[0]["L"]
    lines = [
        [
            r["name"],
            b["bucket"],
            f"{b['min_len']}-{b['max_len']}",
            b["sentences"],
            b["ppl"],
            b["bleu"],
        ]
        for r in rows
        for b in r["buckets"]
    ]
    return f"Trained on pairs of at most L = {L} subwords per side.\n\n" + markdown_table(
        ["positions", "source length", "subwords", "sentences", "PPL", "BLEU"], lines
    )


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    from ..analysis.plots import plt, save_figure

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in rows:
        labels = [b["bucket"] for b in r["buckets"]]
        for ax, key in ((axes[0], "ppl"), (axes[1], "bleu")):
            ax.plot(labels, [b[key] for b in r["buckets"]], marker="o", label=r["name"])
    for ax, label in ((axes[0], "perplexity"), (axes[1], "BLEU")):
        ax.set(
            xlabel="source length (L = longest trained)",
            ylabel=label,
            title=f"{label} by length bucket",
        )
        ax.grid(alpha=0.3)
        ax.legend()
    return [save_figure(fig, out / "extrapolation.png")]
