"""Word alignments from the encoder-decoder attention, in Pharaoh format (``i-j``: source
word i, target word j, both from 0), as ``translate --alignments`` prints them.

The attention of output token y_t is that of the decoder step that predicted it (tgt_in =
bos y_1 .. y_{t-1}, as fairseq's ``--print-alignment``), from one decoder layer (default the
last), averaged over heads. Subwords are merged into the words that whitespace separates:
a SentencePiece piece starting with the word boundary mark begins a word. Each target word
aligns to the one source word whose subwords get the most attention mass, summed over the
target word's subwords and the source word's; the source eos is no word and is left out.
Attention is not alignment (a model may attend elsewhere when it predicts a word), so these
are a model's view, not gold alignments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..data.vocab import BOS_ID, EOS_ID
from ..errors import UserError

BOUNDARY = "\u2581"  # SentencePiece's word-start mark


def word_index(pieces: Sequence[str], boundary: str = BOUNDARY) -> list[int]:
    """The word of each piece: a piece starting with ``boundary`` (or the first) starts one."""
    words, current = [], -1
    for i, piece in enumerate(pieces):
        if i == 0 or piece.startswith(boundary):
            current += 1
        words.append(current)
    return words


def word_attention(attn: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str]) -> Tensor:
    """attn (T, S) over target and source subwords (columns past the source pieces, e.g. eos,
    are left out) -> (target words, source words), the mass summed within words."""
    src_words = torch.tensor(word_index(src_pieces), dtype=torch.long)
    tgt_words = torch.tensor(word_index(tgt_pieces), dtype=torch.long)
    attn = attn[: len(tgt_pieces), : len(src_pieces)].float().cpu()
    by_src = torch.zeros(attn.size(0), int(src_words.max()) + 1).index_add_(1, src_words, attn)
    return torch.zeros(int(tgt_words.max()) + 1, by_src.size(1)).index_add_(0, tgt_words, by_src)


def pharaoh(
    attn: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> list[tuple[int, int]]:
    """(source word, target word) for every target word, in target order; [] for an empty side."""
    if not src_pieces or not tgt_pieces:
        return []
    best = word_attention(attn, src_pieces, tgt_pieces).argmax(dim=1)  # (target words,)
    return [(int(i), j) for j, i in enumerate(best.tolist())]


def format_pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    return " ".join(f"{i}-{j}" for i, j in pairs)


def cross_attention(
    model: Any, source: Sequence[int], output: Sequence[int], layer: int = -1, bos_id: int = BOS_ID
) -> Tensor:
    """(len(output), len(source)) encoder-decoder attention of decoder ``layer`` (negative:
    from the last), averaged over heads (and over an ensemble's models) when predicting each
    output token. ``model`` is a ``Transformer`` or an ``Ensemble`` of them."""
    members = getattr(model, "models", [model])
    device = next(members[0].parameters()).device
    src = torch.tensor([list(source)], device=device)
    tgt_in = torch.tensor([[bos_id, *output[:-1]]], device=device)
    maps = []
    for m in members:
        layers = m.attention_weights(src, tgt_in)["encoder-decoder attention"]
        if not -len(layers) <= layer < len(layers):
            raise UserError(
                f"--alignment-layer {layer}: the model has {len(layers)} decoder layer(s) "
                f"(0..{len(layers) - 1}, or -1 for the last)"
            )
        maps.append(layers[layer].mean(0))  # (T, S): heads averaged
    return torch.stack(maps).mean(0)


def output_alignment(
    model: Any, source: Sequence[int], tokens: Sequence[int], tokenizer: Any, layer: int = -1
) -> str:
    """The Pharaoh pairs of one output (token ids, eos left out) given its source (subwords +
    eos), by decoder ``layer``'s attention; "" for an empty output. ``tokenizer`` names the
    pieces (``id_to_piece``) and the bos/eos ids."""
    if not tokens:
        return ""
    eos_id = getattr(tokenizer, "eos_id", EOS_ID)
    attn = cross_attention(model, source, tokens, layer, getattr(tokenizer, "bos_id", BOS_ID))
    src_pieces = [tokenizer.id_to_piece(t) for t in source if t != eos_id]
    return format_pharaoh(pharaoh(attn, src_pieces, [tokenizer.id_to_piece(t) for t in tokens]))


def alignment_error_rate(
    predicted: Sequence[Sequence[tuple[int, int]]], gold: Sequence[Sequence[tuple[int, int]]]
) -> float:
    """AER (Och and Ney 2003) with every gold link sure: 1 - 2 |A & G| / (|A| + |G|)."""
    hits = sum(len(set(a) & set(g)) for a, g in zip(predicted, gold))
    total = sum(len(set(a)) + len(set(g)) for a, g in zip(predicted, gold))
    return 1.0 - 2.0 * hits / total if total else 0.0
