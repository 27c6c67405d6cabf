"""The number format a model decodes in: fp32, or bf16 weights and activations (``--precision``).

    precision = choose_precision("auto", "cpu")   # Precision(name="fp32", reason="...")
    model = for_decoding(model, precision=precision.name)

bf16 halves the bytes of weights a decode step streams, which is what a step's time is on the
CPU; it pays only where the chip computes in bf16 natively (``hardware.bf16_support``). Only
the weights and the activations are bf16: the searches take ``log_softmax`` of the logits in
fp32 (``beam.output_log_probs``) and keep the beams' scores in fp32 / float64, so the ranking
of hypotheses is not decided by bf16 rounding, only the logits it starts from.

``auto`` chooses bf16 only where it is native *and* measured on the chip's class to be faster
than fp32 on the demo model's test split, within 0.2 SacreBLEU, with no difference sacrebleu's
paired bootstrap finds (``measured.decode_rule``, docs/decoding.md#precision). int8
(``--quantize int8``) keeps fp32 activations: bf16 with it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import measured
from ..errors import UserError
from ..hardware import bf16_support
from ..model import Transformer
from ..runtime import use_fast_paths
from .translate import model_device

PRECISIONS = ("auto", "fp32", "bf16")
# What a bf16 model's decoder attention computes in where its chip class has no decode_bf16
# figure (``decoder_attention``; docs/decoding.md#precision)
BF16_ATTENTION = "bf16"


@dataclass(frozen=True)
class Precision:
    """The precision a command decodes in ("fp32" or "bf16") and the phrase that says why."""

    name: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        """What ``evaluate``'s JSON reports."""
        return {"precision": self.name, "precision_reason": self.reason}


def choose_precision(
    requested: str,
    device: torch.device | str,
    quantize: str | None = None,
    engine: str = "torch",
) -> Precision:
    """``--precision`` ("auto", "fp32" or "bf16") resolved for ``device``, ``--quantize`` and
    ``--engine`` (another engine decodes in its own float32); ``UserError`` for an unknown one
    and for bf16 with int8."""
    if requested not in PRECISIONS:
        raise UserError(f"--precision {requested}: choose one of {', '.join(PRECISIONS)}")
    check_combination(quantize, requested)
    if requested == "fp32":
        return Precision("fp32", "--precision fp32")
    support = bf16_support(torch.device(device))
    if requested == "bf16":
        emulated = "" if support.native else f" (emulated, slower than fp32: {support.reason})"
        return Precision("bf16", "--precision bf16" + emulated)
    if quantize is not None:
        return Precision("fp32", f"auto: --quantize {quantize} decodes with fp32 activations")
    if engine != "torch":
        return Precision("fp32", f"auto: --engine {engine} decodes in float32")
    if not support.native:
        return Precision("fp32", f"auto: {support.reason}, so bf16 would be slower")
    decision = measured.decode_bf16(support.chip)
    return Precision(
        "bf16" if decision.on else "fp32", f"auto: {support.reason}; {decision.reason}"
    )


def check_combination(quantize: str | None, precision: str) -> None:
    """bf16 with int8 weights is refused: the int8 kernels take fp32 activations."""
    if precision == "bf16" and quantize is not None:
        raise UserError(
            f"--precision bf16 with --quantize {quantize}: int8 weights decode with fp32 "
            "activations; give one of them"
        )


def decoder_attention(device: torch.device | str) -> str:
    """What a bf16 model's decoder attention computes in on ``device`` ("fp32" or "bf16"): what
    its chip class's decode_bf16 figure was measured with, the setting ``auto`` rests on, else
    ``BF16_ATTENTION``. It differs by chip: a step's batched products have a new shape each
    step, and oneDNN (bf16) compiles a kernel per shape and copies the cache's strided slices,
    MKL (fp32) neither; on AMX that outweighs bf16's halved bytes (docs/decoding.md#precision)."""
    figure = measured.entry(bf16_support(torch.device(device)).chip, "decode_bf16")
    return str(figure.get("attention", BF16_ATTENTION)) if figure else BF16_ATTENTION


@torch.no_grad()
def to_bf16(model: nn.Module, attention: str | None = None) -> nn.Module:
    """The model's weights and buffers (the positional encoding) as bf16, in place; every
    activation then follows, since each op computes in its inputs' dtype, but the decoder's
    attention, which computes in ``attention`` ("fp32" or "bf16", the model's ``decode_attention``
    that ``decode.cache`` reads; default: ``decoder_attention`` of the model's device). The
    encoder's attention computes as in training (``runtime.use_fast_paths``: fp32 on a CPU)."""
    if attention is None:
        attention = decoder_attention(model_device(model))
    if attention not in ("fp32", "bf16"):
        raise ValueError(f"attention in fp32 or bf16, not {attention!r}")
    for module in model.modules():
        if isinstance(module, Transformer):
            module.decode_attention = attention
    return use_fast_paths(model).to(torch.bfloat16).eval()
