"""int8 weights for decoding on the CPU (``--quantize int8``; the door is
``runtime.for_decoding``).

    model, _ = load_transformer(checkpoint)      # safetensors: no pickle, no code executed
    model = for_decoding(model, "int8")          # aiayn.runtime.ready

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
from .kernels import ModuleT

QUANTIZE_MODES = ("int8",)


def quantize_int8(model: ModuleT, quantize: str = "int8") -> ModuleT:
    """Every ``nn.Linear`` of a CPU model made a dynamically quantized int8 linear, in place
    (``quantize`` names the mode, one of ``QUANTIZE_MODES``). Never for a model that will still
    be trained."""
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
            stacklevel=4,  # the caller of for_decoding
        )
