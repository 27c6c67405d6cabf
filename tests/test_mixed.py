"""train.mixed.WeightCopies: bf16 copies of the linears' weights, cast once per update, train to
autocast's weights bit for bit; a bf16 update casts about once per parameter tensor."""

from collections import Counter

import torch
from _cli import TINY, config
from torch.profiler import ProfilerActivity, profile

from aiayn import ModelConfig, Transformer
from aiayn.runtime import BF16_MATMULS
from aiayn.train.loss import label_smoothed_nll
from aiayn.train.mixed import WeightCopies
from aiayn.train.trainer import Trainer

PAD = 0
BF16 = 15  # torch.bfloat16's ScalarType number, as the profiler records a dtype argument


def bf16_casts(run) -> Counter[str]:
    """The ``aten::_to_copy`` casts from or to bf16 that ``run()`` makes, by input shape, as
    torch.profiler sees them (also the casts a kernel makes of a mixed-dtype input)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    casts: Counter[str] = Counter()
    for e in prof.events():
        if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0]:
            to_bf16 = e.concrete_inputs[1] == BF16  # _to_copy(self, dtype, ...)
            if to_bf16 or e.input_dtypes[0] == "c10::BFloat16":
                casts[str(e.input_shapes[0])] += 1
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


def test_a_bf16_update_casts_about_once_per_parameter_tensor(
    tiny_corpus, tmp_path, bf16_answer
) -> None:
    # autocast alone cast each weight at every forward and its gradient at every backward,
    # dropout's masks and attention's q, k and v one by one: 291 casts for these 97 tensors.
    # On both attention paths: a native-bf16 class measured to take the bf16 matmuls (its fp32
    # softmax had cast four (B, h, T, S) tensors a call: 1.49 casts a parameter tensor).
    layers = {**TINY, "N_enc": 3, "N_dec": 3}  # the small config's 97 parameter tensors
    trainer = Trainer(config(tiny_corpus, tmp_path, amp="bf16", model=layers))  # dropout 0.1
    assert (trainer.attention == BF16_MATMULS) == (bf16_answer == "native")
    batches = iter(trainer.sampler)
    trainer.train_update(batches)  # the first update's one-off work out of the way
    casts = bf16_casts(lambda: trainer.train_update(batches))
    params = len(list(trainer.model.parameters()))
    assert sum(casts.values()) <= 1.2 * params, casts
