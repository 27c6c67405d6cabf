"""TokenBudgetSampler: budgets include padding and specials; deterministic, sharded, resumable."""

from itertools import islice

import numpy as np
import pytest

from aiayn.data import TokenBudgetSampler

RNG = np.random.default_rng(0)
SRC = RNG.integers(1, 40, size=500)
TGT = RNG.integers(1, 40, size=500)


def sampler(**kw) -> TokenBudgetSampler:
    args = dict(src_lens=SRC, tgt_lens=TGT, max_src_tokens=200, max_tgt_tokens=150, seed=3)
    return TokenBudgetSampler(**{**args, **kw})


def test_budgets_respected_with_padding_and_specials():
    s = sampler()
    batches = s.epoch_batches(0)
    for b in batches:
        assert len(b) * (SRC[b].max() + 1) <= 200
        assert len(b) * (TGT[b].max() + 1) <= 150
    # Every pair is used exactly once per epoch (nothing exceeds the budget alone).
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert s.n_skipped == 0


def test_same_seed_same_batches_other_seed_or_epoch_differs():
    assert sampler().epoch_batches(0) == sampler().epoch_batches(0)
    assert sampler().epoch_batches(0) != sampler(seed=4).epoch_batches(0)
    assert sampler().epoch_batches(0) != sampler().epoch_batches(1)


def test_batches_are_length_bucketed():
    # Sorting keeps padding small: padded tokens are within 15% of real tokens here.
    st = sampler().stats()
    assert st["padding_fraction"] < 0.15
    assert st["mean_src_tokens_padded"] <= 200 and st["mean_tgt_tokens_padded"] <= 150


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_are_disjoint_equal_sized_and_cover_all_but_the_dropped_remainder(world_size):
    full = sampler().all_batches(0)
    shards = [sampler(rank=r, world_size=world_size).epoch_batches(0) for r in range(world_size)]
    per_rank = len(full) // world_size
    assert all(len(s) == per_rank for s in shards)
    seen = [i for s in shards for b in s for i in b]
    assert len(seen) == len(set(seen))
    dropped = full[per_rank * world_size :]  # the remainder, dropped so ranks stay in step
    assert sorted(seen + [i for b in dropped for i in b]) == list(range(500))


def test_resume_from_state_gives_identical_remaining_sequence():
    reference = list(islice(iter(sampler()), 150))  # crosses into the second epoch
    n_epoch0 = len(sampler().epoch_batches(0))
    assert n_epoch0 == 117
    first = sampler()
    it = iter(first)
    head = [next(it) for _ in range(25)]
    state = first.state_dict()
    assert state == {"epoch": 0, "position": 25}
    resumed = sampler()
    resumed.load_state_dict(state)
    assert head + list(islice(iter(resumed), 125)) == reference
    assert resumed.state_dict() == {"epoch": 1, "position": 150 - n_epoch0}


def test_pairs_over_budget_alone_are_skipped_and_counted():
    s = TokenBudgetSampler(np.array([3, 300, 4]), np.array([2, 2, 500]), 100, 100, seed=0)
    assert s.n_skipped == 2
    assert s.epoch_batches(0) == [[0]]


def test_bad_rank_rejected():
    with pytest.raises(ValueError, match="rank 2 outside world_size 2"):
        sampler(rank=2, world_size=2)
