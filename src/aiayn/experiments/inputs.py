"""The inputs of an experiment: a prepared dataset and the raw validation text it is scored
on, and how results.json records them (a rerun must match the record to continue a table).
Kept apart from the training rows so that ``heads``, which trains nothing, needs no trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data import bundled_corpus_paths, prepare_bundled
from ..errors import UserError
from ..files import read_lines


@dataclass(frozen=True)
class Corpus:
    """A prepared dataset (``aiayn prepare``) and its raw validation text (for BLEU)."""

    data: Path
    valid: tuple[Path, Path]
    lang: str = "es"  # target language (paper BLEU's tokeniser); BLEU here is SacreBLEU

    def valid_pairs(self, limit: int | None = None) -> tuple[list[str], list[str]]:
        sources, references = (read_lines(p) for p in self.valid)
        if len(sources) != len(references):
            raise UserError(
                f"{self.valid[0]} has {len(sources)} lines, {self.valid[1]} {len(references)}"
            )
        return sources[:limit], references[:limit]

    def record(self) -> dict[str, Any]:
        """What results.json records of this corpus (a rerun must match it to continue)."""
        return {"data": str(self.data), "valid": recorded_valid(self.valid)}


def valid_paths(valid: Sequence[str] | None) -> tuple[Path, Path]:
    """The given raw validation files, or the bundled corpus's."""
    if valid:
        return Path(valid[0]), Path(valid[1])
    return bundled_corpus_paths()["valid"]


def recorded_valid(valid: tuple[Path, Path]) -> str | list[str]:
    """``"bundled"`` for the bundled corpus's validation split, else the two paths: the
    bundled files' absolute paths depend on where the package is installed, and a table must
    still continue after a reinstall or from another checkout."""
    return "bundled" if valid == bundled_corpus_paths()["valid"] else [str(p) for p in valid]


def load_corpus(data: Path, valid: Sequence[str] | None = None) -> Corpus:
    """``data`` as given, or the bundled corpus prepared into it when it holds no dataset."""
    if not (data / "meta.json").exists():
        prepare_bundled(data)
    return Corpus(data, valid_paths(valid))
