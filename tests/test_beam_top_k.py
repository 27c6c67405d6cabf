"""``beam.top_k``: the search's top-k by blocks, the beams' scores added where it looks,
gives what ``Tensor.topk`` gives of the summed candidates."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.decode import beam
from aiayn.decode.beam import TOP_K_BLOCK, top_k


@pytest.fixture(autouse=True)
def blocks_for_any_size(monkeypatch):
    """Blocks however few the elements, so that small cases test them."""
    monkeypatch.setattr(beam, "TOP_K_BLOCKS_FROM", 0)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5),
    beams=st.integers(1, 4),
    blocks=st.integers(0, 40),
    rest=st.integers(0, TOP_K_BLOCK - 1),
    k=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    impossible=st.floats(0.0, 0.99),
)
def test_top_k_is_topk(rows, beams, blocks, rest, k, seed, impossible):
    """Values equal topk's of x + offsets, best first, bit for bit, and each index holds its
    value; -inf (impossible candidates) ties as the search makes them: only the values must
    agree there."""
    length = blocks * TOP_K_BLOCK + rest
    if beams * length < k:
        return
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, beams, length, generator=gen)
    x[torch.rand(rows, beams, length, generator=gen) < impossible] = float("-inf")
    offsets = -10 * torch.rand(rows, beams, generator=gen)  # log P of the prefixes: <= 0
    summed = (x + offsets[..., None]).view(rows, beams * length)
    values, indices = top_k(x.clone(), k, offsets)
    want = summed.topk(k, dim=1)
    assert torch.equal(values, want.values)
    assert torch.equal(summed.gather(1, indices), values)
    assert all(len(set(row)) == k for row in indices.tolist())  # k distinct columns
    finite = values > float("-inf")
    assert torch.equal(indices[finite], want.indices[finite])


def test_top_k_finds_the_best_in_one_block():
    """All k best in one block, and the best of all in the columns after the last block."""
    x = torch.zeros(1, 1, 40 * TOP_K_BLOCK + 3)
    x[0, 0, 7 * TOP_K_BLOCK : 7 * TOP_K_BLOCK + 4] = torch.tensor([5.0, 4.0, 3.0, 2.0])
    x[0, 0, -1] = 9.0
    values, indices = top_k(x, 4)
    assert values.tolist() == [[9.0, 5.0, 4.0, 3.0]]
    assert indices.tolist() == [
        [x.size(2) - 1, 7 * TOP_K_BLOCK, 7 * TOP_K_BLOCK + 1, 7 * TOP_K_BLOCK + 2]
    ]


def test_top_k_ranks_blocks_by_their_beams_score():
    """A block of the second beam wins over a better-looking block of the first once the beams'
    scores are added, and the columns after a row's last block get their own beam's score."""
    V = 40 * TOP_K_BLOCK + 3
    x = torch.full((1, 2, V), -50.0)
    x[0, 0, 3] = -1.0  # beam 0's best token, but beam 0's prefix is unlikely
    x[0, 1, 5 * TOP_K_BLOCK] = -2.0
    x[0, 1, V - 1] = -3.0  # after beam 1's last whole block
    values, indices = top_k(x, 3, torch.tensor([[-10.0, -0.5]]))
    assert values.tolist() == [[-2.5, -3.5, -11.0]]
    assert indices.tolist() == [[V + 5 * TOP_K_BLOCK, 2 * V - 1, 3]]
