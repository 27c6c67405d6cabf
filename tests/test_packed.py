"""Linear weights packed for oneDNN (``aiayn.runtime.packed``): the same model, computed faster.

Equality of whole beam-search outputs is pinned by the golden test (tests/test_decode_golden.py,
the "packed" cases); here: logits, what packing replaces and keeps, and the fallback.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import aiayn
from aiayn.decode import for_decoding
from aiayn.decode.cache import decode_step, new_cache
from aiayn.runtime import packed
from aiayn.runtime.kernels import use_fast_paths
from aiayn.runtime.precision import to_bf16

pytestmark = pytest.mark.skipif(
    not packed.available(), reason="this PyTorch has no oneDNN linear ops"
)


def model_pair(**overrides) -> tuple[aiayn.Transformer, aiayn.Transformer]:
    """A random tiny model, with the fast paths as a loaded one, and a packed copy of it."""
    torch.manual_seed(0)
    plain = use_fast_paths(aiayn.Transformer(aiayn.ModelConfig.preset("tiny", **overrides)))
    plain.eval()
    copy = aiayn.Transformer(plain.cfg).eval()
    copy.load_state_dict(plain.state_dict())
    return plain, for_decoding(copy)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 100, (3, 9), generator=g)
    src[1, 6:] = 0  # padding
    return src, torch.randint(4, 100, (3, 7), generator=g)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm": "pre"},
        {"attention_window": 2},
        {"activation": "swish", "output_bias": True},  # an imported OPUS-MT model's
        {"activation": "gelu"},
    ],
)
def test_packed_logits_equal_plain(overrides):
    plain, fast = model_pair(**overrides)
    src, tgt = batch()
    with torch.no_grad():
        full_plain, full_fast = plain(src, tgt), fast(src, tgt)
    assert full_fast.shape == full_plain.shape
    torch.testing.assert_close(full_fast, full_plain, atol=1e-4, rtol=1e-4)
    # Incremental decoding too, where the rows per matmul are few (what packing is for).
    mask = plain.src_mask(src)
    cache_plain = new_cache(plain, plain.encode(src), mask, max_len=8)
    cache_fast = new_cache(fast, fast.encode(src), mask, max_len=8)
    for t in range(tgt.size(1)):
        step_plain = decode_step(plain, tgt[:, t : t + 1], cache_plain)
        step_fast = decode_step(fast, tgt[:, t : t + 1], cache_fast)
        torch.testing.assert_close(step_fast, step_plain, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(step_fast, full_plain[:, t], atol=1e-4, rtol=1e-4)


def test_packing_replaces_every_linear_and_keeps_the_embedding():
    plain, fast = model_pair()
    assert not any(type(m) is nn.Linear for m in fast.modules())
    n_linear = sum(1 for m in plain.modules() if type(m) is nn.Linear)
    assert sum(1 for m in fast.modules() if isinstance(m, packed.PackedLinear)) == n_linear
    # The tied output projection got its own packed copy; the embedding matrix is untouched.
    torch.testing.assert_close(
        fast.src_embed.tokens.weight, plain.src_embed.tokens.weight, atol=0, rtol=0
    )
    # Packed weights are not parameters: nothing to train, save or move by accident.
    assert sum(p.numel() for p in fast.parameters()) < sum(p.numel() for p in plain.parameters())
    assert any(".W_" in k for k in plain.state_dict())
    assert not any(k.startswith("generator") or ".W_" in k for k in fast.state_dict())


def _modules_and_weights(model: nn.Module) -> tuple[list[type], dict[str, torch.Tensor]]:
    return [type(m) for m in model.modules()], {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before) -> bool:
    types, weights = _modules_and_weights(model)
    return (
        types == before[0]
        and weights.keys() == before[1].keys()
        and all(torch.equal(weights[k], before[1][k]) for k in weights)
    )


def test_no_onednn_leaves_the_model_as_it_is(monkeypatch):
    monkeypatch.setattr(packed, "available", lambda: False)
    torch.manual_seed(0)
    model = use_fast_paths(aiayn.Transformer(aiayn.ModelConfig.preset("tiny")))  # as loaded
    before = _modules_and_weights(model)
    assert nn.Linear in before[0]
    assert for_decoding(model) is model and _unchanged(model, before)  # every Linear kept


def test_a_model_not_in_fp32_is_left_alone():
    torch.manual_seed(0)
    model = aiayn.Transformer(aiayn.ModelConfig.preset("tiny")).to(torch.float64)
    before = _modules_and_weights(model)
    assert nn.Linear in before[0]
    packed.pack_linears(model)
    assert _unchanged(model, before)


def test_feed_forward_packs_into_one_fused_call_with_equal_values():
    plain, fast = model_pair()
    ffn, fused = plain.decoder[0].feed_forward, fast.decoder[0].feed_forward
    assert isinstance(fused, packed.PackedFeedForward) and fused.W_1.activation == "relu"
    x = torch.randn(2, 5, plain.cfg.d_model, generator=torch.Generator().manual_seed(2))
    unfused = packed.PackedLinear(ffn.W_2)(torch.relu(packed.PackedLinear(ffn.W_1)(x)))
    with torch.no_grad():
        assert torch.equal(fused(x), unfused)  # max(0, .) inside the call: the same values


def _ops_per_step(model: aiayn.Transformer) -> int:
    """Operators a decode step dispatches from Python (nested ones not counted), beams of 2."""
    src, tgt = batch()
    cache = new_cache(model, model.encode(src), model.src_mask(src), max_len=8)
    decode_step(model, tgt[:, :1], cache)
    cache.select(torch.arange(3).repeat_interleave(2))  # 2 beams per sentence
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        decode_step(model, tgt[:, 1:2].repeat_interleave(2, 0), cache)
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def test_a_packed_decode_step_dispatches_fewer_ops_than_a_plain_one():
    """Each packed linear is one call, as ``F.linear`` is (no reshapes around it), and the
    feed-forward's ReLU runs inside W_1's: a step's ops cost it much of its time at batch 1."""
    plain, fast = model_pair()
    assert _ops_per_step(fast) == _ops_per_step(plain) - plain.cfg.N_dec


def test_bf16_packs_where_native_with_the_values_of_plain_bf16(bf16_answer):
    """bf16 models pack only where the CPU and oneDNN compute bf16 natively, and there the
    logits are bit for bit those of ``F.linear`` in bf16 (so bf16 outputs do not move)."""
    torch.manual_seed(0)
    plain = aiayn.Transformer(aiayn.ModelConfig.preset("tiny")).eval()
    copy = aiayn.Transformer(plain.cfg).eval()
    copy.load_state_dict(plain.state_dict())
    plain = to_bf16(plain)
    fast = for_decoding(copy, precision="bf16")
    packs = bf16_answer == "native" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    n_packed = sum(1 for m in fast.modules() if isinstance(m, packed.PackedLinear))
    assert (n_packed > 0) == packs
    if not packs:
        return
    assert {m.packed.dtype for m in fast.modules() if isinstance(m, packed.PackedLinear)} == {
        torch.bfloat16
    }
    src, tgt = batch()
    with torch.no_grad():
        assert torch.equal(fast(src, tgt), plain(src, tgt))
    mask = plain.src_mask(src)
    cache_plain = new_cache(plain, plain.encode(src), mask, max_len=8)
    cache_fast = new_cache(fast, fast.encode(src), mask, max_len=8)
    for t in range(tgt.size(1)):
        step_plain = decode_step(plain, tgt[:, t : t + 1], cache_plain)
        assert torch.equal(decode_step(fast, tgt[:, t : t + 1], cache_fast), step_plain)
