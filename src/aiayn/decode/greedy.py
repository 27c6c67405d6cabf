"""Greedy decoding: the most probable next token at every step, until eos or the length limit.

Same interface and output as ``beam_search`` (a ``Hypothesis`` per sentence, scored with the GNMT
penalty of ``config.alpha``); sentences that reach eos leave the batch through ``cache.select``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .beam import Hypothesis, output_log_probs
from .config import DecodeConfig
from .penalties import gnmt_length_penalty


@torch.no_grad()
def greedy_search(
    model: Any,
    src: Tensor,
    config: DecodeConfig = DecodeConfig(beam=1),
    *,
    min_len: int = 0,
    max_len_cap: int | None = None,
    pad_id: int = 0,
    bos_id: int = 2,
    eos_id: int = 3,
) -> list[Hypothesis]:
    """src (B, S) -> one hypothesis per sentence (``config.beam`` and ``nbest`` are ignored)."""
    memory, mask = model.encode(src), model.src_mask(src)
    B, device = src.size(0), src.device
    max_lens = config.max_len(mask.reshape(B, -1).sum(-1), max_len_cap)
    results: list[Hypothesis | None] = [None] * B
    active = torch.arange(B, device=device)
    log_prob = torch.zeros(B, device=device)
    tokens = torch.empty(B, 0, dtype=torch.long, device=device)
    step_in = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    cache = None
    T = int(max_lens.max())
    for t in range(1, T + 1):
        logits, cache = model.decode_step(step_in, memory, mask, cache, max_len=T)
        lprobs = output_log_probs(logits, t, min_len, pad_id, bos_id, eos_id)
        best, tok = lprobs.max(dim=-1)
        log_prob = log_prob + best
        tokens = torch.cat([tokens, tok[:, None]], dim=1)
        done = (tok == eos_id) | (max_lens[active] <= t)
        if bool(done.any()):
            lp = gnmt_length_penalty(t, config.alpha)
            for i in done.nonzero().squeeze(1).tolist():
                out = tokens[i].tolist()
                if out[-1] == eos_id:
                    out.pop()
                lpi = float(log_prob[i])
                results[int(active[i])] = Hypothesis(out, lpi / lp, lpi, t)
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            cache.select(keep, sentences=keep)
            active, log_prob, tokens, tok = active[keep], log_prob[keep], tokens[keep], tok[keep]
            memory, mask = memory.index_select(0, keep), mask.index_select(0, keep)
        step_in = tok[:, None]
    return results  # type: ignore[return-value]
