"""Reading raw parallel text: two aligned plain files (optionally gzipped) or one TSV file.

Bad input fails loudly and early, naming the file and line, because a silently misaligned
corpus trains a model that translates sentence i into sentence i+1. Pairs that are merely
unusable (an empty side, too many words) are skipped and counted in ``ReadStats`` so the
caller can report how much data was dropped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import UserError
from ..files import iter_lines

PathLike = str | os.PathLike


@dataclass
class ReadStats:
    """How many pairs were read, kept and skipped (and why)."""

    read: int = 0
    kept: int = 0
    empty: int = 0  # one side (or both) is empty after stripping whitespace
    too_long: int = 0  # one side has more than ``max_words`` whitespace-separated words

    def add(self, other: ReadStats) -> None:
        self.read += other.read
        self.kept += other.kept
        self.empty += other.empty
        self.too_long += other.too_long


def _count_rest(lines: Iterator[str]) -> int:
    return sum(1 for _ in lines)


def _keep(src: str, tgt: str, max_words: int | None, stats: ReadStats) -> bool:
    stats.read += 1
    if not src or not tgt:
        stats.empty += 1
        return False
    if max_words is not None and max(len(src.split()), len(tgt.split())) > max_words:
        stats.too_long += 1
        return False
    stats.kept += 1
    return True


def iter_parallel(
    src_path: PathLike,
    tgt_path: PathLike,
    max_words: int | None = None,
    stats: ReadStats | None = None,
) -> Iterator[tuple[str, str]]:
    """Yield stripped (source, target) pairs from two line-aligned files.

    Streaming (so WMT-sized files need no memory); ``stats`` is filled in as pairs go by.
    Raises ``UserError`` if the files have different line counts, naming both counts; the
    check necessarily fires only when the shorter file runs out.
    """
    stats = stats if stats is not None else ReadStats()
    src_lines, tgt_lines = iter_lines(src_path), iter_lines(tgt_path)
    n = 0
    for src in src_lines:
        tgt = next(tgt_lines, None)
        if tgt is None:
            n_src = n + 1 + _count_rest(src_lines)
            raise UserError(f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n}")
        n += 1
        src, tgt = src.strip(), tgt.strip()
        if _keep(src, tgt, max_words, stats):
            yield src, tgt
    n_tgt = n + _count_rest(tgt_lines)
    if n_tgt != n:
        raise UserError(f"line counts differ: {src_path} has {n} lines, {tgt_path} has {n_tgt}")


def iter_tsv(
    path: PathLike, max_words: int | None = None, stats: ReadStats | None = None
) -> Iterator[tuple[str, str]]:
    """Yield (source, target) pairs from a file of ``source<TAB>target`` lines."""
    stats = stats if stats is not None else ReadStats()
    for lineno, line in enumerate(iter_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise UserError(
                f"{path}: line {lineno}: expected 2 tab-separated fields, found {len(fields)}"
            )
        src, tgt = fields[0].strip(), fields[1].strip()
        if _keep(src, tgt, max_words, stats):
            yield src, tgt


def read_parallel(
    src_path: PathLike, tgt_path: PathLike, max_words: int | None = None
) -> tuple[list[tuple[str, str]], ReadStats]:
    """All usable pairs of two aligned files, with the counts of what was skipped."""
    stats = ReadStats()
    return list(iter_parallel(src_path, tgt_path, max_words, stats)), stats


def read_tsv(
    path: PathLike, max_words: int | None = None
) -> tuple[list[tuple[str, str]], ReadStats]:
    """All usable pairs of a TSV file, with the counts of what was skipped."""
    stats = ReadStats()
    return list(iter_tsv(path, max_words, stats)), stats
