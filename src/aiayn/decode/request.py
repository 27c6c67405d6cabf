"""One search, asked for as data: a ``SearchRequest`` holds everything a search is told (the
paper's beam settings, constraints, sampling, shortlist, batching, device, the special ids),
so that every caller (translate, evaluate, validation, the server, parsing) builds one record
and every engine reads one, refusing what it cannot do through ``capabilities.check_supported``
(``features`` and ``where`` say what the request asks, and where).

    request = SearchRequest(DecodeConfig.preset("translation"), batching=Batching(workers=2))
    nbest = decode_ids(model, sources, request)

One batching policy serves every search (``Batching``): at most ``BATCH_SIZE`` sentences and
``MAX_TOKENS`` padded source tokens a batch at up to the paper's beam of 4; a wider beam (or
more samples) gets proportionally fewer tokens, since the decoder's rows are sentences x beam.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..data.vocab import BOS_ID, EOS_ID, PAD_ID  # the vocabulary's ids: one source
from ..errors import UserError
from .capabilities import Feature
from .config import DecodeConfig
from .constraints import Constraint
from .rules import PAPER_RULES
from .sample import SampleConfig
from .shortlist import Shortlist

if TYPE_CHECKING:
    from ..text.glossary import Glossary

BATCH_SIZE = 64  # sentences in one batch: a beam of short sentences holds many rows
MAX_TOKENS = 8000  # padded source tokens in one batch at up to BEAM_ROWS rows per source
BEAM_ROWS = 4  # the paper's beam: wider searches get MAX_TOKENS * BEAM_ROWS / rows tokens


@dataclass(frozen=True)
class Batching:
    """How sources are grouped into forward passes (sorted by length, longest first).

    ``max_tokens`` None: the policy's budget for the search's rows per source (``tokens``).
    ``workers``: CPU processes decoding batches side by side (``aiayn.runtime.workers``)."""

    batch_size: int | None = BATCH_SIZE
    max_tokens: int | None = None
    workers: int = 1

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_tokens", "workers"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"{name} must be at least 1, got {value}")

    def tokens(self, rows: int) -> int:
        """Padded source tokens a batch may hold when each source has ``rows`` rows."""
        if self.max_tokens is not None:
            return self.max_tokens
        return max(1, MAX_TOKENS * BEAM_ROWS // max(rows, BEAM_ROWS))


@dataclass(frozen=True)
class SpecialIds:
    """The padding, begin and end ids of the vocabulary the sources were encoded with."""

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    @classmethod
    def of(cls, tokenizer: Any) -> SpecialIds:
        """A tokenizer's ids (those it does not name keep the vocabulary's defaults)."""
        names = ("pad_id", "bos_id", "eos_id")
        return cls(**{n: getattr(tokenizer, n) for n in names if hasattr(tokenizer, n)})


@dataclass(frozen=True)
class SearchRequest:
    """What to search for each source: frozen, so one request can be shared and ``replace``d.

    ``constraints``: one for every source, or one (or None) per source (a tuple).
    ``sampling``: draw ``sampling.samples`` outputs per source instead of the beam search,
    source i seeded as input sentence ``first_index + i`` (or ``first_index[i]``: a server
    seeds each sentence by its place in its own request, whatever it is decoded with).
    ``max_src_len``: sources longer are cut (default: the model's positions). ``device``: None
    for the model's own. ``glossary``: terms (their target pieces spelled) that become the
    lexical constraints of the sources they occur in (``aiayn.Translator`` adds them to each
    window's constraints); ``target_lang``: the code of the language token (``>>fr<<``) put
    in front of every source."""

    decode: DecodeConfig = field(default_factory=DecodeConfig)
    min_len: int = 0
    max_src_len: int | None = None
    constraints: Constraint | tuple[Constraint | None, ...] | None = None
    sampling: SampleConfig | None = None
    first_index: int | tuple[int, ...] = 0
    shortlist: Shortlist | None = None
    batching: Batching = field(default_factory=Batching)
    device: str | None = None
    ids: SpecialIds = field(default_factory=SpecialIds)
    glossary: Glossary | None = None
    target_lang: str | None = None

    def __post_init__(self) -> None:
        # Lists given by callers become tuples: the record stays hashable and immutable.
        for name in ("constraints", "first_index"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def rows(self) -> int:
        """Rows the search keeps per source: the beam, or the samples drawn."""
        return self.decode.beam if self.sampling is None else self.sampling.samples

    def with_ids(self, tokenizer: Any) -> SearchRequest:
        """This request for sources encoded by ``tokenizer`` (its special ids)."""
        return replace(self, ids=SpecialIds.of(tokenizer))

    def constraints_of(self, members: Sequence[int]) -> Constraint | list[Constraint | None] | None:
        """The constraint of each source in ``members`` (or the one shared by all)."""
        if isinstance(self.constraints, tuple):
            return [self.constraints[i] for i in members]
        return self.constraints

    def indices(self, members: Sequence[int]) -> list[int]:
        """The sampling indices (seeds' streams) of sources ``members``."""
        if isinstance(self.first_index, tuple):
            return [self.first_index[i] for i in members]
        return [self.first_index + i for i in members]

    def features(self) -> set[Feature]:
        """What this request asks beyond the paper's beam search."""
        used: set[Feature] = set()
        if self.min_len:
            used.add("min_len")
        if self.max_src_len is not None:
            used.add("max_src_len")
        if self.sampling is not None:
            used.add("sampling")
        if self.shortlist is not None:
            used.add("shortlist")
        if self.glossary is not None:
            used.add("glossary")
        if self.decode.rules != PAPER_RULES:
            used.add("search_rules")
        if self.decode.no_repeat_ngram_size:
            used.add("no_repeat_ngram")
        if self.decode.repetition_penalty != 1.0:
            used.add("repetition_penalty")
        for c in self._per_source():
            if c is not None:
                used.add("prefixes" if _prefix_only(c) else "lexical_constraints")
        return used

    def where(self) -> dict[Feature, str]:
        """Where the first source asking for phrases was given (its constraint's ``where``,
        "c.txt: line 3"), for a refusal of lexical constraints to name it."""
        first = self.first_lexical()
        if first is None:
            return {}
        constraint = self._per_source()[first]
        where = getattr(constraint, "where", None)
        return {"lexical_constraints": where} if isinstance(where, str) else {}

    def first_lexical(self) -> int | None:
        """The index of the first source whose constraint asks for phrases (None: none)."""
        per_source = self._per_source()
        asks = (i for i, c in enumerate(per_source) if c is not None and not _prefix_only(c))
        return next(asks, None)

    def _per_source(self) -> Sequence[Constraint | None]:
        return self.constraints if isinstance(self.constraints, tuple) else [self.constraints]


def _prefix_only(constraint: Constraint) -> bool:
    """A target prefix with no phrases to include (what every engine can force)."""
    return hasattr(constraint, "prefix") and not getattr(constraint, "phrases", True)
