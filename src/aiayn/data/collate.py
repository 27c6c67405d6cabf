"""Padding a list of pairs into the tensors the model consumes (teacher forcing).

``src`` = subwords + [eos]; ``tgt_in`` = [bos] + subwords; ``tgt_out`` = subwords + [eos]:
the decoder reads ``tgt_in`` and is trained to predict ``tgt_out`` at the same positions.
Everything is right-padded with ``pad_id`` (0, which the model's padding mask relies on).

torch is imported where the tensor is made, not at the top: ``aiayn.data`` exports ``collate``,
and the rest of the data pipeline (readers, vocabulary, binarised arrays, sampler) is used by
text-only tools that should load without torch (``tests/test_torch_free.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .binarize import TokenDataset
from .vocab import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:
    import torch


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) int64
    tgt_in: torch.Tensor  # (B, T) int64
    tgt_out: torch.Tensor  # (B, T) int64
    n_src_tokens: int  # non-pad entries of src
    n_tgt_tokens: int  # non-pad entries of tgt_out: the number of predictions in the loss
    indices: list[int]  # dataset indices, in batch order

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.src.to(device, non_blocking=non_blocking),
            self.tgt_in.to(device, non_blocking=non_blocking),
            self.tgt_out.to(device, non_blocking=non_blocking),
            self.n_src_tokens,
            self.n_tgt_tokens,
            list(self.indices),
        )


def pad_rows(
    rows: Sequence[Sequence[int] | np.ndarray], prefix: list[int], suffix: list[int], pad_id: int
) -> torch.Tensor:
    """(B, max_len) int64: prefix + row + suffix per row, right-padded with pad_id."""
    import torch

    width = max(len(r) for r in rows) + len(prefix) + len(suffix)
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, : len(prefix) + len(r) + len(suffix)] = np.concatenate([prefix, r, suffix])
    return torch.from_numpy(out)


def collate(
    dataset: TokenDataset,
    indices: Sequence[int],
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> Batch:
    """The padded ``Batch`` of pairs ``indices`` of ``dataset``."""
    if not indices:
        raise ValueError("cannot collate an empty batch")
    srcs = [dataset.src(i) for i in indices]
    tgts = [dataset.tgt(i) for i in indices]
    src = pad_rows(srcs, [], [eos_id], pad_id)
    tgt_in = pad_rows(tgts, [bos_id], [], pad_id)
    tgt_out = pad_rows(tgts, [], [eos_id], pad_id)
    return Batch(
        src,
        tgt_in,
        tgt_out,
        n_src_tokens=sum(len(s) for s in srcs) + len(srcs),
        n_tgt_tokens=sum(len(t) for t in tgts) + len(tgts),
        indices=list(indices),
    )
