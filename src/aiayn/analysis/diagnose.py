"""Does a model read its source? Two measurements for a model that trains but translates (or
parses) the same output for every input.

``source_sensitivity``: teacher-forced perplexity of the references with their own sources,
and with the sources rotated by one sentence (each reference paired with its neighbour's
source). A model that reads its source does far worse on the rotated pairs; one that has
learnt only the target language scores the same on both.

``encoder_spread``: for each encoder layer, the mean distance of the positions' states from
their mean over the sentence, relative to the states' mean norm. Near 0, every position holds
the same vector: the encoder has collapsed and no decoder can read the sentence from it. This
is what happened to the 30-minute CPU parser (docs/parsing.md): with cross-attention still
uniform, every source position receives the same gradient, and a decoder that can lower its
loss without the source keeps pushing them all the same way.

Written here because no library measures either: both are a few forward passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..data.pieces import AnyVocab
from ..errors import UserError
from ..evaluate import eval_mode, reference_perplexity
from ..model import Transformer

__all__ = ["source_sensitivity", "encoder_spread"]


def source_sensitivity(
    model: Transformer, vocab: AnyVocab, sources: Sequence[str], references: Sequence[str]
) -> dict[str, float]:
    """Perplexity with the true sources and with the sources rotated by one sentence, and
    their ratio (rotated / true; 1.0 means the source is ignored)."""
    if len(sources) < 2:
        raise UserError("need at least two sentences to pair a reference with another source")
    true = reference_perplexity(model, vocab, sources, references)
    rotated = reference_perplexity(model, vocab, list(sources[1:]) + [sources[0]], references)
    return {"ppl_true": true, "ppl_rotated": rotated, "ratio": rotated / true}


@torch.no_grad()
def encoder_spread(model: Transformer, vocab: AnyVocab, sources: Sequence[str]) -> list[float]:
    """Per encoder layer, mean over sentences of mean_i |x_i - mean_j x_j| / mean_i |x_i|
    (positions i, j of one sentence, eos included); sentences are run one at a time, so there
    is no padding to exclude. The states are those of ``model.encode`` (its mask; the last
    layer's through the final norm: what the decoder reads), in eval mode (restored after)."""
    with eval_mode(model):
        device = next(model.parameters()).device
        totals = [0.0] * len(model.encoder)
        n = 0
        for line in sources:
            if not line.strip():
                continue
            src = torch.tensor([vocab.encode_source(line, model.cfg.max_len)], device=device)
            for i, x in enumerate(_encoder_states(model, src)):  # x: (1, S, d_model)
                deviation = (x - x.mean(dim=1, keepdim=True)).norm(dim=-1).mean()
                totals[i] += float(deviation / x.norm(dim=-1).mean())
            n += 1
    if n == 0:
        raise UserError("no non-empty source sentence")
    return [t / n for t in totals]


def _encoder_states(model: Transformer, src: torch.Tensor) -> list[torch.Tensor]:
    """The output of each encoder layer in one ``model.encode(src)``, the last one replaced by
    what ``encode`` returns (after the final norm, where there is one)."""
    states: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda _layer, _inputs, out: states.append(out))
        for layer in model.encoder
    ]
    try:
        memory = model.encode(src)
    finally:
        for hook in hooks:
            hook.remove()
    return states[:-1] + [memory]
