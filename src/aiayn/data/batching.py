"""Token-budget batching (paper section 5.1: "each training batch contained a set of sentence
pairs containing approximately 25000 source tokens and 25000 target tokens").

The budget counts padding and specials: a batch of B pairs whose longest source has S
subwords costs B * (S + 1) source tokens (eos) and B * (T + 1) target tokens (bos or eos on
each of tgt_in/tgt_out), which is what the GPU actually processes.

Iteration is infinite: ``iter(sampler)`` yields index lists epoch after epoch, because
training is counted in steps (100k for base), not epochs. ``state_dict()`` returns
``{"epoch", "position"}`` (batches already yielded in that epoch) and ``load_state_dict``
makes the next ``iter`` continue with exactly the batch that would have come next.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import UserError


class TokenBudgetSampler:
    """Length-bucketed batches under a padded token budget, shuffled per epoch, sharded.

    Each epoch: pairs are shuffled with ``seed + epoch`` and then stably sorted by (source,
    target) length, so equal-length pairs mix differently every epoch; batches are cut
    greedily in that order; batch order is shuffled with the same seed. Rank ``r`` of ``W``
    takes batches ``r, r + W, ...`` of the first ``W * (n_batches // W)``: the remaining
    ``n_batches % W`` batches of that epoch are dropped, so every rank does the same number
    of steps (a different remainder is dropped each epoch when shuffling). Pairs that alone
    exceed a budget are never batched; ``n_skipped`` counts them. ``corpora`` ((start, end,
    weight) of each named corpus's index range: ``corpus_ranges``) resamples each epoch's
    pairs by weight first (``weighted_epoch``).
    """

    def __init__(
        self,
        src_lens: np.ndarray,
        tgt_lens: np.ndarray,
        max_src_tokens: int,
        max_tgt_tokens: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        corpora: list[tuple[int, int, float]] | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.src_cost = np.asarray(src_lens, dtype=np.int64) + 1  # + eos
        self.tgt_cost = np.asarray(tgt_lens, dtype=np.int64) + 1  # + bos (tgt_in) / eos (tgt_out)
        self.max_src_tokens, self.max_tgt_tokens = max_src_tokens, max_tgt_tokens
        self.seed, self.rank, self.world_size, self.shuffle = seed, rank, world_size, shuffle
        # all weights 1: no resampling, so the order is exactly the unweighted one
        weighted = corpora is not None and any(w != 1 for _, _, w in corpora)
        self.corpora = corpora if weighted else None
        fits = (self.src_cost <= max_src_tokens) & (self.tgt_cost <= max_tgt_tokens)
        self.usable = np.flatnonzero(fits)
        self.n_skipped = int(len(fits) - len(self.usable))
        self.epoch, self.position = 0, 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        idx = self.usable
        if self.corpora is not None:
            idx = weighted_epoch(idx, self.corpora, np.random.default_rng((self.seed, epoch, 2)))
        if self.shuffle:
            idx = np.random.default_rng((self.seed, epoch)).permutation(idx)
        # lexsort: last key is primary; stable, so the shuffle breaks ties.
        return idx[np.lexsort((self.tgt_cost[idx], self.src_cost[idx]))]

    def _cut(self, order: np.ndarray) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        s_max = t_max = 0
        for i in order.tolist():
            s, t = max(s_max, self.src_cost[i]), max(t_max, self.tgt_cost[i])
            n = len(current) + 1
            if current and (n * s > self.max_src_tokens or n * t > self.max_tgt_tokens):
                batches.append(current)
                current, s, t = [], self.src_cost[i], self.tgt_cost[i]
            current.append(i)
            s_max, t_max = s, t
        if current:
            batches.append(current)
        return batches

    def all_batches(self, epoch: int) -> list[list[int]]:
        """Every batch of ``epoch`` before sharding, in the order ranks take them."""
        batches = self._cut(self._order(epoch))
        if self.shuffle:
            perm = np.random.default_rng((self.seed, epoch, 1)).permutation(len(batches))
            batches = [batches[j] for j in perm]
        return batches

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch`` (cached: the trainer asks for one epoch at a time)."""
        if self._cache is None or self._cache[0] != epoch:
            batches = self.all_batches(epoch)
            per_rank = len(batches) // self.world_size
            self._cache = (epoch, batches[self.rank : per_rank * self.world_size : self.world_size])
        return self._cache[1]

    def __len__(self) -> int:
        """Batches per epoch on this rank (of the current epoch; epochs differ by a few at most)."""
        return len(self.epoch_batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            batches = self.epoch_batches(self.epoch)
            if not batches:
                raise UserError(
                    "no batch fits: every pair exceeds the token budget or the data is empty"
                )
            while self.position < len(batches):
                self.position += 1  # before yielding, so state_dict() counts this batch as done
                yield batches[self.position - 1]
            self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def stats(self, epoch: int = 0) -> dict[str, float]:
        """Padded and real tokens per batch on this rank, to tune budgets and report waste."""
        batches = self.epoch_batches(epoch)
        if not batches:
            return {"batches": 0, "skipped_pairs": self.n_skipped}
        padded_src = [len(b) * int(self.src_cost[b].max()) for b in batches]
        padded_tgt = [len(b) * int(self.tgt_cost[b].max()) for b in batches]
        real_src = [int(self.src_cost[b].sum()) for b in batches]
        real_tgt = [int(self.tgt_cost[b].sum()) for b in batches]
        return {
            "batches": len(batches),
            "skipped_pairs": self.n_skipped,
            "mean_pairs": float(np.mean([len(b) for b in batches])),
            "mean_src_tokens_padded": float(np.mean(padded_src)),
            "mean_tgt_tokens_padded": float(np.mean(padded_tgt)),
            "mean_src_tokens": float(np.mean(real_src)),
            "mean_tgt_tokens": float(np.mean(real_tgt)),
            "padding_fraction": 1.0
            - (sum(real_src) + sum(real_tgt)) / (sum(padded_src) + sum(padded_tgt)),
        }


def corpus_ranges(train_meta: dict[str, Any]) -> list[tuple[int, int, float]] | None:
    """(start, end, weight) of each named corpus in a train split's ``meta.json`` record
    (``prepare`` writes them corpus after corpus), or ``None`` for a dataset without them."""
    corpora = train_meta.get("corpora")
    if not corpora:
        return None
    ends = np.cumsum([c["pairs"] for c in corpora]).tolist()
    starts = [0, *ends[:-1]]
    return [(s, e, float(c["weight"])) for s, e, c in zip(starts, ends, corpora)]


def weighted_epoch(
    usable: np.ndarray, corpora: list[tuple[int, int, float]], rng: np.random.Generator
) -> np.ndarray:
    """One epoch's pair indices with each corpus sampled by its weight (OpenNMT-py's corpus
    ``weight``, applied at batching time rather than by copying files): weight 2 takes every
    pair twice, 0.5 a random half, 1.5 every pair once and a random half again. ``usable``
    (sorted) are the indices that fit the budget."""
    parts = []
    for start, end, weight in corpora:
        members = usable[np.searchsorted(usable, start) : np.searchsorted(usable, end)]
        whole, fraction = divmod(weight, 1.0)
        parts.extend([members] * int(whole))
        parts.append(rng.choice(members, round(fraction * len(members)), replace=False))
    return np.concatenate(parts)
