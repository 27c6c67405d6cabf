"""bf16 autocast training on a CPU: attention computed in fp32, the same model as in fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_model import PAD, batch, make

from aiayn import model as model_module
from aiayn.model import attention_precision, fused_attention, reference_attention


def test_attention_on_a_cpu_computes_in_fp32_whatever_the_activations():
    cpu = torch.device("cpu")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert attention_precision(cpu, dtype) == "fp32"
    cuda = torch.device("cuda")
    assert attention_precision(cuda, torch.bfloat16) == "bf16"
    assert attention_precision(cuda, torch.float32) == "fp32"


def test_bf16_attention_under_autocast_is_fp32_attention_of_the_bf16_inputs(monkeypatch):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8, generator=g).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(args[0].dtype)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_attention(q, k, v, mask, scale=8**-0.5)
    assert seen == [torch.float32] and out.dtype == torch.bfloat16
    want, _ = reference_attention(q.float(), k.float(), v.float(), mask, 8**-0.5)
    assert torch.allclose(out.float(), want.bfloat16().float(), atol=0)  # only the final rounding
    out.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and q.grad.abs().sum() > 0


def test_a_bf16_forward_and_backward_stays_close_to_fp32_and_padding_stays_invisible():
    model = make(P_drop=0.0)
    src, tgt = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(src, tgt).float()
    full = model(src, tgt)
    assert (low - full).abs().max() < 0.05 * full.abs().max()
    # the same sentences padded to a wider batch: bf16 only in the last bits, never the padding
    wider = torch.cat([src, torch.full((src.size(0), 5), PAD)], dim=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        padded = model(wider, tgt).float()
    assert torch.allclose(padded[..., 1:], low[..., 1:], atol=0.05)
    loss = low.logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("amp", ["bf16", "none"])
def test_the_trainers_summary_names_the_attention_path(tiny_corpus, tmp_path, monkeypatch, amp):
    from _cli import config

    from aiayn.train import trainer as trainer_module
    from aiayn.train.trainer import Trainer

    monkeypatch.setattr(trainer_module, "measure_matmul_peak", lambda *args: 1e11)
    summary = Trainer(config(tiny_corpus, tmp_path / "run", amp=amp)).run()
    assert summary["resolved"]["amp"] == {"bf16": "bf16", "none": "fp32"}[amp]
    assert summary["attention"] == "SDPA in fp32"
