"""What ``auto`` chooses on this machine, in one place: training's precision (``resolve_amp``),
attention path (``resolve_attention``) and compiled step (``resolve_compile``); decoding's
precision (``choose_precision``) and a bf16 model's decoder attention (``decoder_attention``).

Each choice asks ``hardware`` what the chip can do and ``figures`` what was measured to pay on
its class, and says why in a phrase that summaries, reports and ``config.json`` repeat; the
kernels chosen live in ``kernels``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError
from . import figures
from .hardware import bf16_support
from .kernels import BF16_MATMULS, attention_precision

# --- Training --------------------------------------------------------------------------------


def resolve_amp(amp: str, device: torch.device) -> tuple[str, str]:
    """(what autocast computes in, why) for the config's ``amp``. ``auto`` on a CPU: bf16 only
    where the chip computes in it natively *and* bf16 training measured to pay on its class
    (``figures.train_bf16``), else the paper's fp32. On CUDA: bf16 where supported, fp16 with a
    gradient scaler elsewhere (a documented deviation, as fairseq's ``--fp16``)."""
    if amp == "none":
        return "fp32", "amp=none"
    if amp == "fp16":
        return "fp16", "amp=fp16, with a gradient scaler"
    support = bf16_support(device)
    if amp == "bf16":
        return "bf16", "amp=bf16" if support.native else f"amp=bf16, emulated: {support.reason}"
    if device.type == "cuda":
        if support.native:
            return "bf16", f"amp=auto and {support.reason}"
        return "fp16", f"amp=auto and {support.reason}: fp16 with a gradient scaler"
    if not support.native:
        return "fp32", f"amp=auto and {support.reason}"
    decision = figures.train_bf16(support.chip)
    return ("bf16" if decision.on else "fp32"), f"amp=auto and {support.reason}; {decision.reason}"


def resolve_attention(amp: str, device: torch.device) -> str:
    """The attention path of training, as the summary names it: ``BF16_MATMULS`` for bf16 on a
    CPU whose class measured it to pay (``figures.train_bf16_matmul_attention``), else
    ``SDPA in`` what ``runtime.kernels.attention_precision`` computes in (fp32 on every CPU)."""
    if device.type == "cpu" and amp == "bf16":
        if figures.train_bf16_matmul_attention(bf16_support(device).chip).on:
            return BF16_MATMULS
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp, torch.float32)
    return f"SDPA in {attention_precision(device, dtype)}"


def resolve_compile(compile: bool | str, device: torch.device) -> tuple[bool, str]:
    """(whether the layers are compiled, why) for the config's ``compile``. ``auto``: on only
    where the compiled step measured to pay back its compile time within 5% of a demo run on this
    class of chip (``figures.compile_step``)."""
    if compile != "auto":
        return bool(compile), f"compile={str(compile).lower()}"
    decision = figures.compile_step(bf16_support(device).chip)
    return decision.on, f"compile=auto: {decision.reason}"


# --- Decoding --------------------------------------------------------------------------------

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
    decision = figures.decode_bf16(support.chip)
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
    figure = figures.entry(bf16_support(torch.device(device)).chip, "decode_bf16")
    return str(figure.get("attention", BF16_ATTENTION)) if figure else BF16_ATTENTION
