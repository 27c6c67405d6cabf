"""Forced decoding: the model's log-probability of given outputs (references, or a search's
own hypotheses), token by token.

    from aiayn.decode import score_ids
    scores = score_ids(model, sources, targets, alpha=0.6)  # targets: subword ids + eos

It runs the same decoding interface (``encode``/``src_mask``/``decode_step``) and the same
per-step log-probabilities (``beam.output_log_probs``) as the search, so it scores whatever the
search decodes with (a Transformer, an ``Ensemble``, a scripted fake) and a hypothesis scores
here what the search gave it. On a Transformer the sum equals the training loss without label
smoothing (``train.loss.label_smoothed_nll`` with eps_ls = 0) on the same pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..data.collate import pad_rows
from ..data.vocab import BOS_ID, EOS_ID, PAD_ID
from ..errors import UserError
from .beam import output_log_probs
from .cache import decode_step, new_cache
from .penalties import gnmt_length_penalty
from .request import Batching, SpecialIds
from .translate import fit_sources, length_batches, model_device, positions


@dataclass
class Score:
    """One output's log P(Y|X) (eos included when the output has one), |Y|, the GNMT score
    ``log_prob / lp(|Y|)`` the search ranks by, and log P of every token."""

    log_prob: float
    length: int
    score: float
    token_log_probs: list[float]

    @classmethod
    def of(cls, token_log_probs: list[float], alpha: float) -> Score:
        log_prob, length = math.fsum(token_log_probs), len(token_log_probs)
        return cls(log_prob, length, log_prob / gnmt_length_penalty(length, alpha), token_log_probs)

    @property
    def ppl(self) -> float:
        """exp(-log_prob / |Y|): the perplexity per subword of this one output."""
        return math.exp(-self.log_prob / self.length)


@torch.no_grad()
def force_decode(
    model: Any,
    src: Tensor,
    targets: Sequence[Sequence[int]],
    *,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> list[list[float]]:
    """src (B, S), B non-empty targets -> per target log P(y_t | y_<t, X) for each of its tokens.

    Step t feeds target token t-1 (bos first) to every row whose target is longer than t-1;
    rows whose target is complete leave the batch, as finished sentences leave the search.
    """
    B, device = src.size(0), src.device
    lengths = torch.tensor([len(t) for t in targets], device=device)  # (B,)
    tgt = pad_rows(targets, [], [], pad_id).to(device)  # (B, T)
    T = tgt.size(1)
    cache = new_cache(model, model.encode(src), model.src_mask(src), max_len=T)
    out = torch.zeros(B, T, dtype=torch.float64)
    rows = torch.arange(B, device=device)  # the targets still being fed
    step_in = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    for t in range(T):
        logits = decode_step(model, step_in, cache)
        lprobs = output_log_probs(logits, t + 1, 0, pad_id, bos_id, eos_id)  # (n, V)
        out[rows.cpu(), t] = lprobs.gather(1, tgt[rows, t, None]).squeeze(1).double().cpu()
        going = (lengths[rows] > t + 1).nonzero().squeeze(1)  # (n',) of the n rows
        if going.numel() == 0:
            break
        if going.numel() < rows.numel():
            cache.select(going, sentences=going)
            rows = rows[going]
        step_in = tgt[rows, t, None]
    return [out[i, : len(target)].tolist() for i, target in enumerate(targets)]


def score_ids(
    model: Any,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    *,
    alpha: float = 0.6,
    batching: Batching = Batching(),
    max_src_len: int | None = None,
    device: torch.device | str | None = None,
    name: str = "targets",
    ids: SpecialIds = SpecialIds(),
) -> list[Score | None]:
    """Token-id sources and targets (eos included where it belongs) -> a ``Score`` per pair,
    in input order; ``None`` for an empty source (nothing to condition on, as ``decode_ids``
    gives it no hypothesis). The model should be in eval mode (dropout off).

    Sources are batched (one row each) and truncated as ``decode_ids`` does; a target longer than the model's
    positions (``cfg.max_len``) is a ``UserError`` naming its line in ``name``.
    """
    if len(sources) != len(targets):
        raise UserError(f"{len(sources)} sources but {len(targets)} {name}")
    cap = positions(model, max_src_len)
    device = torch.device(device) if device is not None else model_device(model)
    sources = fit_sources(sources, cap, ids.eos_id)
    for i, target in enumerate(targets):
        if not target:
            raise UserError(f"{name}: line {i + 1}: an empty target (give at least eos)")
        if cap is not None and len(target) > cap:
            raise UserError(
                f"{name}: line {i + 1}: {len(target)} tokens (eos included), more than the "
                f"model's {cap} positions"
            )
    results: list[Score | None] = [None] * len(sources)
    nonempty = [i for i, s in enumerate(sources) if s]
    lengths = [max(len(sources[i]), len(targets[i])) for i in nonempty]
    for batch in length_batches(lengths, batching.batch_size, batching.tokens(rows=1)):
        members = [nonempty[j] for j in batch]
        src = pad_rows([sources[i] for i in members], [], [], ids.pad_id).to(device)
        logps = force_decode(
            model,
            src,
            [targets[i] for i in members],
            pad_id=ids.pad_id,
            bos_id=ids.bos_id,
            eos_id=ids.eos_id,
        )
        for i, token_log_probs in zip(members, logps):
            results[i] = Score.of(token_log_probs, alpha)
    return results
