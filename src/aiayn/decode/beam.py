"""Batched beam search with the GNMT length penalty and exact early termination.

Depends only on the decoding interface (duck-typed, so a scripted fake model can test it):

    model.encode(src (B, S)) -> memory (opaque to the search: it only hands it back)
    model.src_mask(src) -> (B, 1, 1, S) bool, True = may attend
    model.new_cache(memory, src_mask, max_len=T) -> cache for T target positions of B sentences
    model.decode_step(tgt_in (n*b, 1), cache) -> logits (n*b, V)
        rows are sentence-major, b consecutive rows (beams) per sentence of the cache
    cache.select(rows (n'*k,) long, sentences=(n',) long or None)  keeps/reorders rows in place

called through ``aiayn.decode.cache``, which gives a ``Transformer`` its fast shared-history cache.

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

Lexical constraints (phrases every output must hold, ``constraints``) take ``expand_banked``
instead of ``expand``: dynamic beam allocation, whose candidates are ordered by banks of
constraint tokens placed rather than by log-probability, and ``prune`` keeps the first k in
that order; finishing and early termination are as above (the bound holds for any live
prefix). Every other search, a target prefix alone included, is the plain one.

Other toolkits' rules (``DecodeConfig.rules``: fairseq's, transformers', CTranslate2's length
penalty, stopping rule and length limit; ``rules.py``) change only ``finish``'s penalty and
cap and ``prune``'s test (``_stop``); the paper's rules are the default.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # the vocabulary's ids: one source
from .cache import decode_step, new_cache
from .config import DecodeConfig
from .constraints import (
    Constraint,
    advance_states,
    advancing,
    constrain,
    constraint_states,
    has_phrases,
    placed,
)
from .penalties import gnmt_length_penalty
from .repetition import guard_repetition
from .rules import SearchRules

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    """One output: tokens without bos/eos, score = log_prob / lp(length), length = |Y|."""

    tokens: list[int]
    score: float
    log_prob: float
    length: int


def output_log_probs(
    logits: Tensor,
    t: int,
    min_len: int,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    out: Tensor | None = None,
) -> Tensor:
    """(B, V) logits of output position t (1-based) -> log-probabilities, with pad and bos
    impossible and eos impossible while t < min_len (the distribution is not renormalised).
    ``out``: a (B, V) float32 tensor to write them into (``_Workspace.take``), which may be
    ``logits`` itself: normalised in place."""
    if out is None:
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    else:  # in place in out (bf16 logits cast into it first): each row is written while cached
        lprobs = torch.log_softmax(out if out is logits else out.copy_(logits), dim=-1, out=out)
    impossible = (pad_id, bos_id, eos_id) if t < min_len else (pad_id, bos_id)
    return lprobs.index_fill_(1, _columns(impossible, lprobs.device), NEG_INF)


@functools.lru_cache(maxsize=16)
def _columns(ids: tuple[int, ...], device: torch.device) -> Tensor:
    """ids as a long tensor, made once: one ``index_fill_`` a step instead of an indexing
    assignment per id (three operators each); only read, never written, and a normal tensor
    even when first made under ``inference_mode`` (autograd may save it for a backward)."""
    with torch.inference_mode(False):
        return torch.tensor(ids, dtype=torch.long, device=device)


def rule_masks(lprobs: Tensor, limits: Tensor, t: int, eos_id: int, rules: SearchRules) -> Tensor:
    """(n*b, V) log-probabilities at step t with what ``rules`` make impossible: unk unless
    ``rules.allow_unk`` (Marian's), and under ``rules.eos_at_limit`` (fairseq's last step,
    where every output ends with eos) every token but eos in the rows of the sentences whose
    limit (``limits`` (n,)) is t."""
    if not rules.allow_unk:
        lprobs[:, UNK_ID] = NEG_INF
    if not rules.eos_at_limit:
        return lprobs
    rows = (limits <= t).repeat_interleave(lprobs.size(0) // limits.numel())  # (n*b,)
    keep = torch.zeros_like(lprobs, dtype=torch.bool)
    keep[:, eos_id] = True
    return lprobs.masked_fill(rows[:, None] & ~keep, NEG_INF)


class _Workspace:
    """Where a step's (rows, V) log-probabilities are computed: float32 logits in place (the
    search does not read them again, and each row written over itself while it is cached beats
    a second buffer, docs/benchmarks.md); bf16 ones cast into one float32 buffer kept for every
    step (a fresh tensor of that size per step costs the allocator's page faults, several
    times the arithmetic on it)."""

    def __init__(self, device: torch.device) -> None:
        self.flat = torch.empty(0, device=device)

    def take(self, logits: Tensor) -> Tensor:
        """(rows, V) float32 for logits (rows, V): the logits themselves when float32, else the
        buffer's first rows*V elements (it grows when they are more)."""
        if logits.dtype == torch.float32:
            return logits
        rows, V = logits.shape
        if self.flat.numel() < rows * V:
            self.flat = self.flat.new_empty(rows * V)
        return self.flat[: rows * V].view(rows, V)


