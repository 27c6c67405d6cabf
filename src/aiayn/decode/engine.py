"""What decodes for the commands: an ``Engine`` turns source ids into n-best hypotheses, as
``decode_ids`` does, so that ``evaluate`` and ``serve`` need not know which engine it is.

``TorchEngine`` is ours, the default and the reference. Another engine (CTranslate2, in
``aiayn.export.engine``) is an application built on the library: the command line builds it
and hands it to ``evaluate_checkpoint`` or the server, so that imports keep flowing one way.

    engine = TorchEngine(model)
    for window in translate_corpus(engine, lines, vocab, config, outputs=translate_with):
        ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .beam import Hypothesis
from .config import DecodeConfig
from .translate import decode_ids, eval_mode, positions, special_ids


class Engine(Protocol):
    """Source ids (subwords + eos) -> n-best ``Hypothesis`` lists in input order, ``[]`` for an
    empty source; keyword arguments are ``decode_ids``'s (batch_size, max_tokens, sampling,
    constraint, first_index, progress, on_truncate, workers, shortlist, the special ids)."""

    name: str
    lexical_constraints: bool  # whether ``constraint`` may hold phrases, not only prefixes
    seeded_samples: bool  # whether SampleConfig.seed makes samples reproducible

    @property
    def max_positions(self) -> int | None: ...

    def decode_ids(
        self, sources: Sequence[Sequence[int]], config: DecodeConfig, **kwargs: Any
    ) -> list[list[Hypothesis]]: ...


@dataclass(frozen=True)
class TorchEngine:
    """Our own search on a model (a ``Transformer`` or an ``Ensemble``), in eval mode."""

    model: Any
    name: str = "torch"
    lexical_constraints: bool = True
    seeded_samples: bool = True

    @property
    def max_positions(self) -> int | None:
        return positions(self.model)

    def decode_ids(
        self, sources: Sequence[Sequence[int]], config: DecodeConfig, **kwargs: Any
    ) -> list[list[Hypothesis]]:
        with eval_mode(self.model):
            return decode_ids(self.model, sources, config, **kwargs)


def translate_with(
    engine: Engine, lines: Sequence[str], tokenizer: Any, config: DecodeConfig, **kwargs: Any
) -> list[str]:
    """``translate`` by any engine: sentences -> best translations ("" for a blank line). It
    is a ``WindowOutputs``, so ``translate_corpus(engine, ..., outputs=translate_with)``."""
    sources = [tokenizer.encode_source(line) for line in lines]
    nbest = engine.decode_ids(sources, config, **{**special_ids(tokenizer), **kwargs})
    return [tokenizer.decode(h[0].tokens) if h else "" for h in nbest]
