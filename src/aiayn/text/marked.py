"""``--markup`` / ``--placeholders`` around a translation: a ``WindowOutputs``
(``aiayn.decode.translate``) that takes each line apart (``markup.take_apart``), translates the
plain texts in one call, aligns each output to its source with the model's attention, and
puts the tags and placeholders back (``markup.put_back``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ..decode.align import cross_attention, pharaoh
from ..decode.engine import TorchEngine
from ..errors import UserError
from .markup import Marked, proportional, put_back, take_apart
from .placeholders import Placeholders


@dataclass
class MarkupOutputs:
    """``markup``: "xml", "html" or None (placeholders only); ``pattern``: what is taken out
    (``placeholders.placeholder_pattern``); ``layer``: the decoder layer whose attention
    aligns (-1: the last)."""

    markup: str | None
    pattern: Placeholders
    layer: int = -1

    def __call__(
        self,
        model: Any,
        texts: list[str],
        tokenizer: Any,
        request: Any,
        *,
        progress: Any,
        on_truncate: Any,
    ) -> list[str]:
        if "alignments" in getattr(tokenizer, "lacks", {}):  # Moses tokens, not the text's words
            raise UserError(
                "--markup and --placeholders put tags back by word alignments, which the "
                f"checkpoint's text splitting ({tokenizer.kind}) cannot give: "
                f"{tokenizer.lacks['alignments']}"
            )
        marked = [take_apart(t, self.pattern, html=self.markup == "html") for t in texts]
        broken = [(t, m.unpaired) for t, m in zip(texts, marked) if m.unpaired]
        if broken and self.markup is not None:
            text, tags = broken[0]
            warnings.warn(
                f"--markup: {len(broken)} line(s) not well formed, their unpaired tags kept as "
                f"placeholders (first: {', '.join(tags)} in {text.strip()[:60]!r})",
                stacklevel=2,
            )
        sources = [tokenizer.encode_source(m.source) if m.source else [] for m in marked]
        engine = model if hasattr(model, "decode_ids") else TorchEngine(model)
        nbest = engine.decode_ids(
            sources, request.with_ids(tokenizer), progress=progress, on_truncate=on_truncate
        )
        outs = []
        for m, source, hyps in zip(marked, sources, nbest):
            tokens = hyps[0].tokens if hyps else []
            translation = tokenizer.decode(tokens) if tokens else ""
            pairs = self._pairs(model, source, tokens, tokenizer, m, translation)
            outs.append(put_back(m, translation, pairs, markup=self.markup is not None))
        return outs

    def _pairs(
        self,
        model: Any,
        source: list[int],
        tokens: list[int],
        tokenizer: Any,
        m: Marked,
        translation: str,
    ) -> list[tuple[int, int]]:
        """(source word, target word) pairs: the model's attention, else by position."""
        if not tokens:
            return []
        if hasattr(model, "decode_ids"):  # an engine: no attention to read
            return proportional(len(m.words), len(translation.split()))
        attn = cross_attention(model, source, tokens, self.layer, tokenizer.bos_id)
        src_pieces = [tokenizer.id_to_piece(t) for t in source if t != tokenizer.eos_id]
        return pharaoh(attn, src_pieces, [tokenizer.id_to_piece(t) for t in tokens])
