"""The fast paths (aiayn.runtime.kernels): bf16 attention on a CPU computed in fp32 or as bf16 matmuls,
and what installing them changes in a model (its speed, not its function)."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from _tiny_models import PAD, batch
from _tiny_models import make as make_paper

from aiayn import ModelConfig, Transformer
from aiayn.model import attention_mask, reference_attention
from aiayn.runtime import kernels as runtime_module
from aiayn.runtime.kernels import (
    BF16_MATMULS,
    UniformDropout,
    attention_precision,
    bf16_matmul_attention,
    fused_attention,
    matmul_attention,
    use_fast_paths,
)

make = partial(make_paper, fast=True)  # the fast paths, as training and decoding run the model


@pytest.mark.parametrize("overrides", [{}, {"norm": "pre"}, {"attention_window": 2}])
def test_the_fast_paths_leave_an_fp32_models_outputs_and_weights_as_they_were(overrides):
    torch.manual_seed(0)
    paper = Transformer(ModelConfig.preset("tiny", **overrides)).eval()
    fast = make(**overrides)
    assert paper.state_dict().keys() == fast.state_dict().keys()
    assert all(
        torch.equal(a, b) for a, b in zip(paper.state_dict().values(), fast.state_dict().values())
    )
    src, tgt = batch()
    for rows in (slice(None), slice(0, 1)):  # with padding, and a sentence without any
        assert torch.allclose(fast(src[rows], tgt[rows]), paper(src[rows], tgt[rows]), atol=1e-6)


def test_the_fast_paths_replace_every_dropout_keeping_its_rate_and_mode():
    model = use_fast_paths(Transformer(ModelConfig.preset("tiny", P_drop=0.25)).train())
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(type(m) is UniformDropout for m in dropouts)
    assert all(m.p == 0.25 and m.training for m in dropouts)
    assert model.kernels.key_padding is runtime_module.key_padding
    assert use_fast_paths(model) is model  # again: nothing left to replace


# --- bf16 autocast on a CPU: attention computed in fp32, the same model as in fp32 ---------------


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

    monkeypatch.setattr(runtime_module.F, "scaled_dot_product_attention", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_attention(q, k, v, mask, scale=8**-0.5)
    assert seen == [torch.float32] and out.dtype == torch.bfloat16
    want, _ = reference_attention(q.float(), k.float(), v.float(), mask, 8**-0.5)
    assert torch.allclose(out.float(), want.bfloat16().float(), atol=0)  # only the final rounding
    out.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and q.grad.abs().sum() > 0


def test_a_bf16_training_forward_runs_every_attention_in_fp32(monkeypatch):
    # q, k and v come cast to fp32 once per projection (for_attention); autocast, which runs
    # SDPA in bf16, must not take them back
    dtypes = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        dtypes.append(out.dtype)
        return out

    monkeypatch.setattr(runtime_module.F, "scaled_dot_product_attention", spy)
    model = make(P_drop=0.1).train()
    src, tgt = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(src, tgt)
    assert dtypes == [torch.float32] * (model.cfg.N_enc + 2 * model.cfg.N_dec)


@pytest.mark.parametrize("matmuls", [False, True])
def test_a_bf16_forward_and_backward_stays_close_to_fp32_and_padding_stays_invisible(matmuls):
    model = make(P_drop=0.0)
    src, tgt = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16), bf16_matmul_attention(matmuls):
        low = model(src, tgt).float()
    full = model(src, tgt)
    assert (low - full).abs().max() < 0.05 * full.abs().max()
    # the same sentences padded to a wider batch: bf16 only in the last bits, never the padding
    wider = torch.cat([src, torch.full((src.size(0), 5), PAD)], dim=1)
    with torch.autocast("cpu", dtype=torch.bfloat16), bf16_matmul_attention(matmuls):
        padded = model(wider, tgt).float()
    assert torch.allclose(padded[..., 1:], low[..., 1:], atol=0.05)
    loss = low.logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_bf16_matmul_attention_is_chosen_only_inside_its_context_under_cpu_autocast():
    cpu = torch.device("cpu")
    with bf16_matmul_attention():
        assert attention_precision(cpu, torch.bfloat16) == "fp32"  # no autocast: decoding
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert attention_precision(cpu, torch.bfloat16) == BF16_MATMULS
            assert attention_precision(cpu, torch.float32) == "fp32"
            with bf16_matmul_attention(False):
                assert attention_precision(cpu, torch.bfloat16) == "fp32"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention_precision(cpu, torch.bfloat16) == "fp32"


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_matmul_attention_is_the_papers_attention_with_bf16_products_and_no_sdpa(
    monkeypatch, causal
):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    keys = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    keys[1, ..., 4:] = False  # sentence 1: its last two keys are padding
    mask = attention_mask(6, 6, q.device, causal=True) if causal else keys
    want, _ = reference_attention(q, k, v, mask, 8**-0.5)
    monkeypatch.setattr(runtime_module.F, "scaled_dot_product_attention", None)  # never called
    low = [t.bfloat16().requires_grad_() for t in (q, k, v)]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16), bf16_matmul_attention():
            return fused_attention(q, k, v, None if causal else keys, 8**-0.5, is_causal=causal)

    out = attend(*low)
    assert out.dtype == torch.bfloat16
    assert 0 < (out.double() - want).abs().max() < 3e-2  # the bf16 roundings, nothing more
    # what a query may not see changes nothing: its probability is exactly 0
    moved = [t.detach().clone() for t in low]
    for t in moved[1:]:
        if causal:
            t[:, :, 4:] += 100  # the last keys, unseen by the first four queries
        else:
            t[1, :, 4:] += 100  # the padded keys
    again = attend(*moved)
    seen = (slice(None), slice(None), slice(0, 4)) if causal else (slice(None),)
    assert torch.equal(again[seen], out.detach()[seen])
    out.float().sum().backward()
    assert all(t.grad.dtype == torch.bfloat16 and t.grad.abs().sum() > 0 for t in low)


def test_bf16_matmul_attention_drops_probabilities_and_scales_the_kept_ones():
    q = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)  # equal scores: every probability 1/64
    k = torch.zeros(1, 1, 64, 8, dtype=torch.bfloat16)
    v = torch.eye(64, dtype=torch.bfloat16)[None, None]  # (1, 1, 64, 64): out = the weights
    torch.manual_seed(0)
    out = matmul_attention(q, k, v, None, 1.0, dropout_p=0.5).float()
    kept = out != 0
    assert 0.3 < kept.float().mean() < 0.7  # about half of the probabilities dropped
    assert torch.all(out[kept] == 2 / 64)  # the kept ones scaled by 1 / (1 - p), exactly


@pytest.mark.parametrize(
    ("amp", "pays", "attention"),
    [("bf16", False, "SDPA in fp32"), ("bf16", True, BF16_MATMULS), ("none", True, "SDPA in fp32")],
)
def test_the_trainers_summary_names_the_attention_path(
    tiny_corpus, tmp_path, monkeypatch, amp, pays, attention
):
    from _cli import config

    from aiayn.runtime import figures as measured
    from aiayn.train.trainer import Trainer

    decision = measured.Decision(pays, "a figure")
    monkeypatch.setattr(measured, "train_bf16_matmul_attention", lambda chip: decision)
    trainer = Trainer(config(tiny_corpus, tmp_path / "run", amp=amp))
    paths = []
    real = runtime_module.matmul_attention
    monkeypatch.setattr(runtime_module, "matmul_attention", lambda *a: paths.append(1) or real(*a))
    summary = trainer.run()
    assert summary["resolved"]["amp"] == {"bf16": "bf16", "none": "fp32"}[amp]
    assert summary["attention"] == attention
    assert bool(paths) is (attention == BF16_MATMULS)  # the path named is the path taken