class _Finished:
    """Finished hypotheses, collected in bulk and turned into Python objects once, at the end.

    Each step that finishes hypotheses adds one record of tensors (no per-hypothesis Python
    work while decoding). ``best`` (n, nbest) keeps the nbest best finished scores of each
    sentence still decoding (-inf while fewer), for the early-termination test. Scores are
    float64, ``log_prob / lp(|Y|)`` as Python computes it, so that ties and thresholds match
    the reference implementation exactly.
    """

    def __init__(
        self,
        n: int,
        nbest: int,
        device: torch.device,
        kept: int | None = None,
        counting: bool = False,
    ) -> None:
        """``kept``: how many best scores ``best`` keeps (default nbest; transformers' rule
        compares with the beam-th). ``counting``: keep ``count`` and ``first``, which only the
        other toolkits' stopping rules read (the paper's step does without them)."""
        self.nbest = nbest
        self.best = torch.full((n, kept or nbest), NEG_INF, dtype=torch.float64, device=device)
        self.count: Tensor | None = None  # (n,) finished so far
        self.first: Tensor | None = None  # (n,) whether a step's best candidate finished
        if counting:
            self.count = torch.zeros(n, dtype=torch.long, device=device)
            self.first = torch.zeros(n, dtype=torch.bool, device=device)
        self.records: list[tuple[Tensor, ...]] = []

    @classmethod
    def for_rules(cls, n: int, config: DecodeConfig, device: torch.device) -> _Finished:
        """What ``config.rules``' stopping test reads, for n sentences."""
        kept = config.rules.compared(config.beam, config.nbest)
        return cls(n, config.nbest, device, kept, counting=config.rules.stopping != "exact")

    def add(
        self,
        lp: float,
        penalty: float,
        finish: Tensor,
        sentence: Tensor,
        log_prob: Tensor,
        outputs: Tensor,
        is_eos: Tensor,
    ) -> None:
        """One step's finishing candidates, of length |Y| with penalty ``lp`` (and a word
        penalty ``penalty`` taken from log P first). finish, log_prob, is_eos (n, 2k); sentence
        (n,) original indices; outputs (m, |Y|) the m finishing outputs in ``finish.nonzero()``
        order, eos or not as the last token."""
        score = (log_prob.double() - penalty) / lp  # (n, 2k)
        i, j = finish.nonzero(as_tuple=True)
        self.records.append((sentence[i], score[i, j], log_prob[i, j], outputs, is_eos[i, j]))
        candidates = score.masked_fill(~finish, NEG_INF)
        kept = self.best.size(1)
        self.best = torch.cat([self.best, candidates], dim=1).topk(kept, dim=1).values
        if self.count is not None and self.first is not None:
            self.count += finish.sum(1)
            self.first |= finish[:, 0]

    def keep(self, sentences: Tensor) -> None:
        for name in ("best", "count", "first"):
            if (state := getattr(self, name)) is not None:
                setattr(self, name, state.index_select(0, sentences))

    def threshold(self) -> Tensor:
        """(n,) the nbest-th (or kept-th) finished score per decoding sentence, as float32
        (-inf while fewer)."""
        return self.best[:, -1].float()

    def nbest_lists(self, batch: int) -> list[list[Hypothesis]]:
        """Per sentence its nbest best hypotheses; ties go to the earlier one (shorter, or
        better ranked in the same step), as in a stable sort by score."""
        hyps: list[list[Hypothesis]] = [[] for _ in range(batch)]
        for sentence, score, log_prob, outputs, is_eos in self.records:
            length = outputs.size(1)
            for i, s, lpr, out, eos in zip(
                sentence.tolist(),
                score.tolist(),
                log_prob.tolist(),
                outputs.tolist(),
                is_eos.tolist(),
            ):
                hyps[i].append(Hypothesis(out[:-1] if eos else out, s, lpr, length))
        for h in hyps:
            h.sort(key=lambda hyp: -hyp.score)  # stable
            del h[self.nbest :]
        return hyps


