"""Batched beam search with the GNMT length penalty and exact early termination.

Depends only on the decoding interface (duck-typed, so a scripted fake model can test it):

    model.encode(src (B, S)) -> memory (B, S, d_model)
    model.src_mask(src) -> (B, 1, 1, S) bool, True = may attend
    model.decode_step(tgt_in (B, n), memory, src_mask, cache) -> (logits (B, V), cache)
    cache.select(index (B',) long)  keeps/reorders batch rows in place

Each step expands every live hypothesis by every token, keeps the 2k best candidates by
log-probability, and (as fairseq and OpenNMT do) finishes the eos candidates that rank among the
first k; the k best non-eos candidates stay live. Taking 2k guarantees k live ones, since the k
live beams contribute at most k eos candidates. Finished hypotheses are ranked by
``log P(Y|X) / lp(|Y|)`` (see ``penalties``). With k = 1 and alpha = 0 this is greedy search.

Early termination (section 6.1 "terminate early when possible"), exact rather than heuristic:
a live hypothesis with log-probability s <= 0 after t tokens can only finish with some length
|Y| in [t+1, max_len] and log-probability s' <= s (log-probabilities are <= 0), so its final
score is at most s' / lp(|Y|) <= s / max(lp(t+1), lp(max_len)); for alpha >= 0 that is
s / lp(max_len), tensor2tensor's bound. A sentence is done once this bound for its best live
hypothesis is no better than its nbest-th finished score: no live hypothesis can then enter the
n-best list, so stopping changes no output. It then leaves the batch (``cache.select``), so the
work shrinks as sentences finish.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import DecodeConfig
from .penalties import gnmt_length_penalty

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    """One output: tokens without bos/eos, score = log_prob / lp(length), length = |Y|."""

    tokens: list[int]
    score: float
    log_prob: float
    length: int


class Constraint(Protocol):
    """Which tokens may follow a prefix (e.g. ``aiayn.parsing.constraint.TreeConstraint``).

    States are opaque and immutable (beams that share a prefix share its state); tokens outside
    ``allowed`` get log-probability -inf, so eos must be allowed for an output to finish.
    """

    def start(self, source: Sequence[int], max_len: int) -> Any: ...  # the empty output's state
    def allowed(self, state: Any) -> Iterable[int]: ...
    def advance(self, state: Any, token: int) -> Any: ...


def constrain(lprobs: Tensor, allowed: Sequence[Iterable[int]]) -> Tensor:
    """(rows, V) log-probabilities with every token outside ``allowed[row]`` set to -inf."""
    rows, cols = [], []
    for row, ids in enumerate(allowed):
        ids = list(ids)
        rows += [row] * len(ids)
        cols += ids
    keep = torch.zeros_like(lprobs, dtype=torch.bool)
    keep[torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)] = True
    return lprobs.masked_fill(~keep.to(lprobs.device), NEG_INF)


def output_log_probs(
    logits: Tensor, t: int, min_len: int, pad_id: int, bos_id: int, eos_id: int
) -> Tensor:
    """(B, V) logits of output position t (1-based) -> log-probabilities, with pad and bos
    impossible and eos impossible while t < min_len (the distribution is not renormalised)."""
    lprobs = F.log_softmax(logits.float(), dim=-1)
    lprobs[:, pad_id] = NEG_INF
    lprobs[:, bos_id] = NEG_INF
    if t < min_len:
        lprobs[:, eos_id] = NEG_INF
    return lprobs


class _Finished:
    """Per-sentence n-best lists of finished hypotheses (Python; touched only on events)."""

    def __init__(self, batch: int, nbest: int) -> None:
        self.nbest = nbest
        self.hyps: list[list[Hypothesis]] = [[] for _ in range(batch)]

    def add(self, sentence: int, hyp: Hypothesis) -> float:
        """Insert ``hyp``; return the sentence's nbest-th score (-inf while fewer)."""
        hyps = self.hyps[sentence]
        hyps.append(hyp)
        hyps.sort(key=lambda h: -h.score)  # stable: earlier (shorter) hypotheses win ties
        del hyps[self.nbest :]
        return hyps[-1].score if len(hyps) == self.nbest else NEG_INF


