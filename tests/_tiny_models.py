"""The tiny model and batch the model, runtime and decoding-cache tests share: one padded
batch, the Table 3 variants, and the model as the paper builds it or with the fast paths."""

from __future__ import annotations

import torch

from aiayn import ModelConfig, Transformer
from aiayn.runtime.kernels import use_fast_paths

PAD = 0

VARIANTS = [
    {},
    {"norm": "pre"},
    {"positional": "learned"},
    {"scale_attention": False},
    {"attention_window": 2},
    {"share_embeddings": False},
    {"h": 2, "d_k": 8, "d_v": 24},  # Table 3 row B: d_k != d_v
]


def make(seed: int = 0, *, fast: bool = False, **overrides) -> Transformer:
    """The tiny preset, seeded, in eval mode; ``fast``: with the fast paths, as training and
    decoding run it (``runtime.kernels.use_fast_paths``)."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.preset("tiny", **overrides)).eval()
    return use_fast_paths(model) if fast else model


def batch(seed: int = 1, B: int = 3, S: int = 9, T: int = 8, vocab: int = 100):
    """(src (B, S), tgt (B, T)) random ids, sentences 1 and 2 padded."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (B, S), generator=g)
    tgt = torch.randint(4, vocab, (B, T), generator=g)
    src[1, 6:] = PAD  # one padded sentence
    src[2, 4:] = PAD
    return src, tgt
