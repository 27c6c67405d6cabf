"""Ensembles: several models decoding as one. At every step the next-token distribution is
the average of the models' log-probabilities, renormalised (a product of experts):

    log P(y | y_<t, X) = mean_m log P_m(y | y_<t, X) - log Z_t

``Ensemble`` implements the decoding interface (``encode``/``src_mask``/``new_cache``/
``decode_step``), so beam search, sampling and forced decoding take it as they take one model;
the search's own ``log_softmax`` does the renormalisation. The models must share one vocabulary
(the ids mean the same pieces); their sizes may differ: ``encode`` gives back each model's own
memory, and the cache holds each model's cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserError
from .cache import decode_step, new_cache
from .translate import positions


class EnsembleCache:
    """Each model's decoder cache; the search reorders them together."""

    def __init__(self, caches: list[Any]) -> None:
        self.caches = caches

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        for cache in self.caches:
            cache.select(rows, sentences=sentences)


class Ensemble:
    """Models (each with the decoding interface) decoding with averaged log-probabilities."""

    def __init__(self, models: Sequence[Any]) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = list(models)
        limits = [positions(m) for m in self.models]
        self.max_positions = min((n for n in limits if n is not None), default=None)

    # The parts of nn.Module that decoding uses: mode, device, attention for alignments.
    @property
    def training(self) -> bool:
        return any(getattr(m, "training", False) for m in self.models)

    def eval(self) -> Ensemble:
        for m in self.models:
            m.eval()
        return self

    def train(self, mode: bool = True) -> Ensemble:
        for m in self.models:
            m.train(mode)
        return self

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        for m in self.models:
            yield from m.parameters()

    def encode(self, src: Tensor) -> list[Any]:
        """src (B, S) -> each model's memory (B, S, its d_model)."""
        return [m.encode(src) for m in self.models]

    def src_mask(self, src: Tensor) -> Tensor:
        return self.models[0].src_mask(src)

    def new_cache(
        self, memory: list[Any], src_mask: Tensor, max_len: int | None = None
    ) -> EnsembleCache:
        """Each model's cache for its own memory (``encode``)."""
        return EnsembleCache(
            [new_cache(m, mem, src_mask, max_len=max_len) for m, mem in zip(self.models, memory)]
        )

    def decode_step(self, tgt_in: Tensor, cache: EnsembleCache) -> Tensor:
        """As ``decode.cache.decode_step``; the "logits" are the mean log-probabilities (B, V)."""
        lprobs = [
            F.log_softmax(decode_step(m, tgt_in, c), dim=-1, dtype=torch.float32)
            for m, c in zip(self.models, cache.caches)
        ]
        return torch.stack(lprobs).mean(0)


def load_models(
    checkpoints: str | Path | Sequence[str | Path],
    device: str | torch.device = "cpu",
    quantize: str | None = None,
    precision: str = "fp32",
):
    """(model ready for decoding (``for_decoding``), its vocabulary) from one checkpoint, or an
    ``Ensemble`` of several; ``UserError`` unless they share one vocabulary (``spm.model``)."""
    from ..checkpoint import VOCAB, load_translator, vocab_fingerprint
    from ..runtime.ready import for_decoding

    paths = (
        [Path(checkpoints)]
        if isinstance(checkpoints, (str, Path))
        else list(map(Path, checkpoints))
    )
    first = vocab_fingerprint(paths[0])
    for p in paths[1:]:
        if vocab_fingerprint(p) != first:
            raise UserError(
                f"--checkpoint {p} has another vocabulary ({VOCAB}) than {paths[0]}: "
                "an ensemble needs one vocabulary"
            )
    loaded = [load_translator(p, device) for p in paths]
    models = [for_decoding(model, quantize, precision) for model, _ in loaded]
    vocab = loaded[0][1]
    return (models[0] if len(models) == 1 else Ensemble(models)), vocab
