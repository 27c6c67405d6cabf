"""The teacher's translation of the training sources, kept through a kill: the sources are
cut into chunks of ``CHUNK`` lines, each chunk's n-best lists are written atomically as a
file of its own, and a run started again skips the chunks on disk. Once every chunk is
there they are joined into one JSON-lines file, a line a source (``Output.record`` of each
hypothesis, best first), which equals the file an uninterrupted run writes: the chunks are
the same lines decoded the same way, whenever they were decoded.

A kill loses at most the chunk in progress. What a chunk was made with (the teacher's
checkpoints, the search, the chunk size, the sources' digest) is kept beside the chunks, and
a run with other settings is refused rather than mixing two teachers in one corpus.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..errors import UserError
from ..files import atomic_file, read_jsonl, write_lines_atomic, write_text_atomic

CHUNK = 500  # lines a chunk: what a kill can lose (a minute or two of a CPU's beam search)
SETTINGS = "settings.json"
PART = re.compile(r"part-(\d{6})\.jsonl")


def sources_digest(sources: Sequence[str]) -> str:
    """SHA-256 of the sources, a line each: a resume must translate the same lines."""
    digest = hashlib.sha256()
    for line in sources:
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


def translate_resumable(
    translator: Any,
    sources: Sequence[str],
    out: Path,
    request: Any,
    *,
    settings: dict[str, Any],
    chunk: int = CHUNK,
    progress: bool = False,
) -> Path:
    """``sources`` translated by ``translator`` (an ``aiayn.Translator``) with ``request``
    into ``out`` (JSON lines: ``{"nbest": [Output.record(), ...]}``), chunk by chunk in the
    directory ``out`` + ``.parts``, resuming from the chunks there. ``settings`` (the teacher
    and its search, as plain data) must equal those the chunks were made with."""
    if chunk < 1:
        raise UserError(f"chunk must be at least 1 line, got {chunk}")
    parts = out.with_name(out.name + ".parts")
    wanted = {**settings, "chunk": chunk, "lines": len(sources)}
    wanted["sources_sha256"] = sources_digest(sources)
    _check_settings(parts, wanted)
    if out.is_file():
        return out
    starts = range(0, len(sources), chunk)
    done = {int(m[1]) for p in parts.iterdir() if (m := PART.fullmatch(p.name))}
    bar = tqdm(
        total=len(sources),
        initial=sum(min(chunk, len(sources) - i * chunk) for i in done),
        desc="teacher",
        unit=" sentences",
        disable=not progress,
    )
    with bar:
        for number, start in enumerate(starts):
            if number in done:
                continue
            lines = list(sources[start : start + chunk])
            _write_part(
                parts / f"part-{number:06d}.jsonl", _nbest_lines(translator, lines, request)
            )
            bar.update(len(lines))
    _join(parts, len(starts), out)
    return out


def _check_settings(parts: Path, wanted: dict[str, Any]) -> None:
    """Start ``parts`` with ``wanted`` written in it, or refuse the settings found there."""
    path = parts / SETTINGS
    if path.is_file():
        found = json.loads(path.read_text(encoding="utf-8"))
        if found != wanted:
            differ = sorted(
                k for k in wanted.keys() | found.keys() if found.get(k) != wanted.get(k)
            )
            raise UserError(
                f"{parts}: the teacher's translation there was made with other settings "
                f"({', '.join(differ)}); give another --out, or delete {parts} and its "
                f"{parts.name.removesuffix('.parts')}"
            )
        for leftover in parts.glob(".part-*.tmp.jsonl"):  # a chunk a kill stopped mid-write
            leftover.unlink()
        return
    parts.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(wanted, indent=1, sort_keys=True) + "\n")


def _nbest_lines(translator: Any, lines: list[str], request: Any) -> list[str]:
    """One JSON line per source: its hypotheses, best first (none for a blank line)."""
    windows = translator.windows(lines, request, window=max(len(lines), 1))
    found = [outputs for window in windows for outputs in window]
    return [
        json.dumps({"nbest": [o.record() for o in outputs]}, ensure_ascii=False)
        for outputs in found
    ]


def _write_part(path: Path, lines: list[str]) -> None:
    write_lines_atomic(path, lines)


def _join(parts: Path, n: int, out: Path) -> None:
    """The chunks joined into ``out`` (atomically), then removed: ``settings.json`` stays,
    saying what ``out`` was made with."""
    with atomic_file(out) as tmp, open(tmp, "wb") as sink:
        for number in range(n):
            sink.write((parts / f"part-{number:06d}.jsonl").read_bytes())
    for number in range(n):
        (parts / f"part-{number:06d}.jsonl").unlink()


def read_nbest(path: Path) -> list[list[dict[str, Any]]]:
    """The n-best lists ``translate_resumable`` wrote, a list per source line."""
    return [row["nbest"] for row in read_jsonl(path)]
