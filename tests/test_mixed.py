"""train.mixed.WeightCopies: bf16 copies of the linears' weights, cast once per update, train to
autocast's weights bit for bit; a bf16 update casts about once per parameter tensor."""

from collections import Counter

import pytest
import torch
from _cli import TINY, config
from torch.profiler import ProfilerActivity, profile

from aiayn import ModelConfig, Transformer
from aiayn.runtime.kernels import BF16_MATMULS
from aiayn.train.loss import label_smoothed_nll
from aiayn.train.mixed import WeightCopies
from aiayn.train.trainer import Trainer

PAD = 0
BF16 = 15  # torch.bfloat16's ScalarType number, as the profiler records a dtype argument
BF16_NAME = "c10::BFloat16"  # as the profiler names a bf16 input


def step_casts(run) -> Counter[str]:
    """The casts between fp32 and bf16 that ``run()`` makes, as torch.profiler sees them, by
    kind: "per use" (``aten::_to_copy``: autocast's casts, those a kernel makes of a mixed-dtype
    input, the model's own), "weights" and "gradients" (in-place ``copy_`` into a bf16 copy of a
    master, or into a master's fp32 gradient: ``WeightCopies``)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    casts: Counter[str] = Counter()
    for e in prof.events():
        if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0]:
            to_bf16 = e.concrete_inputs[1] == BF16  # _to_copy(self, dtype, ...)
            if to_bf16 or e.input_dtypes[0] == BF16_NAME:
                casts["per use"] += 1
        elif e.name == "aten::copy_" and e.input_dtypes[0] != e.input_dtypes[1]:
            if e.cpu_parent is None or e.cpu_parent.name != "aten::_to_copy":  # counted above
                casts["weights" if e.input_dtypes[0] == BF16_NAME else "gradients"] += 1
    return casts


def _train(copies: bool, updates: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> Transformer:
    """A 2+2-layer model with dropout, trained in bf16 autocast on ``updates`` (micro-batches of
    (src, tgt) each), the linears' weights from ``WeightCopies`` or cast by autocast."""
    torch.manual_seed(0)
    cfg = ModelConfig(N_enc=2, N_dec=2, d_model=32, d_ff=64, h=4, vocab_size=50, pad_id=PAD)
    model = Transformer(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    forward = WeightCopies(model, torch.bfloat16 if copies else None)
    torch.manual_seed(1)  # the dropout masks
    for micro_batches in updates:
        forward.refresh()
        for src, tgt in micro_batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = forward(src, tgt[:, :-1], output_mask=tgt[:, 1:] != PAD)
            target = tgt[:, 1:][tgt[:, 1:] != PAD]
            label_smoothed_nll(logits.float(), target, 0.1, PAD)[0].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def test_weight_copies_train_to_autocasts_weights_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(2)
    pairs = [
        (torch.randint(1, 50, (4, 7), generator=g), torch.randint(1, 50, (4, 6), generator=g))
        for _ in range(3)
    ]
    updates = [[pair] for pair in pairs] + [pairs[:2]]  # two micro-batches: summed in fp32
    a, b = _train(False, updates), _train(True, updates)
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(x, y), name  # the tied embedding too: its gradient order is kept
        assert y.dtype == torch.float32  # the masters


def test_fp32_is_the_module_itself() -> None:
    model = Transformer(ModelConfig(N_enc=1, N_dec=1, d_model=16, d_ff=32, h=2, vocab_size=20))
    forward = WeightCopies(model, None)
    forward.refresh()
    src = torch.randint(1, 20, (2, 5))
    torch.manual_seed(0)
    want = model(src, src)
    torch.manual_seed(0)
    assert torch.equal(forward(src, src), want)


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.slow
def test_a_bf16_update_casts_each_weight_once_and_under_once_per_parameter_tensor_a_micro_batch(
    tiny_corpus, tmp_path, bf16_answer, micro_batches
) -> None:
    # Autocast alone cast each weight at every forward and its gradient at every backward: 291
    # per-use casts for these 97 tensors. With the linears' copies, what is left per micro-batch
    # is activations crossing autocast's boundaries (LayerNorm outputs into a linear, dropout's
    # fp32 mask, the loss, the tied embedding): 72 on the bf16-matmul attention path (108 when
    # the heads went back to fp32 before W_O), and on the fp32-attention path (an emulated
    # class) 114, its q, k, v and output each cast to fp32 and back.
    layers = {**TINY, "N_enc": 3, "N_dec": 3}  # the small config's 97 parameter tensors
    cfg = config(tiny_corpus, tmp_path, amp="bf16", model=layers, update_freq=micro_batches)
    trainer = Trainer(cfg)  # dropout 0.1
    native = bf16_answer == "native"
    assert (trainer.attention == BF16_MATMULS) == native
    batches = iter(trainer.sampler)
    trainer.train_update(batches)  # the first update's one-off work out of the way
    casts = step_casts(lambda: trainer.train_update(batches))
    params = len(list(trainer.model.parameters()))
    copied = len(trainer.step_model.masters)  # every linear's weight and bias
    assert copied >= params // 2, copied
    assert casts["weights"] == copied, casts  # once per update, however many micro-batches
    assert casts["gradients"] == copied * micro_batches, casts
    per_param = 1.0 if native else 1.2
    assert casts["per use"] <= per_param * params * micro_batches, casts
