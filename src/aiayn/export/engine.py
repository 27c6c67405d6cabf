"""CTranslate2 as an engine behind ``translate``, ``evaluate`` and ``serve`` (``--engine
ctranslate2``): the checkpoint exported once into a cache, then decoded by
``ctranslate2.Translator`` with the paper's search (``ct2_search.search_pieces``: beam 4,
GNMT alpha 0.6, |Y| <= |X| + 50), so that its outputs are ours.

The cache is ``CKPT.ctranslate2/`` beside the checkpoint directory, or, when that directory's
parent is read-only, ``$XDG_CACHE_HOME/aiayn/ctranslate2/FINGERPRINT/`` (default ``~/.cache``).
Its marker (``aiayn-export.json``) records the fingerprint of what it was built from: the
checkpoint's weights, ``meta.json`` and ``spm.model``, this exporter's format version and
CTranslate2's version. A cache whose fingerprint differs is rebuilt, in a temporary directory
renamed into place; a directory there that the engine did not create (no marker, or an
``aiayn export`` of the user's) is never replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint import META, VOCAB, WEIGHTS, load_vocab, read_meta
from ..config import ModelConfig, from_dict
from ..data.pieces import AnyVocab, vocabulary_file, vocabulary_files
from ..decode import Hypothesis
from ..decode.capabilities import Feature, check_supported
from ..decode.engine import IdsEngine
from ..decode.request import SearchRequest, SpecialIds
from ..decode.translate import OnTruncate, Progress, fit_sources, progress_bar
from .common import MARKER, ExportError, load_for_export, require
from .ct2_search import search_pieces
from .ctranslate2 import TARGET, export_ctranslate2

FORMAT = 1  # the cache's layout: bump when the exporter writes something else
CACHE_SUFFIX = ".ctranslate2"


def checkpoint_fingerprint(ckpt: Path) -> str:
    """SHA-256 of what the export is made from: the checkpoint's files the model and its
    vocabulary are read from, this exporter's format and CTranslate2's version."""
    import ctranslate2

    digest = hashlib.sha256(f"format {FORMAT} ctranslate2 {ctranslate2.__version__}\n".encode())
    vocab = vocabulary_file(ckpt)  # spm.model, or pieces.json and its two models
    names = [WEIGHTS, META] + (
        [VOCAB] if vocab is None else [p.name for p in vocabulary_files(vocab)]
    )
    for name in names:
        path = ckpt / name
        if not path.is_file():
            raise ExportError(f"{ckpt}: no {name}; --engine ctranslate2 exports from it")
        digest.update(f"{name}\n".encode())
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def user_cache() -> Path:
    """Where caches go when the checkpoint's directory cannot hold them (XDG's cache home)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "aiayn" / "ctranslate2"


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def cache_dir(ckpt: Path, fingerprint: str) -> Path:
    """``CKPT.ctranslate2`` beside the checkpoint, or the user's cache when that is read-only."""
    beside = ckpt.parent / (ckpt.name + CACHE_SUFFIX)
    if _writable(ckpt.parent):
        return beside
    return user_cache() / fingerprint[:32]


