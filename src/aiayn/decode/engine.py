"""What decodes for the commands: an ``Engine`` turns source ids into n-best hypotheses, as
``decode_ids`` does, so that ``evaluate`` and ``serve`` need not know which engine it is.

``TorchEngine`` is ours, the default and the reference. Another engine (CTranslate2, in
``aiayn.export.engine``) is an application built on the library: ``aiayn.Translator`` (an
application too) opens it for the commands, so that imports keep flowing one way.

    engine = TorchEngine(model)
    for window in translate_corpus(engine, lines, vocab, request, outputs=translate_with):
        ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .beam import Hypothesis
from .capabilities import ALL_FEATURES, Feature, check_supported
from .request import SearchRequest
from .translate import OnTruncate, Progress, check_sentences, decode_ids, eval_mode, positions


class Engine(Protocol):
    """Source ids (subwords + eos) -> n-best ``Hypothesis`` lists in input order, ``[]`` for an
    empty source, as ``request`` asks; what it ``supports`` beyond the paper's beam search is
    declared (``capabilities.Feature``: "seed" when SampleConfig.seed makes samples
    reproducible), and ``capabilities.check_supported`` refuses the rest before anything is
    decoded, as the command line and the server refuse it before anything loads."""

    name: str
    supports: frozenset[Feature]

    @property
    def max_positions(self) -> int | None: ...

    def decode_ids(
        self,
        sources: Sequence[Sequence[int]],
        request: SearchRequest,
        *,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Hypothesis]]: ...


@dataclass(frozen=True)
class TorchEngine:
    """Our own search on a model (a ``Transformer`` or an ``Ensemble``), in eval mode."""

    model: Any
    name: str = "torch"
    supports: frozenset[Feature] = ALL_FEATURES

    @property
    def max_positions(self) -> int | None:
        return positions(self.model)

    def decode_ids(
        self,
        sources: Sequence[Sequence[int]],
        request: SearchRequest,
        *,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Hypothesis]]:
        check_supported(request.features(), self.name, self.supports, where=request.where())
        with eval_mode(self.model):
            return decode_ids(
                self.model, sources, request, progress=progress, on_truncate=on_truncate
            )


def translate_with(
    engine: Engine,
    lines: Sequence[str],
    tokenizer: Any,
    request: SearchRequest,
    *,
    progress: bool | Progress = False,
    on_truncate: OnTruncate | None = None,
) -> list[str]:
    """``translate`` by any engine: sentences -> best translations ("" for a blank line). It
    is a ``WindowOutputs``, so ``translate_corpus(engine, ..., outputs=translate_with)``."""
    check_sentences(lines, "lines")
    sources = [tokenizer.encode_source(line) for line in lines]
    nbest = engine.decode_ids(
        sources, request.with_ids(tokenizer), progress=progress, on_truncate=on_truncate
    )
    return [tokenizer.decode(h[0].tokens) if h else "" for h in nbest]