@dataclass
class _Live:
    """Per sentence still decoding (n of them), what the search keeps besides the beams."""

    active: Tensor  # (n,) the sentence's index in the batch given to beam_search
    max_lens: Tensor  # (n,) its limit on |Y|
    lp_max: Tensor  # (n,) lp(max_len), for the early-termination bound

    def keep(self, sentences: Tensor) -> None:
        """Only these sentences (n',) go on."""
        for name in ("active", "max_lens", "lp_max"):
            setattr(self, name, getattr(self, name).index_select(0, sentences))


@dataclass
class _Candidates:
    """One step's 2k best extensions of each sentence's live prefixes, best first (banked: the
    banks' turns, ``expand_banked``): (n, 2k) each."""

    top: Tensor  # log P of the extended prefix
    beam_of: Tensor  # the live beam (of b) it extends
    tok: Tensor  # the token it appends
    is_eos: Tensor  # whether that token is eos
    banked: bool = False  # ordered by banks (``expand_banked``), not by log P

    @property
    def k(self) -> int:
        return self.top.size(1) // 2


def expand(scores: Tensor, lprobs: Tensor, k: int, eos_id: int) -> _Candidates:
    """Extend every live prefix by every token and keep the 2k best candidates per sentence.

    scores (n, b) log P of the prefixes, lprobs (n*b, V) -> candidates (n, 2k); lprobs may be
    overwritten. A candidate's log P is its prefix's plus its token's, summed where ``top_k``
    looks rather than in a pass over all n*b*V.
    """
    (n, b), V = scores.shape, lprobs.size(-1)
    if b * V < 2 * k:  # tiny vocabularies: pad with impossible candidates
        cand = lprobs.view(n, b, V).add_(scores.unsqueeze(-1)).view(n, b * V)
        cand = torch.cat([cand, cand.new_full((n, 2 * k - b * V), NEG_INF)], dim=1)
        top, idx = cand.topk(2 * k, dim=1)
        idx = idx.clamp_(max=b * V - 1)  # a pad extends the last beam (its log P stays -inf)
    else:
        top, idx = top_k(lprobs.view(n, b, V), 2 * k, offsets=scores)
    beam_of, tok = idx // V, idx % V
    return _Candidates(top, beam_of, tok, tok == eos_id)


def _expand(
    scores: Tensor, lprobs: Tensor, k: int, eos_id: int, states: list[tuple[Constraint, Any]] | None
) -> _Candidates:
    """``expand``, or ``expand_banked`` where some row must hold phrases."""
    if states is not None and has_phrases(states):
        return expand_banked(scores, lprobs, k, eos_id, states)
    return expand(scores, lprobs, k, eos_id)