@torch.no_grad()
def beam_search(
    model: Any,
    src: Tensor,
    config: DecodeConfig = DecodeConfig(),
    *,
    min_len: int = 0,
    max_len_cap: int | None = None,
    constraint: Constraint | None = None,
    pad_id: int = 0,
    bos_id: int = 2,
    eos_id: int = 3,
) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence its ``config.nbest`` best hypotheses, best first.

    ``min_len``: eos is forbidden before output position ``min_len`` (for benchmarks that need
    a fixed output length). ``max_len_cap``: upper limit on |Y| (e.g. the model's positions).
    ``constraint``: restricts each step's tokens to those it allows after the prefix.
    """
    k, alpha = config.beam, config.alpha
    memory, mask = model.encode(src), model.src_mask(src)
    B, device = src.size(0), src.device
    max_lens = config.max_len(mask.reshape(B, -1).sum(-1), max_len_cap)  # (B,) |Y| limits
    lp_max = gnmt_length_penalty(max_lens, alpha)  # (B,)
    T = int(max_lens.max())
    finished = _Finished(B, config.nbest)

    active = torch.arange(B, device=device)  # original index of each sentence still decoding
    active_list = list(range(B))
    threshold = torch.full((B,), NEG_INF, device=device)  # nbest-th finished score per sentence
    b = 1  # live beams per sentence: one (the bos prefix) until the first step fans out to k
    scores = torch.zeros(B, 1, device=device)  # (n, b) log P of each live prefix
    tokens = torch.empty(B, 0, dtype=torch.long, device=device)  # (n*b, t-1) live prefixes
    step_in = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    rank_ok = torch.arange(2 * k, device=device) < k  # candidates allowed to finish
    cache = None
    states = None if constraint is None else [  # one per live prefix
        constraint.start([i for i in row if i != pad_id], limit) for row, limit in zip(src.tolist(), max_lens.tolist())]
    for t in range(1, T + 1):
        logits, cache = model.decode_step(step_in, memory, mask, cache)
        lprobs = output_log_probs(logits, t, min_len, pad_id, bos_id, eos_id)
        if states is not None:
            lprobs = constrain(lprobs, [constraint.allowed(state) for state in states])
        n, V = scores.size(0), lprobs.size(-1)
        cand = (scores.unsqueeze(-1) + lprobs.view(n, b, V)).view(n, b * V)
        if b * V < 2 * k:  # tiny vocabularies: pad with impossible candidates
            cand = torch.cat([cand, cand.new_full((n, 2 * k - b * V), NEG_INF)], dim=1)
        top, idx = cand.topk(2 * k, dim=1)  # (n, 2k), best first
        beam_of, tok = (idx // V).clamp_(max=b - 1), idx % V
        is_eos = tok == eos_id
        at_max = max_lens[active] <= t  # (n,) last step: every top-k candidate finishes
        finish = rank_ok & (is_eos | at_max[:, None]) & (top > NEG_INF)

        if bool(finish.any()):
            lp = gnmt_length_penalty(t, alpha)
            for i, j in finish.nonzero().tolist():
                row = i * b + int(beam_of[i, j])
                out = tokens[row].tolist() + ([] if is_eos[i, j] else [int(tok[i, j])])
                log_prob = float(top[i, j])
                hyp = Hypothesis(out, log_prob / lp, log_prob, t)
                threshold[i] = finished.add(active_list[i], hyp)

        live, pos = top.masked_fill(is_eos, NEG_INF).topk(k, dim=1)  # (n, k) best non-eos
        lp_bound = lp_max[active].clamp(min=gnmt_length_penalty(t + 1, alpha))  # see module doc
        done = at_max | (live[:, 0] / lp_bound <= threshold)
        rows = (torch.arange(n, device=device) * b)[:, None] + beam_of.gather(1, pos)  # (n, k)
        live_tok = tok.gather(1, pos)
        sentences_change = bool(done.any()) or b != k
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            rows, live_tok, live, threshold = rows[keep], live_tok[keep], live[keep], threshold[keep]
            active = active[keep]
            active_list = [active_list[i] for i in keep.tolist()]
            memory, mask = _select_sentences(memory, mask, keep, b, k)
        elif b != k:
            memory, mask = _select_sentences(memory, mask, torch.arange(n, device=device), b, k)
        rows = rows.view(-1)
        # Beams only move within their sentence unless sentences leave or the beam fans out,
        # so the memory k/v (identical for all beams of a sentence) need no copy otherwise.
        cache.select(rows, reorder_memory=sentences_change)
        if states is not None:
            states = [constraint.advance(states[r], tok_r)
                      for r, tok_r in zip(rows.tolist(), live_tok.view(-1).tolist())]
        tokens = torch.cat([tokens.index_select(0, rows), live_tok.view(-1, 1)], dim=1)
        scores, b = live, k
        step_in = live_tok.view(-1, 1)
    return finished.hyps


def _select_sentences(memory: Tensor, mask: Tensor, keep: Tensor, b: int, k: int) -> tuple[Tensor, Tensor]:
    """Rows of memory/mask for sentences ``keep`` (laid out b rows each), each repeated k times.

    All beams of a sentence share its memory, so beam reordering never touches these tensors;
    they change only when the beam fans out (b = 1 -> k) or sentences leave the batch.
    """
    index = (keep * b).repeat_interleave(k)
    return memory.index_select(0, index), mask.index_select(0, index)
