"""model.UniformDropout: the same mask distribution and scaling as nn.Dropout, identity in eval."""

import pytest
import torch

from aiayn.model import UniformDropout


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_keep_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = UniformDropout(p).train()(x)
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=2e-3)  # 1e6 draws: sd 5e-4
    assert torch.all(y[kept] == torch.tensor(1 / (1 - p), dtype=torch.float32))


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