def expand_banked(
    scores: Tensor, lprobs: Tensor, k: int, eos_id: int, states: list[tuple[Constraint, Any]]
) -> _Candidates:
    """``expand`` with dynamic beam allocation (Post & Vilar 2018) for lexical constraints.

    The candidates: the 2k best, each live prefix's best token, and each prefix's tokens that
    place a constraint token next (``OutputConstraint.advancing``). Each goes to the bank of
    its constraint tokens placed, and the banks take turns, the fullest first: each bank's
    best, then each bank's second, ... The first 2k in that order are the candidates (n, 2k),
    so that ``finish`` (eos among the first k) and ``prune(banked=True)`` (the first k
    others) keep every bank's best rather than the k best overall, which would drop a prefix
    that has just placed an unlikely phrase for ones that have placed none.
    """
    n, b = scores.shape
    best = lprobs.argmax(-1).tolist()  # read before ``expand`` overwrites lprobs
    pairs = [(r, v) for r, (c, s) in enumerate(states) for v in {best[r], *advancing(c, s)}]
    rows = torch.tensor([r for r, _ in pairs], dtype=torch.long, device=lprobs.device)
    toks = torch.tensor([v for _, v in pairs], dtype=torch.long, device=lprobs.device)
    extra = (lprobs[rows, toks] + scores.view(-1)[rows]).tolist()  # as ``expand`` sums them
    cand = expand(scores, lprobs, k, eos_id)
    pools: list[dict[tuple[int, int], float]] = [{} for _ in range(n)]
    listed = zip(cand.top.tolist(), cand.beam_of.tolist(), cand.tok.tolist())
    for i, (top, beam_of, tok) in enumerate(listed):
        for score, j, v in zip(top, beam_of, tok):
            pools[i].setdefault((j, v), score)
    for (r, v), score in zip(pairs, extra):
        pools[r // b].setdefault((r % b, v), score)
    turns = [_turns(pool, states[i * b : (i + 1) * b], 2 * k) for i, pool in enumerate(pools)]
    top = torch.tensor([[s for s, _, _ in row] for row in turns], device=scores.device)
    beam_of = torch.tensor([[j for _, j, _ in row] for row in turns], device=scores.device)
    tok = torch.tensor([[v for _, _, v in row] for row in turns], device=scores.device)
    return _Candidates(top, beam_of, tok, tok == eos_id, banked=True)


def _turns(
    pool: dict[tuple[int, int], float], states: list[tuple[Constraint, Any]], width: int
) -> list[tuple[float, int, int]]:
    """One sentence's candidates {(beam, token): log P} as (log P, beam, token), the banks
    taking turns (fullest first), the first ``width``; impossible ones (-inf) last, as
    padding when there are fewer possible ones."""
    items = [(s, j, v) for (j, v), s in pool.items()]
    possible = sorted((c for c in items if c[0] > NEG_INF), key=lambda c: (-c[0], c[1], c[2]))
    seen: dict[int, int] = {}  # bank -> its candidates ranked so far
    keyed = []
    for s, j, v in possible:
        c, state = states[j]
        bank = placed(c, c.advance(state, v))
        keyed.append(((seen.get(bank, 0), -bank), (s, j, v)))
        seen[bank] = seen.get(bank, 0) + 1
    keyed.sort(key=lambda item: item[0])  # stable: within a turn and bank, by log P
    chosen = [c for _, c in keyed[:width]]
    filler = [c for c in items if c[0] == NEG_INF] or [(NEG_INF, *chosen[-1][1:])]
    return chosen + [filler[i % len(filler)] for i in range(width - len(chosen))]


TOP_K_BLOCK = 128  # columns per block of ``top_k``'s first pass (measured: 64-128 alike)
TOP_K_BLOCKS_FROM = 2**17  # elements of x from which blocks pay (a few rows of a beam step)


def top_k(x: Tensor, k: int, offsets: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The k best of each sentence's b*V candidates x[i, j, v] + offsets[i, j], best first:
    x (n, b, V), offsets (n, b) (None: 0) -> values (n, k) and indices j * V + v (n, k); x may
    be overwritten. What ``(x + offsets[..., None]).view(n, b * V).topk(k, dim=1)`` gives (ties
    aside, which topk orders as it likes anyway), by blocks: PyTorch's CPU top-k sorts
    candidates per row, several times the cost of reading it, while the k best lie in the k
    blocks of ``TOP_K_BLOCK`` columns of a row of x with the highest maxima plus offset (a
    block whose best is below the k-th value holds none of them). So: each block's maximum (one
    vectorised pass), plus its row's offset, the k best blocks, then top-k among their
    k x TOP_K_BLOCK columns and the columns after a row's last whole block, each plus its
    offset; the winners' indices follow from their places (no index made per candidate).
    Rounding is monotonic, so a block's maximum plus the offset is its best sum exactly, and
    every value is the sum that a pass over all of x would have made."""
    n, b, V = x.shape
    blocks = V // TOP_K_BLOCK
    if offsets is None:
        offsets = x.new_zeros(n, b)
    if b * blocks <= 4 * k or x.numel() < TOP_K_BLOCKS_FROM:  # the first pass would not pay
        return x.add_(offsets.unsqueeze(-1)).view(n, b * V).topk(k, dim=1)
    B = TOP_K_BLOCK
    grid = x[:, :, : blocks * B].unflatten(2, (blocks, B))  # (n, b, blocks, B)
    maxima = grid.amax(dim=-1).add_(offsets.unsqueeze(-1))  # (n, b, blocks)
    best = maxima.view(n, b * blocks).topk(k, dim=1).indices  # (n, k) of the b*blocks
    beam, block = best // blocks, best % blocks
    values = grid[torch.arange(n, device=x.device)[:, None], beam, block]  # (n, k, B)
    values = values.add_(offsets.gather(1, beam).unsqueeze(-1)).flatten(1)  # (n, k*B)
    starts = beam * V + block * B  # (n, k): the first column of each chosen block
    r = V - blocks * B  # each row's columns after its last whole block
    if r:
        rest = x[:, :, blocks * B :].add(offsets.unsqueeze(-1))  # (n, b, r)
        values = torch.cat([values, rest.flatten(1)], dim=1)  # (n, k*B + b*r)
        tails = torch.arange(b, device=x.device) * V + blocks * B  # (b,) first tail columns
        starts = torch.cat([starts, tails.expand(n, b)], dim=1)  # (n, k + b)
    top, j = values.topk(k, dim=1)  # j: a place among the k blocks' columns, then the tails'
    in_block = j < k * B
    tail = (j - k * B).clamp(min=0)
    segment = torch.where(in_block, j // B, k + tail // max(r, 1))  # which of the starts
    within = torch.where(in_block, j % B, tail % max(r, 1))
    return top, starts.gather(1, segment) + within


def finish(
    finished: _Finished,
    live: _Live,
    cand: _Candidates,
    *,
    prefixes: Tensor,
    t: int,
    config: DecodeConfig,
) -> None:
    """Finish the eos candidates that rank among the first k (at a sentence's length limit,
    every one of its first k): their outputs, prefixes (n*b, t-1) + token, join ``finished``.
    Under "first_k" rules (fairseq) a sentence keeps only the first k it finishes; under
    "shrink" (Marian) the first k less those it has finished count."""
    k, n, rules = cand.k, cand.top.size(0), config.rules
    b = prefixes.size(0) // n  # live beams per sentence
    at_max = (live.max_lens <= t)[:, None]  # (n, 1)
    count = finished.count  # counted under every rule but "exact"
    width = k - count[:, None] if rules.stopping == "shrink" and count is not None else k
    rank_ok = torch.arange(2 * k, device=cand.top.device) < width  # (2k,) or (n, 2k)
    chosen = rank_ok & (cand.is_eos | at_max) & (cand.top > NEG_INF)  # (n, 2k)
    if rules.stopping == "first_k":  # in candidate order, up to k in all
        assert finished.count is not None  # counted under every rule but "exact"
        chosen &= finished.count[:, None] + chosen.cumsum(1) <= k
    if bool(chosen.any()):
        i, j = chosen.nonzero(as_tuple=True)
        outputs = torch.cat(
            [prefixes.index_select(0, i * b + cand.beam_of[i, j]), cand.tok[i, j, None]], dim=1
        )
        lp = rules.length_penalty(t, config.alpha)
        penalty = rules.word_penalty * t
        finished.add(lp, penalty, chosen, live.active, cand.top, outputs, cand.is_eos)


def prune(
    finished: _Finished, live: _Live, cand: _Candidates, *, b: int, t: int, config: DecodeConfig
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The k best non-eos candidates stay live (banked ones: the first k in the candidates'
    order, ``expand_banked``'s); a sentence is done at its length limit or once none of them
    can reach its n-best list (see the module docstring). ``b``: live beams per sentence
    before this step.

    Returns rows (n, k), the prefix row (of n*b) each live beam extends; tokens (n, k) and
    scores (n, k) of the live beams; done (n,) bool.
    """
    if cand.banked:
        scores, pos = _first_live(cand)
    else:
        scores, pos = cand.top.masked_fill(cand.is_eos, NEG_INF).topk(cand.k, dim=1)  # (n, k)
    if config.rules.stopping == "shrink":  # Marian's narrowed beam: k less the finished live
        assert finished.count is not None  # counted under every rule but "exact"
        narrowed = torch.arange(cand.k, device=scores.device) >= cand.k - finished.count[:, None]
        scores = scores.masked_fill(narrowed, NEG_INF)
    best_live = scores.amax(1) if cand.banked else scores[:, 0]  # banked: not by log P
    done = (live.max_lens <= t) | _stop(finished, live, best_live, t=t, config=config)
    n = cand.top.size(0)
    rows = (torch.arange(n, device=cand.top.device) * b)[:, None] + cand.beam_of.gather(1, pos)
    return rows, cand.tok.gather(1, pos), scores, done


def _first_live(cand: _Candidates) -> tuple[Tensor, Tensor]:
    """Log P and places (n, k) of the first k candidates that are not eos, in their order."""
    width = cand.top.size(1)
    order = cand.is_eos.long() * width + torch.arange(width, device=cand.top.device)
    pos = order.topk(cand.k, dim=1, largest=False).indices  # ascending: the order kept
    return cand.top.gather(1, pos), pos


def _stop(
    finished: _Finished, live: _Live, best_live: Tensor, *, t: int, config: DecodeConfig
) -> Tensor:
    """(n,) which sentences stop after step t by ``config.rules.stopping``; best_live (n,) the
    log P of each sentence's best live prefix (of t tokens)."""
    rules, alpha = config.rules, config.alpha
    if rules.stopping == "exact":  # no live prefix can beat the nbest-th (module docstring)
        lp_bound = live.lp_max.clamp(min=gnmt_length_penalty(t + 1, alpha))  # (n,)
        return best_live / lp_bound <= finished.threshold()
    assert finished.count is not None and finished.first is not None  # counted past "exact"
    enough = finished.count >= rules.finished_for_stop(config.beam)
    if rules.stopping == "heuristic":  # the best live prefix scored at its own length
        return enough & (best_live / rules.length_penalty(t, alpha) <= finished.threshold())
    if rules.stopping == "patience" and alpha == 0:  # CTranslate2's early exit
        return finished.first & (finished.count >= config.nbest)
    return enough


def _leave(
    done: Tensor,
    rows: Tensor,
    tokens: Tensor,
    scores: Tensor,
    live: _Live,
    finished: _Finished,
    cache: Any,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """Done sentences leave the batch; the cache follows the surviving beams. The kept
    sentences' (rows, tokens, scores), each (n', k); None when every sentence is done."""
    if not bool(done.any()):
        cache.select(rows.view(-1))  # beams move within their sentence
        return rows, tokens, scores
    keep = fill_from_tail(done)  # (n',)
    if keep.numel() == 0:
        return None
    live.keep(keep)
    finished.keep(keep)
    cache.select(rows[keep].view(-1), sentences=keep)
    return rows[keep], tokens[keep], scores[keep]


def fill_from_tail(done: Tensor) -> Tensor:
    """(n',) the sentences that go on (done (n,) bool), in the order that moves the fewest:
    each done one among the first n' gives its place to a live one from after them (so the
    cache copies only those, ``DecoderCache.select``); the search is per sentence, so the
    order changes no output."""
    live = ~done
    n_kept = int(live.sum())
    order = torch.arange(n_kept, device=done.device)
    holes = done[:n_kept].nonzero().squeeze(1)
    order[holes] = live[n_kept:].nonzero().squeeze(1) + n_kept
    return order


@torch.no_grad()
def beam_search(
    model: Any,
    src: Tensor,
    config: DecodeConfig = DecodeConfig(),
    *,
    min_len: int = 0,
    max_len_cap: int | None = None,
    constraint: Constraint | Sequence[Constraint | None] | None = None,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence its ``config.nbest`` best hypotheses, best first.

    ``min_len``: eos is forbidden before output position ``min_len`` (for benchmarks that need
    a fixed output length). ``max_len_cap``: upper limit on |Y| (e.g. the model's positions).
    ``constraint``: restricts each step's tokens to those it allows after the prefix; one for
    every sentence, or one (or None) per sentence of ``src``.

    Shapes: n sentences still decoding (of B), b live beams per sentence (1 at the first step,
    then k = ``config.beam``), V vocabulary, t the step (= output position); row = sentence * b
    + beam. The memory stays in the cache, one per sentence: the model shares it among a
    sentence's beams. Each step: ``expand``, ``finish``, ``prune``; done sentences leave.
    """
    k, alpha, min_len = config.beam, config.alpha, max(min_len, config.rules.min_len)
    mask = model.src_mask(src)  # (n, 1, 1, S)
    B, device = src.size(0), src.device
    max_lens = config.max_len(mask.reshape(B, -1).sum(-1), max_len_cap)  # (n,) |Y| limits
    live = _Live(torch.arange(B, device=device), max_lens, gnmt_length_penalty(max_lens, alpha))
    T = int(max_lens.max())
    cache = new_cache(model, model.encode(src), mask, max_len=T)
    finished = _Finished.for_rules(B, config, device)
    space = _Workspace(device)

    b = 1  # live beams per sentence: one (the bos prefix) until the first step fans out to k
    scores = torch.zeros(B, 1, device=device)  # (n, b) log P of each live prefix
    prefixes = torch.empty(B, 0, dtype=torch.long, device=device)  # (n*b, t-1) live prefixes
    step_in = torch.full((B, 1), bos_id, dtype=torch.long, device=device)  # (n*b, 1)
    states = constraint_states(constraint, src, max_lens, pad_id)  # (constraint, state) per prefix
    for t in range(1, T + 1):
        logits = decode_step(model, step_in, cache)
        lprobs = output_log_probs(logits, t, min_len, pad_id, bos_id, eos_id, space.take(logits))
        if states is not None:
            lprobs = constrain(lprobs, [c.allowed(state) for c, state in states])
        lprobs = rule_masks(lprobs, live.max_lens, t, eos_id, config.rules)
        lprobs = guard_repetition(lprobs, prefixes, config)  # as it is unless asked
        cand = _expand(scores, lprobs, k, eos_id, states)  # (n, 2k) each
        finish(finished, live, cand, prefixes=prefixes, t=t, config=config)
        rows, tokens, scores, done = prune(finished, live, cand, b=b, t=t, config=config)

        survivors = _leave(done, rows, tokens, scores, live, finished, cache)
        if survivors is None:
            break
        rows, tokens, scores = survivors
        rows = rows.view(-1)  # (n*k,) rows of the old n*b
        states = advance_states(states, rows, tokens)
        prefixes = torch.cat([prefixes.index_select(0, rows), tokens.view(-1, 1)], 1)  # (n*k, t)
        b = k
        step_in = tokens.view(-1, 1)
    return finished.nbest_lists(B)
