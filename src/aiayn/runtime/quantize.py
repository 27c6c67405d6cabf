"""The weights' form for decoding on the CPU: fp32 packed for oneDNN, int8 (``--quantize int8``)
or bf16 (``--precision bf16``, see ``precision``).

    model, _ = load_transformer(checkpoint)      # safetensors: no pickle, no code executed
    model = for_decoding(model)                  # fp32, Linear weights packed (see ``packed``)
    model = for_decoding(model, "int8")          # or int8
    model = for_decoding(model, precision="bf16")  # or bf16 (packed where native)

Every ``nn.Linear`` (attention projections, feed-forward, and the output projection, which
gets its own int8 copy of the tied embedding matrix) becomes a dynamically quantized linear:
int8 weights with one scale per output row, activations quantized per call from their
observed range, int32 accumulation. These are PyTorch's own fbgemm/x86 kernels, reached through
``torch.ao.quantization.quantize_dynamic``, which PyTorch deprecates in favour of torchao. It
stays because torchao's eager int8 (``quantize_``) decodes a whole split slower than it, and
slower than fp32, on the CPU (docs/decoding.md#int8); its deprecation is passed on to the user as a ``FutureWarning`` rather than
hidden. Quantizing happens after the weights are loaded, so an int8 model is never stored or
unpickled.

Because activations are quantized per call, a sentence's int8 output can depend slightly on
the other sentences of its batch (fp32 output does not).
"""

from __future__ import annotations

import warnings

from torch import nn

from ..errors import UserError
from .kernels import use_fast_paths
from .packed import pack_linears
from .policy import check_combination
from .precision import to_bf16

QUANTIZE_MODES = ("int8",)


def for_decoding(
    model: nn.Module,
    quantize: str | None = None,
    precision: str = "fp32",
    attention: str | None = None,
) -> nn.Module:
    """A loaded model made ready for decoding, in place: ``quantize`` None keeps fp32 and packs the
    Linear weights for oneDNN on the CPU (``packed.pack_linears``; elsewhere the model stays as it
    is); "int8" quantizes them; ``precision`` "bf16" casts every weight to bf16 instead (not with
    int8), packed too where oneDNN computes bf16 natively, its decoder attention in ``attention``
    (``precision.to_bf16``); the model's hooks get the fast paths (``runtime.use_fast_paths``).
    Never for a model that will still be trained."""
    check_combination(quantize, precision)
    use_fast_paths(model)
    if precision == "bf16":
        return pack_linears(to_bf16(model, attention))
    if quantize is None:
        return pack_linears(model)
    if quantize not in QUANTIZE_MODES:
        raise UserError(
            f"unknown quantization {quantize!r}; choose one of: {', '.join(QUANTIZE_MODES)}"
        )
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise UserError(f"--quantize {quantize} runs on the CPU only, the model is on {device}")
    model.eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        model = quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
    _pass_on_deprecation(caught)
    return model


def _pass_on_deprecation(caught: list[warnings.WarningMessage]) -> None:
    """PyTorch's deprecation of its eager quantization, said once to whoever decodes: a
    ``FutureWarning`` (shown by default, unlike ``DeprecationWarning``) with PyTorch's first
    line and why int8 still uses it; any other warning is re-issued as it was."""
    deprecated = [w for w in caught if "deprecated" in str(w.message)]
    for w in caught:
        if w not in deprecated:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if deprecated:
        said = str(deprecated[0].message).strip().splitlines()[0].strip()
        warnings.warn(
            f"--quantize int8 runs on PyTorch's eager int8 kernels, which it deprecates "
            f"({said}); torchao's eager int8 is slower on the CPU (docs/decoding.md#int8)",
            FutureWarning,
            stacklevel=3,
        )
