"""The one MFU yardstick (aiayn.runtime.flops): model FLOPs worked out by hand, padding not counted."""

from __future__ import annotations

import pytest
import torch

from aiayn.config import ModelConfig
from aiayn.runtime.flops import (
    PROBE_SIDE,
    forward_flops,
    mfu,
    paper_cost,
    real_lengths,
    square_side,
    training_flops,
)

# d_model 4, h 2, d_ff 8, one layer each side, 10 words; one pair of s = 3 source and t = 2
# target positions. Per position: W_Q, W_K, W_V, W_O 4 * (2 * 4 + 4) + 4 * 4 = 64 and the
# feed-forward 2 * 4 * 8 = 64 -> 128 MACs; per (query, key) pair QK^T + AV: 4 + 4 = 8.
#   encoder:  3 * 128 + 3 * 3 * 8                                   = 384 + 72           =  456
#   decoder:  2 * 128 + 2 * 2 * 8 (self) + 2 * (16 + 16) (cross Q, O)
#             + 3 * 4 * 8 (memory K, V) + 2 * 3 * 8 (cross pairs)   = 256 + 32 + 64 + 96 + 48 = 496
#   output:   2 * 4 * 10                                                                 =   80
# 1032 MACs = 2064 FLOPs forward, 6192 for forward + backward.
TINY = ModelConfig(N_enc=1, N_dec=1, d_model=4, h=2, d_ff=8, vocab_size=10)
# d_k = d_v = 3 (Table 3 row B style): 6 + 6 = 12 per pair, 2 * 4 * 12 + 64 = 160 per position.
#   encoder 3 * 160 + 9 * 12 = 588; decoder 2 * 160 + 4 * 12 + 2 * 4 * 12 + 3 * 4 * 12 + 6 * 12 = 680;
#   output 80 -> 1348 MACs, 8088 FLOPs for training.
WIDE_HEADS = ModelConfig(N_enc=1, N_dec=1, d_model=4, h=2, d_k=3, d_v=3, d_ff=8, vocab_size=10)


@pytest.mark.parametrize("cfg, forward, training", [(TINY, 2064, 6192), (WIDE_HEADS, 2696, 8088)])
def test_flops_of_one_pair_by_hand(cfg, forward, training):
    assert forward_flops(cfg, [3], [2]) == forward
    assert training_flops(cfg, [3], [2]) == training


def test_paper_base_on_one_token_is_six_times_its_matmul_weights():
    # A one-token pair passes every matmul weight once: 6 layers x (4 d^2 + 2 d d_ff) in the
    # encoder, 6 x (8 d^2 + 2 d d_ff) in the decoder, d x V out = 62,984,192 (the 63,082,496
    # parameters of test_model.py less 98,304 biases and LayerNorm gains), plus one query-key
    # pair per attention: 6 x 1024 + 6 x 2 x 1024 = 18,432. Training: 6 x 63,002,624.
    assert training_flops(ModelConfig(), [1], [1]) == 6 * 63_002_624


def test_a_batch_is_the_sum_of_its_pairs_and_padding_is_not_counted():
    pad = 0
    src = torch.tensor([[5, 6, 2, pad, pad], [5, 6, 7, 8, 2]])
    tgt_out = torch.tensor([[5, 2, pad, pad], [5, 6, 7, 2]])
    assert (real_lengths(src, pad), real_lengths(tgt_out, pad)) == ([3, 5], [2, 4])
    together = training_flops(TINY, real_lengths(src, pad), real_lengths(tgt_out, pad))
    assert together == training_flops(TINY, [3], [2]) + training_flops(TINY, [5], [4])
    assert together < training_flops(TINY, [5, 5], [4, 4])  # what counting the padding gave
    with pytest.raises(ValueError, match="2 source lengths but 1 target lengths"):
        training_flops(TINY, [3, 5], [2])


def test_mfu_is_counted_flops_over_the_papers_cost_estimate():
    # 1e12 FLOPs in 10 s on one device of 2e11 FLOP/s: half of the 2e12 it could have done.
    assert mfu(1e12, 10.0, 2e11) == pytest.approx(0.5)
    assert mfu(1e12, 10.0, 2e11, devices=2) == pytest.approx(0.25)
    assert paper_cost(10.0, 2, 2e11) == pytest.approx(4e12)


def test_the_peaks_squares_shrink_to_fit_the_measures_time():
    assert square_side(0.8e-3, 2048, 1.0) == 2048  # fp32 at 256 on a 2-core AVX2 VM
    assert square_side(2.0e-3, 2048, 1.0) == 1024  # 17 GFLOP/s at 256: 2048 would take ~1 s
    assert square_side(26.8e-3, 2048, 1.0) == 512  # emulated bf16 (63.8 s for one at 2048)
    assert square_side(10.0, 2048, 1.0) == PROBE_SIDE  # never below the probe
    assert square_side(1e-5, 4096, 1.0) == 4096  # a GPU: launch-bound at 256, 4096 as before
