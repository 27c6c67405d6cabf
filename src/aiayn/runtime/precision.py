"""The number format a model decodes in: fp32, or bf16 weights and activations (``--precision``).

    precision = policy.choose_precision("auto", "cpu")   # Precision(name="fp32", reason="...")
    model = for_decoding(model, precision=precision.name)

bf16 halves the bytes of weights a decode step streams, which is what a step's time is on the
CPU; it pays only where the chip computes in bf16 natively (``hardware.bf16_support``). Only
the weights and the activations are bf16: the searches take ``log_softmax`` of the logits in
fp32 (``beam.output_log_probs``) and keep the beams' scores in fp32 / float64, so the ranking
of hypotheses is not decided by bf16 rounding, only the logits it starts from.

``auto`` chooses bf16 only where it is native *and* measured on the chip's class to be faster
than fp32 on the demo model's test split, within 0.2 SacreBLEU, with no difference sacrebleu's
paired bootstrap finds (``measured.decode_rule``, docs/decoding.md#precision). int8
(``--quantize int8``) keeps fp32 activations: bf16 with it is refused. The choice is
``aiayn.policy``'s (``choose_precision``, ``decoder_attention``); this module casts the model.
"""

from __future__ import annotations

import torch

from ..model import Transformer
from .kernels import ModuleT, fast_kernels
from .policy import decoder_attention


@torch.no_grad()
def to_bf16(model: ModuleT, attention: str | None = None) -> ModuleT:
    """The model's weights and buffers (the positional encoding) as bf16, in place; every
    activation then follows, since each op computes in its inputs' dtype, but the decoder's
    attention, which computes in ``attention`` ("fp32" or "bf16", the model's
    ``Kernels.decode_attention`` that ``decode.cache`` reads; default: ``decoder_attention`` of
    the model's device). The encoder's attention computes as in training (``fast_kernels``:
    fp32 on a CPU)."""
    if attention is None:
        attention = decoder_attention(next(model.parameters()).device)
    if attention not in ("fp32", "bf16"):
        raise ValueError(f"attention in fp32 or bf16, not {attention!r}")
    for module in list(model.modules()):
        if isinstance(module, Transformer):
            module.use_kernels(fast_kernels(decode_attention=attention))
    return model.to(torch.bfloat16).eval()
