"""Streaming translation for ``aiayn translate``: raw text in, detokenised text out, one line
per line, order kept, flushed chunk by chunk so that a pipe sees results as they come."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import IO, TextIO

from ..checkpoint import VOCAB, load_transformer
from ..data import Vocab
from ..decode import DecodeConfig, translate
from ..io import InputError, decode_line, split_lines


def translate_stream(checkpoint: str | Path, source: IO[bytes], sink: TextIO, decode: DecodeConfig,
                     device: str = "cpu", chunk: int = 64, prompt: bool = False, name: str = "<stdin>") -> int:
    """Translate every line of the byte stream ``source`` to ``sink``; returns the number of lines.

    Lines are split by the rule of ``aiayn.io``. A line that is not valid UTF-8 gets an empty
    output line (so outputs stay aligned with inputs) and the rest is translated; then
    ``InputError`` names those lines (``name`` is what it calls the input).
    """
    if chunk < 1:
        raise InputError(f"--chunk must be at least 1, got {chunk}")
    model, _ = load_transformer(checkpoint, device)
    vocab = Vocab.load(Path(checkpoint) / VOCAB)
    lines = enumerate(split_lines(source), start=1)
    count, bad = 0, []
    while True:
        if prompt:
            sink.write("> ")
            sink.flush()
        texts = []
        for lineno, raw in islice(lines, chunk):
            try:
                texts.append(decode_line(raw, name, lineno))
            except InputError:
                bad.append(lineno)
                texts.append("")  # an empty line translates to an empty line
        if not texts:
            break
        for out in translate(model, texts, vocab, decode, batch_size=chunk, max_tokens=8000):
            sink.write(out + "\n")
        sink.flush()
        count += len(texts)
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
        raise InputError(f"{name}: {len(bad)} line(s) not valid UTF-8 (line {shown}): their outputs are "
                         f"empty lines; the other {count - len(bad)} were translated")
    return count
