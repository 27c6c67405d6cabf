"""Sampling (not in the paper; for back-translation, Edunov et al. 2018): each output token is
drawn from the model's next-token distribution, sharpened or flattened by a temperature and
cut to the ``top_k`` most probable tokens and to the smallest set whose probability reaches
``top_p`` (nucleus sampling).

Reproducible: every source sentence has its own random stream, seeded from (seed, the
sentence's index in the input), and its samples draw from it in a fixed order, so the random
numbers a sentence uses never depend on the batch it is decoded in nor on the sentences around
it. The probabilities they draw from do, in the last bits (padding and the batch's shape change
the rounding of the model's matrix products): another batching changes a sample where a draw
falls within that noise of the boundary between two tokens, rarely. The same batching gives
the same samples bit for bit, and a batch of one sentence (``batch_size=1``) makes a
sentence's samples its own whatever the other inputs (docs/decoding.md). Each of its
``samples`` outputs is a row of its own in the batch (the cache's memory repeated), so that a
finished sample leaves at once.

Scores are the model's: ``log_prob`` is log P(Y|X) at temperature 1 without the cuts (what
forced decoding gives the output), and ``score`` is ``log_prob / lp(|Y|)`` as for beam search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..data.vocab import BOS_ID, EOS_ID, PAD_ID
from ..errors import UserError, UserTypeError
from .beam import NEG_INF, Hypothesis, output_log_probs
from .cache import decode_step, new_cache
from .config import DecodeConfig
from .constraints import Constraint, advance_states, constrain, constraint_states
from .penalties import gnmt_length_penalty
from .repetition import guard_repetition


@dataclass(frozen=True)
class SampleConfig:
    """``samples`` outputs per source; ``top_k`` 0 and ``top_p`` 1 cut nothing."""

    samples: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name, kind in (("samples", int), ("top_k", int), ("seed", int)):
            _check_type(name, getattr(self, name), kind)
        for name in ("temperature", "top_p"):
            _check_type(name, getattr(self, name), (int, float))
        if self.samples < 1:
            raise UserError(f"samples per source must be >= 1, got {self.samples}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise UserError(f"temperature must be a finite number > 0, got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"top-k must be >= 0 (0: no cut), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.seed < 0:  # numpy's SeedSequence, which makes the streams, takes none
            raise UserError(f"seed must be >= 0, got {self.seed}")


def _check_type(name: str, value: object, kind: type | tuple[type, ...]) -> None:
    """A one-line ``UserTypeError`` for a setting of the wrong type (a bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, kind):
        wanted = "an integer" if kind is int else "a number"
        raise UserTypeError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")


def sentence_generator(seed: int, index: int) -> torch.Generator:
    """The random stream of input sentence ``index`` (a CPU generator on every device)."""
    state = np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def sampling_log_weights(lprobs: Tensor, config: SampleConfig) -> Tensor:
    """(rows, V) log-probabilities -> unnormalised log-weights of the sampling distribution:
    divided by the temperature, -inf outside the top k and outside the top-p nucleus (the
    most probable token always stays; tokens tied with the k-th stay too)."""
    x = lprobs / config.temperature
    if 0 < config.top_k < x.size(-1):
        kth = x.topk(config.top_k, dim=-1).values[:, -1:]  # (rows, 1)
        x = x.masked_fill(x < kth, NEG_INF)
    if config.top_p < 1:
        probs = torch.softmax(x, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
        outside = (sorted_p.cumsum(-1) - sorted_p) >= config.top_p  # the set already reached p
        x = x.masked_fill(outside.scatter(1, order, outside), NEG_INF)
    return x


def draw(log_weights: Tensor, uniforms: Tensor) -> Tensor:
    """(rows, V) log-weights, (rows,) uniforms in [0, 1) -> (rows,) tokens by the inverse CDF."""
    cdf = torch.softmax(log_weights.double(), dim=-1).cumsum(-1)  # (rows, V)
    u = (uniforms.double() * cdf[:, -1]).unsqueeze(1)
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.size(1) - 1)


