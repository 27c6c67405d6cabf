"""Mixed precision with each weight cast once per update: low-precision copies of the ``nn.Linear``
weights beside the fp32 master weights, as mixed-precision trainers keep them.

Autocast casts a weight in every forward that uses it (its cache lives as long as one autocast
context, a micro-batch's forward) and the backward casts each weight's gradient back to fp32.
``WeightCopies`` keeps one bf16 (or fp16) copy of every ``nn.Linear`` weight and bias, refreshed
from the masters once per update; each micro-batch's forward reads the copies, and their
gradients flow back to the masters in fp32, where Adam, the checkpoints and the moving average
see them. The arithmetic is autocast's, bit for bit: the copy is the autocast cast of the same
master, the weight gradient the same low-precision matmul result, converted to fp32 exactly and
accumulated into the master's gradient in the same order (tests/test_mixed.py compares the two).

What changes is how often and in how many operations: the copies are written in one operation
per update instead of one cast per weight per micro-batch, and the gradients converted in one
operation per micro-batch. The bytes cast are the same with one micro-batch per update; with
more, the forward casts are not repeated. Activations still cross the fp32/bf16 boundary where
autocast's rules say (LayerNorm outputs into a linear, the residual adds).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call


class _Copies(torch.autograd.Function):
    """The copies as the forward's weights (views, so that each micro-batch's graph has tensors
    of its own); in backward their gradients, converted to each master's dtype in one operation."""

    @staticmethod
    def forward(ctx: Any, copies: list[Tensor], *masters: Tensor) -> tuple[Tensor, ...]:
        ctx.set_materialize_grads(False)  # a weight that got no gradient gets None, not zeros
        ctx.master_dtypes = [m.dtype for m in masters]
        return tuple(c.view_as(c) for c in copies)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        given = [(i, g) for i, g in enumerate(grads) if g is not None]
        out = [torch.empty_like(g, dtype=ctx.master_dtypes[i]) for i, g in given]
        torch._foreach_copy_(out, [g for _, g in given])
        result: list[Tensor | None] = [None] * len(grads)
        for (i, _), copied in zip(given, out):
            result[i] = copied
        return (None, *result)


class WeightCopies:
    """``module`` called as in training, with its ``nn.Linear`` weights read from ``dtype`` copies
    (``dtype`` None: fp32 training, ``module`` itself). ``refresh()`` once per update, before the
    first forward: the copies then hold the masters as the optimizer, or a checkpoint loaded in
    place, left them (fused Adam does not bump the weights' version counters, so nothing here
    could tell that they changed).

    A weight that the model also uses outside a linear (the embedding matrix tied to the
    pre-softmax projection) is left to autocast, cast at its use: its fp32 gradient is the sum of
    several contributions, which must reach it in autocast's order to sum to the same bits, and
    a copy's gradient arrives only when the whole group's does, at the end of the backward.
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype | None) -> None:
        self.module = module
        self.names: list[list[str]] = []  # the names each master is read under
        self.masters: list[Tensor] = []
        self.copies: list[Tensor] = []
        if dtype is None:
            return
        for p, names in _linear_only(module):
            self.names.append(names)
            self.masters.append(p)
            self.copies.append(torch.empty_like(p, dtype=dtype))
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        if self.masters:
            torch._foreach_copy_(self.copies, self.masters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.masters:
            return self.module(*args, **kwargs)
        swapped: dict[str, Tensor] = {}
        for view, names in zip(_Copies.apply(self.copies, *self.masters), self.names):
            swapped |= dict.fromkeys(names, view)
        # tie_weights=False: swap exactly these names, whatever else holds the same tensor
        return functional_call(self.module, swapped, args, kwargs, tie_weights=False)


def _linear_only(module: nn.Module) -> list[tuple[Tensor, list[str]]]:
    """Each parameter that only ``nn.Linear`` modules hold, with its names there, in the order
    of the module's parameters."""
    names: dict[int, list[str]] = defaultdict(list)
    elsewhere: set[int] = set()
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for name, p in sub.named_parameters(recurse=False, remove_duplicate=False):
            if isinstance(sub, nn.Linear):
                names[id(p)].append(f"{prefix}.{name}" if prefix else name)
            else:
                elsewhere.add(id(p))
    return [(p, names[id(p)]) for p in module.parameters() if id(p) in names.keys() - elsewhere]
