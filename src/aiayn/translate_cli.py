"""Streaming translation for ``aiayn translate``: raw text in, detokenised text out, one line
per line, order kept, flushed chunk by chunk so that a pipe sees results as they come."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import TextIO

from .checkpoint import VOCAB, load_transformer
from .data import Vocab
from .decode import DecodeConfig, quantize as quantize_model, translate


def translate_stream(checkpoint: str | Path, source: TextIO, sink: TextIO, decode: DecodeConfig,
                     device: str = "cpu", chunk: int = 64, prompt: bool = False,
                     quantize: str | None = None) -> int:
    """Translate every line of ``source`` to ``sink``; returns the number of lines.
    ``quantize``: None or "int8" (see ``aiayn.decode.quantize``)."""
    model = quantize_model(load_transformer(checkpoint, device)[0], quantize)
    vocab = Vocab.load(Path(checkpoint) / VOCAB)
    count = 0
    while True:
        if prompt:
            sink.write("> ")
            sink.flush()
        lines = [line.rstrip("\n") for line in islice(source, chunk)]
        if not lines:
            return count
        for out in translate(model, lines, vocab, decode, batch_size=chunk, max_tokens=8000):
            sink.write(out + "\n")
        sink.flush()
        count += len(lines)
