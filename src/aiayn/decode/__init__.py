"""Decoding (paper section 6): beam search with the GNMT length penalty (beam 1 included) and
whole-corpus translation (a window of lines at a time); beyond the paper, forced decoding
(``score``), n-best output (``nbest``), ensembles, sampling, target prefixes and lexical
constraints (``constraints``) and word alignments (``align``). The searches depend only on the model's
``encode``/``src_mask``/``new_cache``/``decode_step``, called through ``cache``, which gives a
``Transformer`` its fast shared-history cache."""

from ..runtime.quantize import QUANTIZE_MODES
from ..runtime.ready import for_decoding  # the machine's door, here for the searches' users
from .beam import Hypothesis, beam_search
from .config import DECODE_PRESETS, DecodeConfig
from .constraints import Constraint, OutputConstraint, text_constraint
from .ensemble import Ensemble, load_models
from .nbest import Output, jsonl_line, nbest_outputs
from .penalties import gnmt_length_penalty
from .request import Batching, SearchRequest, SpecialIds
from .sample import SampleConfig, sample
from .score import Score, force_decode, score_ids
from .translate import decode_ids, length_batches, translate, translate_corpus

__all__ = [
    "DECODE_PRESETS",
    "Batching",
    "Constraint",
    "DecodeConfig",
    "Ensemble",
    "Hypothesis",
    "Output",
    "OutputConstraint",
    "QUANTIZE_MODES",
    "SampleConfig",
    "Score",
    "SearchRequest",
    "SpecialIds",
    "beam_search",
    "decode_ids",
    "for_decoding",
    "force_decode",
    "gnmt_length_penalty",
    "jsonl_line",
    "length_batches",
    "load_models",
    "nbest_outputs",
    "sample",
    "score_ids",
    "translate",
    "text_constraint",
    "translate_corpus",
]
