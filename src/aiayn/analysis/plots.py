"""Pictures: training curves, and attention maps in the style of the paper's Figures 3-5
(one panel per head, one figure per layer, source/target tokens on the axes)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from ..files import atomic_file, read_jsonl  # noqa: E402
from ..model import Transformer  # noqa: E402


def save_figure(fig, path: Path) -> Path:
    """Render to a temporary file, then rename: a crash never leaves a half-written PNG."""
    try:
        with atomic_file(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def plot_training(
    log_path: Path, out: Path, bleu_points: Sequence[tuple[float, float]] = ()
) -> Path:
    """Training loss and validation perplexity against minutes, and BLEU per checkpoint:
    ``bleu_points`` (minutes, BLEU) if given, else the validation BLEU the log holds
    (training with ``valid_bleu_sentences``)."""
    records = read_jsonl(log_path)
    train = [(r["elapsed_s"] / 60, r["loss"]) for r in records if "loss" in r]
    valid = [(r["elapsed_s"] / 60, r["valid_ppl"]) for r in records if "valid_ppl" in r]
    if not bleu_points:
        bleu_points = [(r["elapsed_s"] / 60, r["valid_bleu"]) for r in records if "valid_bleu" in r]
    panels = 3 if bleu_points else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6))
    if train:
        axes[0].plot(*zip(*train), lw=1)
    axes[0].set(
        xlabel="training minutes", ylabel="label-smoothed loss / token", title="training loss"
    )
    if valid:
        axes[1].plot(*zip(*valid), marker="o")
        axes[1].set_yscale("log")
    axes[1].set(
        xlabel="training minutes", ylabel="perplexity / subword", title="validation perplexity"
    )
    if bleu_points:
        axes[2].plot(*zip(*bleu_points), marker="o", color="tab:green")
        axes[2].set(
            xlabel="training minutes",
            ylabel="SacreBLEU",
            title="BLEU per checkpoint (valid subset)",
        )
    for ax in axes:
        ax.grid(alpha=0.3)
    return save_figure(fig, out)


def plot_attention(
    weights: torch.Tensor, queries: Sequence[str], keys: Sequence[str], title: str, out: Path
) -> Path:
    """One layer's heads side by side: rows are queries, columns keys (Figures 3-5)."""
    h = weights.size(0)
    cols = min(h, 4)
    rows = (h + cols - 1) // cols
    size = min(8.0, max(2.5, 0.22 * max(len(queries), len(keys))))
    # the heads share both axes: tokens are labelled on the outer panels only, once a row or
    # column rather than once a head (the labels are most of the drawing time)
    fig, axes = plt.subplots(
        rows, cols, figsize=(size * cols, size * rows), squeeze=False, sharex=True, sharey=True
    )
    axes[0, 0].set_xticks(range(len(keys)), keys)
    axes[0, 0].set_yticks(range(len(queries)), queries)
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        ax.imshow(weights[i].cpu().numpy(), cmap="viridis", vmin=0.0, aspect="auto")
        ax.set_title(f"head {i + 1}", fontsize=9)
        ax.tick_params(axis="x", labelrotation=90, labelsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.label_outer()
    fig.suptitle(title)
    return save_figure(fig, out)


def attention_maps(
    model: Transformer, vocab, source: str, target: str, out_dir: Path, name: str
) -> list[Path]:
    """PNG per attention kind and layer for one sentence pair (e.g. a source and its translation)."""
    src_ids = vocab.encode_source(source, model.cfg.max_len)
    tgt_ids = [vocab.bos_id] + vocab.encode_target(target, model.cfg.max_len)
    src_tokens = [vocab.id_to_piece(i) for i in src_ids]
    tgt_tokens = [vocab.id_to_piece(i) for i in tgt_ids]
    device = next(model.parameters()).device
    weights = model.attention_weights(
        torch.tensor([src_ids], device=device), torch.tensor([tgt_ids], device=device)
    )
    axes = {
        "encoder self-attention": ("enc_self", src_tokens, src_tokens),
        "decoder self-attention": ("dec_self", tgt_tokens, tgt_tokens),
        "encoder-decoder attention": ("enc_dec", tgt_tokens, src_tokens),
    }
    paths = []
    for kind, layers in weights.items():
        slug, queries, keys = axes[kind]
        for layer, w in enumerate(layers, start=1):
            paths.append(
                plot_attention(
                    w,
                    queries,
                    keys,
                    f"{kind}, layer {layer}: {name}",
                    out_dir / f"{name}_{slug}_layer{layer}.png",
                )
            )
    return paths
