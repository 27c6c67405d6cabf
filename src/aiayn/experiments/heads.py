"""Open question: what does each encoder self-attention head do? (the paper shows anecdotes:
Figures 3-5, layer 5 of 6, long-distance dependencies, anaphora, sentence structure)

    aiayn experiment heads --checkpoint runs/demo/averaged

Over the first ``sentences`` validation sentences (source through the encoder, reference
teacher-forced through the decoder), for every encoder layer and head: the share of attention
on the previous token, the next token, the token itself, punctuation, and the final eos; the
mean distance |i - j| attended over; the entropy of the weights (nats). The same figures for a
head attending evenly are the reference line. A head is named by its largest share when that
share is over a half.
The picture is the paper's: for one sentence, lines from each word to the words it attends to,
every head of the last encoder layer.
"""

from __future__ import annotations

import functools
import unicodedata
from pathlib import Path
from typing import Any

import torch

from .. import checkpoint as ckpt
from ..data.pieces import AnyVocab
from ..files import read_lines
from .inputs import recorded_valid
from .runner import Budget, Experiment, Row
from .tables import markdown_table

SHARES = ("previous", "next", "itself", "punctuation", "eos")
FIGURE_LENGTH = (10, 22)  # source pieces (eos included) of the sentence drawn


def is_punctuation(piece: str) -> bool:
    text = piece.replace("\u2581", "")  # SentencePiece's word-boundary mark
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def head_statistics(weights: torch.Tensor, punctuation: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per head sums over the queries of one sentence. weights: (h, n, n) queries x keys,
    punctuation: (n,) bool over the keys. Every value returned is (h,)."""
    n = weights.size(-1)
    i = torch.arange(n)
    distance = (i[:, None] - i[None, :]).abs().float()  # (n, n)
    return {
        "previous": weights.diagonal(offset=-1, dim1=1, dim2=2).sum(-1),  # key = query - 1
        "next": weights.diagonal(offset=1, dim1=1, dim2=2).sum(-1),  # key = query + 1
        "itself": weights.diagonal(dim1=1, dim2=2).sum(-1),
        "punctuation": weights[:, :, punctuation].sum((-1, -2)),
        "eos": weights[:, :, -1].sum(-1),
        "distance": (weights * distance).sum((-1, -2)),
        "entropy": -(weights * weights.clamp_min(1e-12).log()).sum((-1, -2)),
    }


def encoder_statistics(
    model, vocab: AnyVocab, pairs: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """One row per encoder layer: per head, the statistics averaged over every source position
    of ``pairs``. One forward per sentence serves all layers."""
    totals: list[dict[str, torch.Tensor]] = [{} for _ in range(model.cfg.N_enc)]
    uniform: dict[str, torch.Tensor] = {}  # the same statistics for a head that attends evenly
    queries = 0
    for source, reference in pairs:
        src_ids = vocab.encode_source(source, model.cfg.max_len)
        tgt_ids = [vocab.bos_id] + vocab.encode_target(reference, model.cfg.max_len)
        weights = model.attention_weights(torch.tensor([src_ids]), torch.tensor([tgt_ids]))
        punctuation = torch.tensor([is_punctuation(vocab.id_to_piece(i)) for i in src_ids])
        for layer, layer_weights in enumerate(weights["encoder self-attention"]):
            stats = head_statistics(layer_weights, punctuation)
            totals[layer] = {k: totals[layer].get(k, 0) + v for k, v in stats.items()}
        n = len(src_ids)
        even = head_statistics(torch.full((1, n, n), 1.0 / n), punctuation)
        uniform = {k: uniform.get(k, 0) + v for k, v in even.items()}
        queries += n
    rows = []
    for layer, sums in enumerate(totals):
        heads = []
        for head in range(model.cfg.h):
            means = {k: float(v[head]) / queries for k, v in sums.items()}
            top = max(SHARES, key=means.__getitem__)
            heads.append({"head": head + 1, **means, "role": top if means[top] > 0.5 else "mixed"})
        rows.append(
            {
                "layer": layer + 1,
                "sentences": len(pairs),
                "queries": queries,
                "heads": heads,
                "uniform": {k: float(v[0]) / queries for k, v in uniform.items()},
            }
        )
    return rows


def plan(budget: Budget, out: Path, checkpoint: Path, valid: tuple[Path, Path]) -> Experiment:
    model, vocab = ckpt.load_translator(checkpoint)
    cfg = model.cfg
    sources, references = read_lines(valid[0]), read_lines(valid[1])
    pairs = [(s, r) for s, r in zip(sources, references) if s.strip() and r.strip()][
        : budget.sentences
    ]
    measured: list[dict[str, Any]] = []  # every layer at once, on the first row that needs them

    def layer_row(layer: int) -> dict[str, Any]:
        if not measured:
            measured.extend(encoder_statistics(model, vocab, pairs))
        return measured[layer]

    rows = [
        Row(f"layer {layer + 1}", functools.partial(layer_row, layer)) for layer in range(cfg.N_enc)
    ]

    def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
        return [
            plot_shares(rows, out / "heads_shares.png"),
            plot_lines(model, vocab, [s for s, _ in pairs], out / "heads_lines.png"),
        ]

    return Experiment(
        name="heads",
        rows=rows,
        report=report,
        plot=plot,
        budget_keys=("sentences",),
        inputs={"checkpoint": str(checkpoint), "valid": recorded_valid(valid)},
    )


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        [r["layer"], h["head"], *(h[k] for k in SHARES), h["distance"], h["entropy"], h["role"]]
        for r in rows
        for h in r["heads"]
    ]
    even = rows[0]["uniform"]
    lines.append(
        [
            "-",
            "uniform",
            *(even[k] for k in SHARES),
            even["distance"],
            even["entropy"],
            "(reference)",
        ]
    )
    return (
        f"{rows[0]['sentences']} validation sentences, {rows[0]['queries']} source positions. Shares are the mean "
        "attention weight a query puts on that key (a query's weights sum to 1).\n\n"
        + markdown_table(
            ["layer", "head", *SHARES, "mean distance", "entropy (nats)", "role"], lines
        )
        + "\n\nThe last line is a head that spreads its attention evenly over the sentence: a share well "
        "above it is a preference, one near it none."
    )


def plot_shares(rows: list[dict[str, Any]], out: Path) -> Path:
    from ..analysis.plots import plt, save_figure

    labels = [f"L{r['layer']} H{h['head']}" for r in rows for h in r["heads"]]
    values = [[h[k] for k in SHARES] for r in rows for h in r["heads"]]
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(labels) + 1.5))
    image = ax.imshow(values, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(SHARES)), SHARES, rotation=30)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for y, row in enumerate(values):
        for x, v in enumerate(row):
            ax.text(
                x,
                y,
                f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if v < 0.6 else "black",
            )
    fig.colorbar(image, ax=ax, label="share of attention")
    ax.set_title("encoder self-attention: where each head looks")
    return save_figure(fig, out)


def plot_lines(model, vocab: AnyVocab, sources: list[str], out: Path) -> Path:
    """Figures 3-5: each word (left) joined to the words it attends to (right), line opacity
    the weight, one panel per head of the last encoder layer, for the first validation
    sentence of a readable length."""
    from ..analysis.plots import plt, save_figure

    low, high = FIGURE_LENGTH
    source = next((s for s in sources if low <= len(vocab.encode(s)) + 1 <= high), sources[0])
    ids = vocab.encode_source(source, model.cfg.max_len)
    tokens = [vocab.id_to_piece(i) for i in ids]
    weights = model.attention_weights(torch.tensor([ids]), torch.tensor([[vocab.bos_id]]))
    last = weights["encoder self-attention"][-1]  # (h, n, n)
    h, n = last.size(0), len(tokens)
    fig, axes = plt.subplots(1, h, figsize=(2.6 * h, 0.28 * n + 1), squeeze=False)
    for head, ax in enumerate(axes[0]):
        for i in range(n):
            for j in range(n):
                w = float(last[head, i, j])
                if w > 0.05:
                    ax.plot([0, 1], [i, j], color="tab:blue", alpha=min(1.0, w), lw=2 * w)
            ax.text(-0.05, i, tokens[i], ha="right", va="center", fontsize=7)
            ax.text(1.05, i, tokens[i], ha="left", va="center", fontsize=7)
        ax.set(xlim=(-0.6, 1.6), ylim=(n - 0.5, -0.5), title=f"head {head + 1}")
        ax.axis("off")
    fig.suptitle(
        f"encoder self-attention, layer {len(weights['encoder self-attention'])}: each word (left) "
        "to the words it attends to (right)",
        fontsize=9,
    )
    return save_figure(fig, out)
