"""runtime.kernels.UniformDropout: nn.Dropout's distribution (each element dropped with probability p, the
kept ones scaled so that the expectation is the input), from 16 random bits an element on the
CPU; identity in eval."""

import pytest
import torch

from aiayn.runtime.kernels import UniformDropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_keep_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = UniformDropout(p).train()(x)
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=2e-3)  # 1e6 draws: sd 5e-4
    dropped = round(p * 2**16)  # p in steps of 2^-16; the scale is exact for that p
    assert torch.all(y[kept] == torch.tensor(2**16 / (2**16 - dropped), dtype=torch.float32))


def test_a_bf16_input_keeps_its_expectation() -> None:
    # Compared in bf16, uniform < 0.9 kept 89.8% scaled by 1.109: 0.3% short, 10 sd here.
    torch.manual_seed(2)
    x = torch.ones(1000, 1000, dtype=torch.bfloat16)
    y = UniformDropout(0.1).train()(x)
    assert y.dtype == torch.float32  # the mask's: the residual sum it feeds is fp32 anyway
    assert (y != 0).float().mean().item() == pytest.approx(0.9, abs=1.5e-3)  # sd 3e-4
    assert y.mean().item() == pytest.approx(1.0, abs=1.5e-3)  # sd 3.3e-4


def test_the_mask_is_uniform_over_positions() -> None:
    # four mask elements come from each 64-bit draw: no lane (position mod 4) may keep more
    torch.manual_seed(3)
    kept = keep_mask(torch.Size([4000, 1000]), 0.1) != 0  # 1e6 per lane
    by_lane = kept.view(-1, 4).float().mean(0)
    assert torch.allclose(by_lane, torch.full((4,), 0.9), atol=1.5e-3)  # sd 3e-4


def test_gradient_is_the_mask() -> None:
    torch.manual_seed(1)
    x = torch.randn(64, 32, requires_grad=True)
    y = UniformDropout(0.1).train()(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad * x.detach(), y.detach())


def test_eval_and_p0_are_identity() -> None:
    x = torch.randn(8, 8)
    assert UniformDropout(0.1).eval()(x) is x
    assert torch.equal(UniformDropout(0.0).train()(x), x)
