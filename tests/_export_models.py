"""Seeded models for the export tests, shaped so that beam search outputs are comparable.

A freshly initialised model puts real probability on pad and bos, which our search forbids
after the softmax and CTranslate2 before it: the two then rank beams differently although the
networks agree. A trained model gives those tokens next to nothing, and so does this one:
one feature of the last decoder norm's bias is set high and the pad and bos embeddings (tied to
the output layer) strongly negative on it, so their logits are about -100. The eos row is
scaled so that eos logits swing from step to step and outputs end at varied lengths.
"""

import gzip

import torch

from aiayn import ModelConfig, Transformer
from aiayn.data import bundled_corpus_paths
from aiayn.data.vocab import BOS_ID, EOS_ID, PAD_ID


def seeded_model(
    vocab_size: int, preset: str = "tiny", init: str = "fairseq", **overrides
) -> Transformer:
    """A freshly initialised model, seed 0, in eval mode (the default init: non-zero biases in
    the attention and feed-forward layers, so an exporter that dropped one would show)."""
    torch.manual_seed(0)
    return Transformer(
        ModelConfig.preset(preset, P_drop=0.0, vocab_size=vocab_size, **overrides), init=init
    ).eval()


def trained_like_model(
    vocab_size: int, preset: str = "tiny", eos_scale: float = 4.0, **overrides
) -> Transformer:
    """``seeded_model`` with pad and bos made improbable and eos made decisive (module doc). Its
    init is "xavier": the eos scale and the lengths the tests rely on were tuned on those weights."""
    model = seeded_model(vocab_size, preset, init="xavier", **overrides)
    with torch.no_grad():
        E = model.tgt_embed.tokens.weight
        E[EOS_ID] *= eos_scale
        E[:, 0] = 0.0
        E[[PAD_ID, BOS_ID], 0] = -10.0
        norm = model.dec_norm if model.cfg.norm == "pre" else model.decoder[-1].ffn_norm
        norm.bias[0] = 10.0
    return model


def corpus_lines(split: str, side: int, n: int) -> list[str]:
    """The first ``n`` lines of the bundled corpus (side 0: English, 1: Spanish)."""
    with gzip.open(bundled_corpus_paths()[split][side], "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]
