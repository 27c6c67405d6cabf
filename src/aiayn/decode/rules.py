"""The search rules of other toolkits, as data: why one model scores differently in each.

Four toolkits run the same beam search (expand every live prefix, keep the 2k best candidates,
finish the eos candidates among the first k, keep the k best others live) and differ in four
rules, which ``SearchRules`` names and ``beam.py`` applies; Marian narrows its beam instead
(below):

==========  ======================  ===========================  ===================  ===========
rules       length penalty lp(|Y|)  a sentence stops when        |Y| at most          at limit
==========  ======================  ===========================  ===================  ===========
paper       ((5 + |Y|) / 6)^alpha   no live prefix can win       |X| + 50             cut
fairseq     |Y|^alpha               k outputs finished           201 (200 + eos)      eos only
hf          |Y|^alpha               k finished and the best      511 (max_length      cut
                                    live prefix, scored at its   512 counts the
                                    own length, cannot win       start token)
ct2         |Y|^alpha               round(k * patience)          256                  cut
                                    finished (patience 1)
marian      |Y|^alpha, score        k finished (each narrows     ceil(3 |X|)          cut, the cut
            (log P - wp |Y|) / lp   the beam by one)                                  ones finish
==========  ======================  ===========================  ===================  ===========

|Y| counts the final eos in all four (tensor2tensor; fairseq's ``(step + 1) ** lenpen``;
transformers' ``cur_len + 1 - prompt``; CTranslate2's translator searches with the eos in its
hypotheses, ``include_eos_in_hypotheses``, and removes it after the scores are made, unless
``return_end_token``). |X| counts the source eos.

How each toolkit behaves, read from its code (behaviour, not code, is reproduced here):

- fairseq ``SequenceGenerator`` (0.12): ``max_len = min(max_len_a * |X| + max_len_b,
  positions - 1)`` with defaults 0 and 200; at step ``max_len`` every token but eos is -inf, so
  every output ends with eos; ``min_len`` 1 makes eos impossible at the first step (no empty
  output); a sentence keeps the first k outputs it finishes (those of one
  step in candidate order, a k+1-th is dropped) and stops with the k-th.
- transformers ``_beam_search`` (``early_stopping=False``, its default): a sentence keeps its
  k best finished outputs and stops once it has k and the best live prefix's log P divided by
  its current length^alpha is no better than the k-th (a heuristic: a longer output may score
  better); ``max_length`` counts the decoder's start token (512: Marian's setting).
- CTranslate2 ``BeamSearch`` (4.x): every eos among the first k candidates finishes (no cap);
  a sentence stops once ``round(k * patience)`` outputs have finished, or, with
  ``length_penalty`` 0, once the best candidate of some step was an eos and ``num_hypotheses``
  have finished; ``max_decoding_length`` (256) counts the eos; the last step finishes the first
  k candidates whatever they are.

- Marian ``BeamSearch::search`` (marian-dev, ``beam_search.cpp``, ``history.h``): a sentence's
  beam holds w hypotheses (w = k at first); each step takes the w best of their w*V extensions,
  the eos ones among them finish and the others form the next beam, so w shrinks by one per
  finished output (``shrink``) and the sentence stops at w = 0; <unk> is impossible
  (``--allow-unk`` off); at ``history size >= max-length-factor * |X|`` (3 by default, |X| the
  source with its eos) every hypothesis of the beam finishes as it is. A finished output scores
  ``(log P - word_penalty * |Y|) / |Y|^normalize`` (``--word-penalty``, ``--normalize``: alpha).
  Outputs equal Marian's where it decodes one sentence a batch (``--mini-batch 1``): with more,
  Marian's limit follows the batch's longest source and ends every sentence at once.

The eos rule (an eos outside the first k of the 2k candidates never ends an output) is the
same in all four, so it is not a field (Marian's ``shrink`` looks at the first w <= k).
``patience`` is CTranslate2's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from ..errors import UserError
from .penalties import gnmt_length_penalty

Penalty = Literal["gnmt", "power"]
Stopping = Literal["exact", "first_k", "heuristic", "patience", "shrink"]


@dataclass(frozen=True)
class SearchRules:
    """One toolkit's length penalty, stopping rule, length limit and last step (module doc).

    ``penalty``: "gnmt" ((5 + |Y|) / 6)^alpha or "power" |Y|^alpha. ``stopping``: "exact" (the paper's bound),
    "first_k" (k finished, the first k kept), "heuristic" (transformers'), "patience"
    (CTranslate2's). ``max_len``: the fixed limit on |Y| (eos counted), None for the decode
    config's ``max_len_a * |X| + max_len_b``; either is capped by the model's positions.
    ``eos_at_limit``: the last position may only be eos (fairseq), else outputs are cut there.
    ``min_len``: eos is impossible before this output position (``beam_search``'s min_len):
    2 for fairseq, whose ``min_len`` 1 counts steps from 0. ``max_len_factor``: the limit is
    ceil(factor * |X|) (Marian's ``--max-length-factor``). ``word_penalty``: subtracted from a
    finished output's log P per token before the length penalty (Marian's ``--word-penalty``).
    ``allow_unk``: False makes unk impossible (Marian's default).
    """

    name: str
    penalty: Penalty = "gnmt"
    stopping: Stopping = "exact"
    max_len: int | None = None
    eos_at_limit: bool = False
    patience: float = 1.0
    min_len: int = 0
    max_len_factor: float | None = None
    word_penalty: float = 0.0
    allow_unk: bool = True

    def length_penalty(self, length: int, alpha: float) -> float:
        """lp of outputs of ``length`` tokens (eos counted)."""
        if self.penalty == "gnmt":
            return gnmt_length_penalty(length, alpha)
        return float(length) ** alpha

    def compared(self, beam: int, nbest: int) -> int:
        """How many best finished scores the stopping rule compares with: the beam-th for
        transformers' heuristic, the nbest-th for the paper's bound."""
        return beam if self.stopping == "heuristic" else nbest

    def finished_for_stop(self, beam: int) -> int:
        """How many finished outputs stop a sentence under "first_k", "heuristic", "shrink"
        and "patience" (std::round of beam * patience, as CTranslate2 rounds)."""
        return int(math.floor(beam * self.patience + 0.5)) if self.stopping == "patience" else beam


SEARCH_RULES: dict[str, SearchRules] = {
    "paper": SearchRules("paper"),
    "fairseq": SearchRules(
        "fairseq", penalty="power", stopping="first_k", max_len=201, eos_at_limit=True, min_len=2
    ),
    "hf": SearchRules("hf", penalty="power", stopping="heuristic", max_len=511),
    "ct2": SearchRules("ct2", penalty="power", stopping="patience", max_len=256),
    "marian": SearchRules(
        "marian", penalty="power", stopping="shrink", max_len_factor=3.0, allow_unk=False
    ),
}
PAPER_RULES = SEARCH_RULES["paper"]


def search_rules(name: str, option: str = "--search-rules") -> SearchRules:
    """The rules of ``name``, or a one-line UserError naming ``option`` (the command's
    ``--search-rules``, serve's ``search_rules`` field) and the choices."""
    if name not in SEARCH_RULES:
        raise UserError(f"{option} {name!r}: choose one of {', '.join(SEARCH_RULES)}")
    return SEARCH_RULES[name]


# A checkpoint's own search settings (``meta.json``'s ``search_defaults``) that are fields of
# its rules, the others being ``DecodeConfig``'s (beam, alpha, the repetition guards).
_RULE_FIELDS = ("max_len", "min_len", "eos_at_limit")


def own_defaults(recorded: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """The ``DecodeConfig`` fields a checkpoint's own settings give under the rules ``name``:
    ``recorded`` maps a rules name to settings (an imported OPUS-MT model records what
    transformers' ``generate()`` does with it under "hf"); {} when it records none. The
    caller's explicit options go over these."""
    own = dict((recorded or {}).get(name) or {})
    if not own:
        return {}
    fields = {key: own.pop(key) for key in _RULE_FIELDS if key in own}
    return {**own, "rules": replace(search_rules(name), **fields)}
