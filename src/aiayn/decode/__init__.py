"""Decoding (paper section 6): beam search with the GNMT length penalty (beam 1 included) and
whole-corpus translation. Depends only on the model's ``encode``/``src_mask``/``decode_step``."""

from .beam import Constraint, Hypothesis, beam_search
from .config import DECODE_PRESETS, DecodeConfig
from .penalties import gnmt_length_penalty
from .quantize import QUANTIZE_MODES, for_decoding
from .translate import decode_ids, length_batches, translate

__all__ = [
    "DECODE_PRESETS",
    "Constraint",
    "DecodeConfig",
    "Hypothesis",
    "QUANTIZE_MODES",
    "beam_search",
    "decode_ids",
    "for_decoding",
    "gnmt_length_penalty",
    "length_batches",
    "translate",
]
