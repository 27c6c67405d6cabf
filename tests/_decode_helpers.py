"""Helpers the decoding tests share: a scripted fake model with its probability table, a seeded
tiny Transformer with sources for it, and scores compared within float noise."""

from __future__ import annotations

import math

import torch

import aiayn
from aiayn.decode import DecodeConfig

PAD, UNK, BOS, EOS, A, B_ = 0, 1, 2, 3, 4, 5


# --- a scripted fake model: next-token probabilities are a table keyed by the prefix -----------


class PrefixCache:
    """Holds each row's generated prefix; ``select`` reorders rows like ``DecoderCache``."""

    def __init__(self, rows: list[tuple[int, ...]]) -> None:
        self.rows = rows

    def select(self, rows: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        self.rows = [self.rows[i] for i in rows.tolist()]


class ScriptedModel:
    """P(next | prefix) from ``table`` (prefix = tokens after bos); counts decode steps."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab: int = 6) -> None:
        self.table, self.vocab, self.steps = table, vocab, 0

    def encode(self, src):
        return torch.zeros(src.size(0), src.size(1), 1)

    def src_mask(self, src):
        return (src != PAD)[:, None, None, :]

    def new_cache(self, memory, src_mask, max_len=None):
        assert memory.size(0) == src_mask.size(0)
        return PrefixCache([() for _ in range(memory.size(0))])

    def decode_step(self, tgt_in, cache):
        self.steps += 1
        assert len(cache.rows) == tgt_in.size(0)
        cache.rows = [
            p + tuple(x for x in row if x != BOS) for p, row in zip(cache.rows, tgt_in.tolist())
        ]
        logits = torch.full((tgt_in.size(0), self.vocab), float("-inf"))
        for r, prefix in enumerate(cache.rows):
            for tok, p in self.table[prefix].items():
                logits[r, tok] = math.log(p)
        return logits


# P(a)=.6 P(b)=.4; after a: eos .7, a .2, b .1; after b: a .9, eos .1; then eos for sure.
TABLE = {
    (): {A: 0.6, B_: 0.4},
    (A,): {EOS: 0.7, A: 0.2, B_: 0.1},
    (B_,): {A: 0.9, EOS: 0.1},
    (A, A): {EOS: 1.0},
    (A, B_): {EOS: 1.0},
    (B_, A): {EOS: 1.0},
}
SRC = torch.tensor([[7, 8, 9]])


# --- a tiny random Transformer -------------------------------------------------------------------


def tiny_model(vocab: int = 100, seed: int = 0) -> aiayn.Transformer:
    """Seeded random weights (init "xavier": the eos scale below was tuned on them)."""
    torch.manual_seed(seed)
    model = aiayn.Transformer(
        aiayn.ModelConfig.preset("tiny", vocab_size=vocab), init="xavier"
    ).eval()
    with torch.no_grad():  # make eos likely enough that sentences finish at different steps
        model.src_embed.tokens.weight[EOS] *= 6.0
    return model


def random_src(batch: int = 5, seed: int = 1, vocab: int = 100) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, 9), generator=g)
    for i in range(batch):
        src[i, 9 - i :] = PAD  # different lengths
    return src


SHORT = DecodeConfig(beam=4, alpha=0.6, max_len_a=0.5, max_len_b=8, nbest=4)


# --- scores compared within float noise, never by rounding ----------------------------------------


class Close(float):
    """A score that equals another within ``TOLERANCE``: float32 sums in another order (another
    batch shape, or AVX2, AVX-512, AMX or GPU kernels) move the last bits, and rounding to
    decimals turns that into a difference whenever a value sits near a rounding boundary."""

    TOLERANCE = 1e-4

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (int, float)):
            return NotImplemented
        return float(self) == float(other) or abs(self - other) <= self.TOLERANCE

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = float.__hash__


def hypotheses(nbest) -> list[list[tuple[tuple[int, ...], Close, int]]]:
    """(tokens, score, length) of every hypothesis of every sentence, scores as ``Close``."""
    return [[(tuple(h.tokens), Close(h.score), h.length) for h in hyps] for hyps in nbest]
