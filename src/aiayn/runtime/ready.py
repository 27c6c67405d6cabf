"""The machine's two doors: a model made ready for training (``for_training``) or for decoding
(``for_decoding``) on this machine. A model as built or loaded computes with PyTorch's own
kernels (``model.Kernels``' defaults); these give it the faster ones of ``kernels`` and, for
decoding, the weights' form (packed fp32, bf16 or int8), which change its speed, not what it
computes (bf16 and int8 round differently, by the user's choice).

    model = for_training(Transformer(cfg), device)           # the trainer's
    model, _ = load_transformer(checkpoint)                  # weights only
    model = for_decoding(model)                              # fp32, Linear weights packed
    model = for_decoding(model, "int8")                      # or int8
    model = for_decoding(model, precision="bf16")            # or bf16 (packed where native)
"""

from __future__ import annotations

import torch

from ..model import Transformer
from .kernels import ModuleT, use_fast_paths
from .packed import pack_linears
from .policy import check_combination
from .precision import to_bf16
from .quantize import quantize_int8


def for_training(model: Transformer, device: torch.device | str) -> Transformer:
    """A new model ready to train on ``device``: its kernels the fast ones (``use_fast_paths``).
    What autocast computes in and whether the layers are compiled are the trainer's choices
    (``policy.resolve_amp``, ``policy.resolve_compile``), made per run."""
    return use_fast_paths(model).to(device)


def for_decoding(
    model: ModuleT,
    quantize: str | None = None,
    precision: str = "fp32",
    attention: str | None = None,
) -> ModuleT:
    """A loaded model (on the device it decodes on) made ready for decoding, in place: the fast
    kernels (``use_fast_paths``); ``quantize`` None keeps fp32 and packs the Linear weights for
    oneDNN on the CPU (``packed.pack_linears``; elsewhere the model stays as it is); "int8"
    quantizes them (``quantize.quantize_int8``); ``precision`` "bf16" casts every weight to
    bf16 instead (not with int8), packed too where oneDNN computes bf16 natively, its decoder
    attention in ``attention`` (``precision.to_bf16``). Never for a model that will still be
    trained."""
    check_combination(quantize, precision)
    use_fast_paths(model)
    if precision == "bf16":
        return pack_linears(to_bf16(model, attention))
    if quantize is None:
        return pack_linears(model)
    return quantize_int8(model, quantize)
