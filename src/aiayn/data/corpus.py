"""One call from raw parallel files to a prepared dataset, and the bundled corpus's paths.

``prepare_corpus`` is the entry point for the CLI: it trains the shared vocabulary on the
training split only (so valid/test statistics cannot leak into it), binarises every split
and writes ``meta.json`` with the counts of everything skipped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from .binarize import binarize_split, write_meta
from .readers import DataError, ReadStats, iter_lines, iter_parallel
from .vocab import Vocab

PathPair = tuple[str | os.PathLike, str | os.PathLike]
BIBLE_SPLITS = ("train", "valid", "test")


def bundled_corpus_paths(src: str = "en", tgt: str = "es") -> dict[str, tuple[Path, Path]]:
    """{split: (source file, target file)} of the Bible corpus shipped in ``aiayn/corpus/bible/``.

    Package data, found through importlib.resources, so the same call works from a source
    checkout, an editable install and an installed wheel. pip installs wheels unpacked, so the
    resource is a real directory and plain paths (which sentencepiece and gzip need) are safe.
    """
    root = Path(str(resources.files("aiayn") / "corpus" / "bible"))
    if not (root / "train.en.gz").is_file():
        raise DataError(f"bundled corpus not found: no {root / 'train.en.gz'}; reinstall aiayn")
    return {s: (root / f"{s}.{src}.gz", root / f"{s}.{tgt}.gz") for s in BIBLE_SPLITS}


def prepare_corpus(
    splits: dict[str, PathPair],
    out_dir: str | os.PathLike,
    vocab_size: int = 8000,
    max_len: int | None = 256,
    max_words: int | None = None,
    num_threads: int = 2,
    user_defined_symbols: Sequence[str] = (),
) -> dict[str, Any]:
    """Train the vocabulary on ``splits["train"]`` and binarise every split into ``out_dir``.

    ``max_len`` bounds subwords per side (longer pairs skipped); ``max_words`` optionally
    bounds whitespace words while reading. ``user_defined_symbols`` become atomic
    vocabulary pieces (see ``Vocab.train``). Returns the ``meta.json`` contents plus timings.
    """
    if "train" not in splits:
        raise DataError(f"prepare_corpus needs a 'train' split, got {sorted(splits)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    train_src, train_tgt = (Path(p) for p in splits["train"])
    vocab = Vocab.train(_nonempty(train_src, train_tgt), out / "spm", vocab_size, num_threads=num_threads,
                        user_defined_symbols=user_defined_symbols)
    vocab_s = time.perf_counter() - start
    summary: dict[str, dict[str, int]] = {}
    for split, (src_path, tgt_path) in splits.items():
        stats = ReadStats()
        pairs = iter_parallel(src_path, tgt_path, max_words, stats)
        counts = binarize_split(pairs, vocab, out, split, max_len)
        summary[split] = {**counts, "read": stats.read, "skipped_empty": stats.empty,
                          "skipped_too_long_words": stats.too_long}
    meta = write_meta(out, vocab, summary)
    return {**meta, "seconds": {"vocab": vocab_s, "total": time.perf_counter() - start}}


def _nonempty(*paths: Path) -> Iterator[str]:
    # Both languages feed one shared vocabulary (paper section 5.1).
    for path in paths:
        yield from (line for line in iter_lines(path) if line.strip())
