"""The GNMT length penalty used by the paper's beam search (section 6.1, alpha = 0.6).

    lp(Y) = ((5 + |Y|) / 6) ** alpha          (Wu et al. 2016, eq. 14)

A finished hypothesis is ranked by ``log P(Y | X) / lp(Y)``. This is *not* the ``|Y| ** alpha``
of fairseq and Hugging Face; with alpha = 0.6 the two differ noticeably for short outputs.

|Y| counts the output tokens *including* the end-of-sentence token, excluding the leading bos,
as tensor2tensor's beam search does (it divides by ``((5 + i + 1) / 6) ** alpha`` at decoding
step i, where the token chosen at that step is the eos). A hypothesis cut off at the maximum
length without eos counts its tokens as they are.
"""

from __future__ import annotations

from typing import overload

import torch
from torch import Tensor


@overload
def gnmt_length_penalty(length: int | float, alpha: float) -> float: ...
@overload
def gnmt_length_penalty(length: Tensor, alpha: float) -> Tensor: ...


def gnmt_length_penalty(length, alpha):
    """lp(|Y|) = ((5 + |Y|) / 6) ** alpha; ``length`` is a number or a tensor of lengths."""
    if isinstance(length, Tensor):
        return ((5.0 + length.to(torch.float32)) / 6.0) ** alpha
    return ((5.0 + length) / 6.0) ** alpha