@torch.no_grad()
def sample(
    model: Any,
    src: Tensor,
    config: DecodeConfig,
    sampling: SampleConfig,
    *,
    indices: Sequence[int],
    min_len: int = 0,
    max_len_cap: int | None = None,
    constraint: Constraint | Sequence[Constraint | None] | None = None,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> list[list[Hypothesis]]:
    """src (B, S) -> per sentence its ``sampling.samples`` samples, best score first.

    ``indices`` (B,): each sentence's index in the input, for its random stream. ``config``
    gives the length limit and the length penalty alpha (for ``score``); ``min_len``,
    ``max_len_cap`` and ``constraint`` are as in ``beam_search``. Row r = sentence * N + j
    holds sample j (N = ``sampling.samples``); every row is its own "sentence" of one beam.
    """
    B, N, device = src.size(0), sampling.samples, src.device
    mask = model.src_mask(src)
    max_lens = config.max_len(mask.reshape(B, -1).sum(-1), max_len_cap).repeat_interleave(N)
    T = int(max_lens.max())
    cache = new_cache(model, model.encode(src), mask, max_len=T)
    copies = torch.arange(B, device=device).repeat_interleave(N)  # (B*N,) each row's sentence
    cache.select(copies, sentences=copies)  # every sample a row and "sentence" of its own
    generators = [sentence_generator(sampling.seed, i) for i in indices]
    if isinstance(constraint, Sequence):  # one per sentence -> one per row (its N samples)
        constraint = [c for c in constraint for _ in range(N)]
    states = constraint_states(constraint, src.repeat_interleave(N, dim=0), max_lens, pad_id)
    rows = torch.arange(B * N, device=device)  # the original row of each live row
    log_prob = torch.zeros(B * N, dtype=torch.float64, device=device)
    tokens = torch.empty(B * N, 0, dtype=torch.long, device=device)
    step_in = torch.full((B * N, 1), bos_id, dtype=torch.long, device=device)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(1, T + 1):
        logits = decode_step(model, step_in, cache)
        lprobs = output_log_probs(logits, t, min_len, pad_id, bos_id, eos_id)  # (n, V)
        if states is not None:
            lprobs = constrain(lprobs, [c.allowed(s) for c, s in states])
        lprobs = guard_repetition(lprobs, tokens, config)  # as it is unless asked
        tok = draw(sampling_log_weights(lprobs, sampling), _uniforms(generators, rows, N))
        log_prob += lprobs.gather(1, tok[:, None]).squeeze(1).double()
        tokens = torch.cat([tokens, tok[:, None]], dim=1)  # (n, t)
        done = (tok == eos_id) | (max_lens[rows] <= t)
        lp_t = gnmt_length_penalty(t, config.alpha)
        for r in done.nonzero().squeeze(1).tolist():
            out, lp = tokens[r].tolist(), float(log_prob[r])
            out = out[:-1] if out[-1] == eos_id else out
            results[int(rows[r]) // N].append(Hypothesis(out, lp / lp_t, lp, t))
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        states = advance_states(states, keep, tok[keep])
        rows, log_prob, tokens = rows[keep], log_prob[keep], tokens[keep]
        cache.select(keep, sentences=keep)
        step_in = tokens[:, -1:]
    return [sorted(hyps, key=lambda h: -h.score) for hyps in results]  # ties: as drawn


def _uniforms(generators: Sequence[torch.Generator], rows: Tensor, n: int) -> Tensor:
    """One uniform per live row: every sentence with a live sample draws n values (one per
    sample, live or not) from its own stream, so its draws depend on it alone."""
    rows_cpu = rows.cpu()
    sentences = torch.unique_consecutive(rows_cpu // n).tolist()
    draws = {s: torch.rand(n, generator=generators[s], dtype=torch.float64) for s in sentences}
    u = torch.stack([draws[int(r) // n][int(r) % n] for r in rows_cpu])
    return u.to(rows.device)
