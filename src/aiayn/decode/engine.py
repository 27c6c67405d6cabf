"""What decodes for the commands: an ``Engine`` turns source ids into n-best hypotheses, as
``decode_ids`` does, and a window of sentences into n-best ``Output`` lists, so that
``aiayn.Translator``, ``evaluate`` and ``serve`` need not know which engine it is: they ask
the protocol, never the class.

``TorchEngine`` is ours, the default and the reference. Another engine (CTranslate2, in
``aiayn.export.engine``; ONNX Runtime, in ``aiayn.export.onnx_engine``) decodes ids only and
answers the rest of the protocol through ``IdsEngine``; it is an application built on the
library: ``aiayn.Translator`` (an
application too) opens it for the commands, so that imports keep flowing one way. What an
engine cannot do is refused by ``aiayn.Translator`` (``capabilities.check_supported``) before
anything loads or decodes, named as its user typed it; an engine that lacks a feature also
guards its own ``decode_ids``, for callers that use it directly.

    engine = TorchEngine(model)
    for window in translate_corpus(engine, lines, vocab, request, outputs=translate_with):
        ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .beam import Hypothesis
from .capabilities import ALL_FEATURES, Feature
from .nbest import Output, nbest_outputs
from .request import SearchRequest
from .translate import (
    OnTruncate,
    Progress,
    WindowOutputs,
    check_sentences,
    decode_ids,
    eval_mode,
    positions,
    translate,
)


class Engine(Protocol):
    """Source ids (subwords + eos) -> n-best ``Hypothesis`` lists in input order, ``[]`` for an
    empty source, as ``request`` asks; what it ``supports`` beyond the paper's beam search is
    declared (``capabilities.Feature``: "seed" when SampleConfig.seed makes samples
    reproducible), and ``aiayn.Translator`` refuses the rest before anything is decoded.

    ``decoder`` and ``best_lines``: what a window of best lines is decoded with, as
    ``translate_corpus`` takes them (``model`` and ``outputs``), so that ``--split`` and
    ``--markup`` wrap either engine's."""

    @property
    def name(self) -> str: ...

    @property
    def supports(self) -> frozenset[Feature]: ...

    @property
    def decoder(self) -> Any: ...

    @property
    def best_lines(self) -> WindowOutputs[str]: ...

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

    def nbest(
        self,
        texts: Sequence[str],
        tokenizer: Any,
        request: SearchRequest,
        *,
        token_scores: bool = False,
        alignment_layer: int | None = None,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Output]]:
        """Sentences -> their n-best ``Output`` lists (``[]`` for a blank one), in order."""
        ...


@dataclass(frozen=True)
class TorchEngine:
    """Our own search on a model (a ``Transformer`` or an ``Ensemble``), in eval mode."""

    model: Any
    name: str = "torch"
    supports: frozenset[Feature] = ALL_FEATURES

    @property
    def max_positions(self) -> int | None:
        return positions(self.model)

    @property
    def decoder(self) -> Any:
        return self.model

    @property
    def best_lines(self) -> WindowOutputs[str]:
        return translate

    def nbest(
        self,
        texts: Sequence[str],
        tokenizer: Any,
        request: SearchRequest,
        *,
        token_scores: bool = False,
        alignment_layer: int | None = None,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Output]]:
        """``nbest_outputs`` of our model: token scores and alignments on request."""
        return nbest_outputs(
            self.model,
            texts,
            tokenizer,
            request,
            token_scores=token_scores,
            alignment_layer=alignment_layer,
            progress=progress,
            on_truncate=on_truncate,
        )

    def decode_ids(
        self,
        sources: Sequence[Sequence[int]],
        request: SearchRequest,
        *,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Hypothesis]]:
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


class IdsEngine(ABC):
    """What an engine that decodes ids only (CTranslate2, ONNX Runtime) answers the rest of the
    ``Engine`` protocol with, written once: it decodes a window of best lines itself
    (``translate_with``), and its n-best lists are its ``decode_ids``' hypotheses as text
    (token scores and alignments are our model's, which ``aiayn.Translator`` refuses for it
    first). A subclass gives ``name``, ``supports``, ``max_positions`` and ``decode_ids``."""

    name: str

    @abstractmethod
    def decode_ids(
        self,
        sources: Sequence[Sequence[int]],
        request: SearchRequest,
        *,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Hypothesis]]: ...

    @property
    def decoder(self) -> Any:
        """What ``best_lines`` decodes with: this engine (``--split``, ``--markup``), so that
        every window goes through its ``decode_ids``."""
        return self

    @property
    def best_lines(self) -> WindowOutputs[str]:
        return translate_with

    def nbest(
        self,
        texts: Sequence[str],
        tokenizer: Any,
        request: SearchRequest,
        *,
        token_scores: bool = False,
        alignment_layer: int | None = None,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Output]]:
        """Sentences -> their n-best ``Output`` lists (``[]`` for a blank one), in order."""
        if token_scores or alignment_layer is not None:
            raise ValueError(f"{self.name}: token scores and alignments are our model's")
        request = request.with_ids(tokenizer)
        sources = [tokenizer.encode_source(text) for text in texts]
        found = self.decode_ids(sources, request, progress=progress, on_truncate=on_truncate)
        return [[Output.of(h, tokenizer.decode(h.tokens)) for h in hyps] for hyps in found]
