"""Decoding hyper-parameters as typed data, with the paper's two settings as presets (section 6).

translation: beam 4, alpha 0.6, max output length = input length + 50   (section 6.1)
parsing:     beam 21, alpha 0.3, max output length = input length + 300 (section 6.3)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError
from .rules import PAPER_RULES, SearchRules, own_defaults, search_rules

# Past 10 a penalised token's log-probability is already out of every beam; larger values
# (1e30) only overflow. One rule for the command line, aiayn.Translator and the server.
MAX_REPETITION_PENALTY = 10.0
# The beam at least, unless one is given, when lexical phrases (a glossary, --constraints)
# constrain the outputs: dynamic beam allocation shares the beam among banks of hypotheses
# by phrase tokens placed, and the paper's 4 leaves a bank one place (docs/glossary.md).
CONSTRAINED_BEAM = 8


@dataclass(frozen=True)
class DecodeConfig:
    """Beam size, GNMT length penalty alpha, ``max_len = max_len_a * src_len + max_len_b``.

    ``src_len`` is the number of non-pad source tokens as given to the model (including the
    source eos when the data pipeline appends one). ``nbest`` hypotheses are returned per input.
    ``rules``: the length penalty, stopping rule and length limit the search follows (the
    paper's, or another toolkit's: ``rules.SEARCH_RULES``); a fixed ``rules.max_len``
    replaces ``max_len_a`` and ``max_len_b``. ``no_repeat_ngram_size`` (0: off) and
    ``repetition_penalty`` (1: off): the repetition guards of ``repetition.py`` (not in the
    paper; transformers' definitions).
    """

    beam: int = 4
    alpha: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    nbest: int = 1
    rules: SearchRules = PAPER_RULES
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name, kind in _FIELD_TYPES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind):
                wanted = "an integer" if kind is int else "a number"
                raise UserError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")
        if self.beam < 1:
            raise UserError(f"beam must be >= 1, got {self.beam}")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise UserError(f"alpha must be a finite number >= 0, got {self.alpha}")
        if not math.isfinite(self.max_len_a):
            raise UserError(f"max_len_a must be finite, got {self.max_len_a}")
        if not 1 <= self.nbest <= self.beam:
            raise UserError(f"nbest must be in [1, beam={self.beam}], got {self.nbest}")
        if self.no_repeat_ngram_size < 0:
            raise UserError(f"no_repeat_ngram_size must be >= 0, got {self.no_repeat_ngram_size}")
        if not 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:  # nan fails too
            raise UserError(
                "repetition_penalty must be a finite number > 0 and at most "
                f"{MAX_REPETITION_PENALTY:g}, got {self.repetition_penalty}"
            )
        if self.max_len_a < 0 or (self.max_len_a == 0 and self.max_len_b < 1):
            raise UserError(
                f"max_len_a={self.max_len_a}, max_len_b={self.max_len_b} allow no output"
            )

    @property
    def guards_repetition(self) -> bool:
        """Whether a repetition guard is on (the search skips them otherwise)."""
        return self.no_repeat_ngram_size > 0 or self.repetition_penalty != 1.0

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> DecodeConfig:
        """ "translation" or "parsing", with optional field overrides."""
        if name not in DECODE_PRESETS:
            raise UserError(
                f"unknown decode preset {name!r}; choose one of: {', '.join(DECODE_PRESETS)}"
            )
        unknown = sorted(set(overrides) - set(cls.__dataclass_fields__))
        if unknown:
            raise UserError(
                f"unknown decoding option {unknown[0]!r}; the options are: "
                + ", ".join(cls.__dataclass_fields__)
            )
        return replace(DECODE_PRESETS[name], **overrides)

    @classmethod
    def choose(
        cls,
        preset: str = "translation",
        own: Mapping[str, Any] | None = None,
        *,
        phrases: bool = False,
        **options: Any,
    ) -> DecodeConfig:
        """The preset with the options given (None: the preset's), by the names of
        ``aiayn.Translator.request``'s keywords (where they are listed, once): ``rules`` by
        name (``rules.SEARCH_RULES``), and K best raise the beam to K unless it is given, as
        ``phrases`` (the outputs must hold lexical phrases) raises it to ``CONSTRAINED_BEAM``.
        ``own``: the checkpoint's own settings per rules (``rules.own_defaults``), which stand
        for the preset's under those rules; the options given go over them."""
        given = {k: v for k, v in options.items() if v is not None}
        rules = given.pop("rules", "paper")
        overrides: dict[str, Any] = own_defaults(own, rules)
        overrides.update(given)  # the caller's win
        if rules != "paper":
            overrides.setdefault("rules", search_rules(rules))
        nbest = overrides.get("nbest")
        if isinstance(nbest, int) and "beam" not in given:  # K best need a beam of K at least
            overrides["beam"] = max(nbest, overrides.get("beam", cls.preset(preset).beam))
        if phrases and "beam" not in given:
            overrides["beam"] = max(
                CONSTRAINED_BEAM, overrides.get("beam", cls.preset(preset).beam)
            )
        return cls.preset(preset, **overrides)

    def max_len(self, src_len: Tensor, cap: int | None = None) -> Tensor:
        """(B,) source lengths -> (B,) long maximum output lengths |Y| (eos included), >= 1."""
        if self.rules.max_len is not None:
            limit = torch.full_like(src_len, self.rules.max_len, dtype=torch.long)
        elif self.rules.max_len_factor is not None:
            limit = (self.rules.max_len_factor * src_len.to(torch.float64)).ceil().long()
        else:
            limit = (self.max_len_a * src_len.to(torch.float64) + self.max_len_b).floor().long()
        return limit.clamp(min=1, max=cap) if cap is not None else limit.clamp(min=1)


# The fields a caller sets by number, and the types they must have (int for a float is fine).
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "beam": int,
    "alpha": (int, float),
    "max_len_a": (int, float),
    "max_len_b": int,
    "nbest": int,
    "no_repeat_ngram_size": int,
    "repetition_penalty": (int, float),
}

DECODE_PRESETS: dict[str, DecodeConfig] = {
    "translation": DecodeConfig(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=50),
    "parsing": DecodeConfig(beam=21, alpha=0.3, max_len_a=1.0, max_len_b=300),
}
