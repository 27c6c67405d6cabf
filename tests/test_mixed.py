"""train.mixed.WeightCopies: bf16 copies of the linears' weights, cast once per update, train to
autocast's weights bit for bit; a bf16 update casts about once per parameter tensor."""

from collections import Counter

import torch
from _cli import TINY, config
from torch.utils._python_dispatch import TorchDispatchMode

from aiayn import ModelConfig, Transformer
from aiayn.train.loss import label_smoothed_nll
from aiayn.train.mixed import WeightCopies
from aiayn.train.trainer import Trainer

PAD = 0


class CastCounter(TorchDispatchMode):
    """Counts the tensors each ``aten::_to_copy`` dtype cast is given, by (from, to) dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: Counter[tuple[torch.dtype, torch.dtype]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and out.dtype != args[0].dtype:
            self.casts[args[0].dtype, out.dtype] += 1
        return out


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


def test_a_bf16_update_casts_about_once_per_parameter_tensor(tiny_corpus, tmp_path) -> None:
    # autocast alone cast each weight at every forward and its gradient at every backward,
    # dropout's masks and the attention's q, k and v one by one: 190 casts for 65 tensors here
    layers = {**TINY, "N_enc": 2, "N_dec": 2}
    trainer = Trainer(config(tiny_corpus, tmp_path, amp="bf16", model=layers))  # dropout 0.1
    batches = iter(trainer.sampler)
    trainer.train_update(batches)  # the first update's one-off work out of the way
    with CastCounter() as counter:
        trainer.train_update(batches)
    params = len(list(trainer.model.parameters()))
    assert sum(counter.casts.values()) <= 1.2 * params, counter.casts
