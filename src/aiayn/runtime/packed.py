"""fp32 and bf16 Linear layers with their weights packed once for oneDNN, for decoding on the CPU.

A decode step multiplies a few rows (batch x beam: 4 at batch 1) by every weight matrix of
the decoder and by the output projection. PyTorch sends ``F.linear`` to MKL's sgemm, which
re-packs the whole weight matrix on every call; oneDNN on weights packed once does not, and a
whole test split decodes faster for it (docs/benchmarks.md#the-weights-forms-end-to-end, with
its command). oneDNN is the library PyTorch itself uses for this (the same ops
``torch.compile`` inserts when it freezes a CPU model), but there is no public eager API for
it: ``PackedLinear`` calls those private ops, kept for that measured gain and pinned by tests
(the golden n-best lists' packed cases, ``tests/test_packed.py``). Where they are missing (a
PyTorch built without oneDNN) ``pack_linears`` leaves the model as it is, on ``F.linear``.

The values are the same weights; in fp32 only the summation order inside the matmul differs
(logits agree within the tests' 1e-4), as it already does between MKL calls with different row
counts. bf16 ``F.linear`` on the CPU is already oneDNN's, so packed bf16 gives its very values,
without the copy of the bias into every output that ``addmm`` makes first (``bf16_packable``:
only where oneDNN computes in bf16 natively).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model import PositionwiseFeedForward
from .hardware import bf16_support, keep_onednn_primitives
from .kernels import ModuleT


def available() -> bool:
    """Whether this PyTorch has the oneDNN linear ops ``PackedLinear`` needs."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def bf16_packable() -> bool:
    """Whether the CPU computes bf16 natively (``hardware.bf16_support``) and oneDNN does its
    bf16 linears (elsewhere bf16 models keep ``F.linear``)."""
    native = bf16_support(torch.device("cpu")).native
    return native and available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """``nn.Linear`` for inference, its weight in oneDNN's blocked layout (packed once), in
    the Linear's dtype (fp32 or bf16).

    The packed weight and the bias are plain attributes, not parameters: this module is never
    trained, saved or moved to another device (pack after loading, on the CPU). ``activation``
    "relu" applies max(0, .) inside the same oneDNN call (exact: the same values as ``F.relu``
    after it, one pass over the output fewer).
    """

    def __init__(self, linear: nn.Linear, activation: str = "none") -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.activation = activation
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous())
        self.bias = None if linear.bias is None else linear.bias.detach().contiguous()

    def forward(self, x: Tensor) -> Tensor:
        """(..., in) -> (..., out): the op flattens the leading dimensions itself (and makes x
        contiguous), so that a decode step's many small linears cost one dispatch each."""
        return torch.ops.mkldnn._linear_pointwise(
            x, self.packed, self.bias, self.activation, [], ""
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, activation={self.activation}"
        )


class PackedFeedForward(nn.Module):
    """``PositionwiseFeedForward`` (FFN(x) = max(0, x W1 + b1) W2 + b2) on packed weights, the
    max(0, .) fused into W1's call; another ``activation`` (swish, gelu) is applied after it."""

    def __init__(self, ffn: PositionwiseFeedForward) -> None:
        super().__init__()
        fused = ffn.activation is F.relu
        self.W_1 = PackedLinear(ffn.W_1, activation="relu" if fused else "none")
        self.W_2 = PackedLinear(ffn.W_2)
        self.activation = None if fused else ffn.activation

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.W_1(x)
        return self.W_2(hidden if self.activation is None else self.activation(hidden))


@torch.no_grad()
def pack_linears(model: ModuleT) -> ModuleT:
    """Replace every ``nn.Linear`` of an eval-mode CPU model, fp32 or bf16, by a
    ``PackedLinear``, in place, and every feed-forward by a ``PackedFeedForward`` (the tied
    output projection gets its own packed copy; the embedding keeps the matrix). Returns the
    model unchanged where oneDNN is missing (or, for bf16, not native) or it is not on the CPU."""
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu" or not available():
        return model
    if first.dtype not in (torch.float32, torch.bfloat16):
        return model
    if first.dtype == torch.bfloat16 and not bf16_packable():
        return model
    if first.dtype == torch.float32:  # a primitive per row count: measured to pay in fp32 only
        keep_onednn_primitives()
    model.eval()
    # The feed-forwards first, so that their Linears are packed once, by ``PackedFeedForward``.
    _replace(model, PositionwiseFeedForward, PackedFeedForward)
    _replace(model, nn.Linear, PackedLinear)
    return model


def _replace(model: nn.Module, kind: type, replacement: Callable[[Any], nn.Module]) -> None:
    """Every child module of exactly type ``kind`` swapped for ``replacement(child)``."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is kind:
                setattr(parent, name, replacement(child))
