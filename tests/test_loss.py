"""label_smoothed_nll equals F.cross_entropy(label_smoothing=...) in value and gradient."""

import pytest
import torch
import torch.nn.functional as F

from aiayn.train.loss import label_smoothed_nll

PAD = 1


def _case(N: int = 37, V: int = 53, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, V, generator=g, dtype=torch.float64) * 3
    target = torch.randint(0, V, (N,), generator=g)
    target[::5] = PAD  # some padding positions
    return logits, target


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
@pytest.mark.parametrize("ignore", [PAD, -100])
def test_matches_cross_entropy(eps: float, ignore: int) -> None:
    logits, target = _case()
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    loss, nll = label_smoothed_nll(a, target, eps, ignore)
    ref = F.cross_entropy(b, target, label_smoothing=eps, ignore_index=ignore, reduction="sum")
    ref_nll = F.cross_entropy(b.detach(), target, ignore_index=ignore, reduction="sum")
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-12, atol=1e-10)
    (loss * 0.37).backward()
    (ref * 0.37).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_pinned_value() -> None:
    # Two positions, V = 4: by hand, loss = sum_i lse_i - 0.9 x_t - 0.1 mean(x).
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    loss, nll = label_smoothed_nll(logits, torch.tensor([3, 0]), 0.1)
    lse0 = torch.logsumexp(logits[0], 0).item()  # 3.4401896985611957
    assert nll.item() == pytest.approx(
        (lse0 - 3.0) + (1.0 + torch.log(torch.tensor(4.0)).item() - 1.0)
    )
    assert loss.item() == pytest.approx(
        lse0 - 0.9 * 3.0 - 0.1 * 1.5 + torch.log(torch.tensor(4.0)).item()
    )


def test_gradient_of_both_outputs() -> None:
    logits, target = _case(N=6, V=7, seed=1)
    x = logits.clone().requires_grad_()
    torch.autograd.gradcheck(lambda t: label_smoothed_nll(t, target, 0.1, PAD), (x,))


def test_float32_matches() -> None:
    logits, target = _case(N=200, V=1000, seed=2)
    a = logits.float().requires_grad_()
    b = logits.float().requires_grad_()
    label_smoothed_nll(a, target, 0.1, PAD)[0].backward()
    F.cross_entropy(b, target, label_smoothing=0.1, ignore_index=PAD, reduction="sum").backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_computed_in_float32(dtype: torch.dtype) -> None:
    # mixed precision hands the loss its logits as they are: the same bits as casting them
    # to fp32 first, the gradient back in their own dtype
    logits, target = _case(N=64, V=300, seed=3)
    low = logits.to(dtype)
    a = low.clone().requires_grad_()
    b = low.clone().requires_grad_()
    loss, nll = label_smoothed_nll(a, target, 0.1, PAD)
    ref, ref_nll = label_smoothed_nll(b.float(), target, 0.1, PAD)
    assert loss.dtype == nll.dtype == torch.float32
    assert torch.equal(loss, ref) and torch.equal(nll, ref_nll)
    (loss * 0.37).backward()
    (ref * 0.37).backward()
    assert a.grad is not None and a.grad.dtype == dtype
    assert torch.equal(a.grad, b.grad)


def test_low_precision_graph_refuses_a_second_backward() -> None:
    # its gradient is made in the log-probabilities' buffer: a second pass must not read it
    logits, target = _case(N=8, V=20, seed=4)
    x = logits.bfloat16().requires_grad_()
    loss, _ = label_smoothed_nll(x, target, 0.1, PAD)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
