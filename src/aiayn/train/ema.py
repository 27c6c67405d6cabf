"""An exponential moving average of the weights (not in the paper, off by default;
``ema_decay``): after every optimizer step, ``ema = decay * ema + (1 - decay) * weights``,
starting from the weights the run starts with. With ``ema_warmup`` the decay of update ``n``
is ``min(decay, (1 + n) / (10 + n))`` (TensorFlow's ``ExponentialMovingAverage`` with
``num_updates``): early updates forget the random initial weights fast, so a short run's average
covers its last ~10% of updates instead of still holding ``decay ** n`` of the initial weights.

Like checkpoint averaging (section 6.1) it smooths the last steps' noise, but continuously
and at no cost in checkpoints. An fp32 copy of the model, kept by the process that saves
(rank 0); each checkpoint stores it as a checkpoint of its own, ``update_N/ema/``, which
``aiayn translate --checkpoint .../ema`` reads as any other.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from ..model import Transformer


class EMA:
    def __init__(self, model: Transformer, decay: float, *, warmup: bool = False) -> None:
        self.decay = decay
        self.warmup = warmup
        self.model = copy.deepcopy(model).float().eval().requires_grad_(False)
        self._averaged: list[Tensor] = list(
            self.model.parameters()
        )  # the tied matrix once, as in the model

    @torch.no_grad()
    def update(self, model: Transformer, update: int) -> None:
        """Step ``update`` (1 for the first since the average started) towards ``model``'s
        weights (the same parameters in the same order)."""
        decay = min(self.decay, (1 + update) / (10 + update)) if self.warmup else self.decay
        weights = [p.detach().float() for p in model.parameters()]
        torch._foreach_lerp_(self._averaged, weights, 1.0 - decay)

    @torch.no_grad()
    def reset(self, model: Transformer) -> None:
        """Start again from ``model``'s weights (a run initialised from a checkpoint)."""
        for averaged, p in zip(self._averaged, model.parameters(), strict=True):
            averaged.copy_(p)