def _marker(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cached_export(checkpoint: str | os.PathLike) -> Path:
    """The CTranslate2 model directory of ``checkpoint``: its cache when the fingerprint
    matches, else exported now (a one-line note on stderr) and cached."""
    require("ctranslate2", TARGET)
    ckpt = Path(checkpoint)
    fingerprint = checkpoint_fingerprint(ckpt)
    out = cache_dir(ckpt, fingerprint)
    marker = _marker(out)
    if marker is not None and marker.get("fingerprint") == fingerprint:
        return out
    if out.exists() and (marker is None or "fingerprint" not in marker):
        made_by = "an aiayn export of yours" if marker else "not made by aiayn"
        raise ExportError(
            f"{out}: the CTranslate2 cache of {ckpt} is taken by a directory {made_by}; "
            "move it away (it is never replaced)"
        )
    print(f"aiayn: exporting {ckpt} to CTranslate2 in {out} (once per checkpoint)", file=sys.stderr)
    model, vocab = load_for_export(ckpt)
    return export_ctranslate2(model, vocab, out, source=str(ckpt), fingerprint=fingerprint)


def _device(device: str) -> tuple[str, int]:
    """``--device`` (cpu, cuda, cuda:N) as CTranslate2's (device, index)."""
    kind, _, index = device.partition(":")
    return kind, int(index or 0)


@dataclass
class CTranslate2Engine(IdsEngine):
    """A checkpoint's CTranslate2 export and our vocabulary, answering as ``decode_ids``."""

    translator: Any  # ctranslate2.Translator
    vocab: AnyVocab
    max_len: int  # the model's positions: the longest source and output
    workers: int = 1  # CTranslate2's replicas (inter_threads), each with its share of threads
    name: str = "ctranslate2"
    # prefixes (``target_prefix``) and sampling, the rest refused for the reasons
    # ``capabilities.CAPABILITIES`` gives (its seed, guards and precision are not ours)
    supports: frozenset[Feature] = frozenset({"prefixes", "sampling"})

    @classmethod
    def open(
        cls,
        checkpoint: str | os.PathLike,
        *,
        device: str = "cpu",
        threads: int = 0,
        workers: int = 1,
    ) -> CTranslate2Engine:
        """Export on first use (``cached_export``) and load it in float32 on ``device``;
        ``threads``: CTranslate2's threads in all (0: its default); ``workers``: replicas
        searching batches side by side (``inter_threads``, as ``--workers`` is for ours),
        each with ``threads // workers`` of them."""
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        import ctranslate2

        ckpt = Path(checkpoint)
        out = cached_export(ckpt)
        kind, index = _device(device)
        translator = ctranslate2.Translator(
            str(out),
            device=kind,
            device_index=index,
            compute_type="float32",
            intra_threads=max(1, threads // workers) if threads else 0,
            inter_threads=workers,
        )
        cfg = from_dict(ModelConfig, read_meta(ckpt)["model_config"], where=f"{ckpt}/{META}")
        return cls(translator, load_vocab(ckpt), cfg.max_len, workers=workers)

    @property
    def max_positions(self) -> int:
        return self.max_len

    def decode_ids(
        self,
        sources: Sequence[Sequence[int]],
        request: SearchRequest,
        *,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Hypothesis]]:
        """``decode_ids`` by CTranslate2 (sources: subwords + eos, truncated by the same rule).

        Batches hold ``request.batching.batch_size`` sentences (its token budget is ours
        only; output limits as ``search_pieces`` applies them). The request's special ids must
        be the vocabulary's, which the export fixes; its workers are fixed when the engine
        opens (``open``'s): 1 or that number; its device is the one the engine opened on.
        """
        # the engine's own guard, for callers that skip aiayn.Translator's refusal
        check_supported(request.features(), self.name, self.supports, where=request.where())
        workers = request.batching.workers
        if workers not in (1, self.workers):
            raise ValueError(
                f"CTranslate2Engine.decode_ids: workers={workers}, but the engine was opened "
                f"with {self.workers}; give workers to open"
            )
        v = self.vocab
        if request.ids != SpecialIds.of(v):  # a bug: the export fixes them
            raise ValueError(
                f"CTranslate2Engine.decode_ids: ids {request.ids} are not the export's"
            )
        sources = fit_sources(sources, self.max_len, v.eos_id, on_truncate)
        pieces = [[v.id_to_piece(i) for i in _without_eos(s, v.eos_id)] for s in sources]
        bar = progress_bar(len(sources), progress)
        if bar is not None:
            bar.update(sum(1 for s in pieces if not s))
        found = search_pieces(
            self.translator,
            pieces,
            request.decode,
            max_len_cap=self.max_len,
            max_batch_size=request.batching.batch_size or 0,
            eos_piece=v.id_to_piece(v.eos_id),
            never=[v.id_to_piece(v.pad_id), v.id_to_piece(v.bos_id)],
            prefixes=self._prefixes(request.constraints, len(sources)),
            sampling=request.sampling,
            on_done=None if bar is None else bar.update,
        )
        if progress is True:
            bar.close()
        return [
            [Hypothesis(self._ids(h.pieces), h.score, h.log_prob, h.length) for h in hyps]
            for hyps in found
        ]

    def _ids(self, pieces: list[str]) -> list[int]:
        return [self.vocab.piece_to_id(p) for p in pieces]

    def _prefixes(self, constraints: Any, n: int) -> list[list[str] | None] | None:
        """Each source's prefix as pieces (``check_supported`` let through prefixes only)."""
        per_source = constraints if isinstance(constraints, tuple) else [constraints] * n
        if all(c is None for c in per_source):
            return None
        return [None if c is None else self._pieces(c.prefix) or None for c in per_source]

    def _pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab.id_to_piece(i) for i in ids]


def _without_eos(source: Sequence[int], eos_id: int) -> list[int]:
    """A source as CTranslate2 takes it: it appends eos itself (``add_source_eos``)."""
    return list(source[:-1]) if source and source[-1] == eos_id else list(source)
