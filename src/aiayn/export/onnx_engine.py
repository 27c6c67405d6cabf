"""ONNX Runtime as an engine (``--engine onnxruntime``): our own search (``decode_ids``: beam
search and sampling, every search rule) driving an ONNX export's two graphs (``export.onnx``),
so that its outputs can be compared with ours token for token.

``OnnxModel`` answers the decoding interface the searches depend on (``encode``, ``src_mask``,
``new_cache``, ``decode_step``, ``cache.select``; ``decode.beam``) by running the graphs; the
cache is the graphs' tensors as numpy arrays, whose rows a search's ``select`` reorders.

    engine = OnnxEngine.open("runs/demo/onnx")
    hyps = engine.decode_ids([vocab.encode_source("In the beginning")], SearchRequest())
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..checkpoint import META, WEIGHTS
from ..data.pieces import load_vocabulary, vocabulary_file, vocabulary_files
from ..decode import Hypothesis
from ..decode.capabilities import ALL_FEATURES, Feature, check_supported
from ..decode.engine import IdsEngine
from ..decode.request import SearchRequest
from ..decode.translate import OnTruncate, Progress, decode_ids
from .common import MARKER, ExportError, load_for_export, require
from .onnx import (
    CONFIG,
    DECODER,
    DECODER_IO,
    ENCODER,
    ENCODER_IO,
    FORMAT,
    TARGET,
    export_onnx,
    session,
)

CACHE_SUFFIX = ".onnx"  # a checkpoint's export on first use: CKPT.onnx beside it

# ensemble, our int8 and bf16, the shortlist (it slices our output layer), token scores and
# alignments (from our model's forced decoding and attention) are not the graphs'
SUPPORTS: frozenset[Feature] = ALL_FEATURES - {
    "ensemble",
    "quantize",
    "precision",
    "shortlist",
    "token_scores",
    "alignments",
}


@dataclass
class OnnxCache:
    """The graphs' state for n sentences of b rows: the encoder's outputs, one per sentence,
    and the decoder's keys and values so far, one per row (module ``export.onnx``)."""

    memory_keys: np.ndarray  # (L, n, h, S, d_k)
    memory_values: np.ndarray  # (L, n, h, S, d_v)
    memory_bias: np.ndarray  # (n, S)
    keys: np.ndarray  # (L, rows, h, t, d_k)
    values: np.ndarray  # (L, rows, h, t, d_v)

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep/reorder the rows (``rows`` (B',) of the old), and with ``sentences`` (n',)
        the sentences, as ``decode.cache.DecoderCache.select`` does."""
        at = rows.cpu().numpy()
        self.keys, self.values = self.keys[:, at], self.values[:, at]
        if sentences is not None:
            kept = sentences.cpu().numpy()
            self.memory_keys, self.memory_values = (
                self.memory_keys[:, kept],
                self.memory_values[:, kept],
            )
            self.memory_bias = self.memory_bias[kept]


class OnnxModel:
    """The decoding interface over an ONNX export's encoder and decoder-step sessions."""

    def __init__(self, encoder: Any, step: Any, config: dict[str, Any]) -> None:
        self.encoder, self.step, self.config = encoder, step, config
        self.pad_id = config["ids"]["pad"]
        self.max_positions: int = config["max_len"]

    def src_mask(self, src: Tensor) -> Tensor:
        """(n, S) -> (n, 1, 1, S): True for real source tokens."""
        return (src != self.pad_id)[:, None, None, :]

    def encode(self, src: Tensor) -> list[np.ndarray]:
        """src (n, S) -> the encoder graph's outputs (opaque to the search)."""
        return self.encoder.run(None, {"src": src.cpu().numpy().astype(np.int64)})

    def new_cache(
        self, memory: list[np.ndarray], src_mask: Tensor, max_len: int | None = None
    ) -> OnnxCache:
        keys, values, bias = memory
        c, n = self.config, keys.shape[1]
        empty = [
            np.zeros((c["layers"], n, c["heads"], 0, c[d]), np.float32) for d in ("d_k", "d_v")
        ]
        return OnnxCache(keys, values, bias, *empty)

    def decode_step(self, tgt_in: Tensor, cache: OnnxCache) -> Tensor:
        """tgt_in (n*b, 1) -> log-probabilities (n*b, V); the cache takes the new position."""
        if tgt_in.size(1) != 1:
            raise ValueError(f"the ONNX decoder step takes one position, got {tgt_in.size(1)}")
        if cache.keys.shape[3] >= self.max_positions:
            raise ValueError(f"the model has {self.max_positions} positions; all are fed")
        feed = {
            "tokens": tgt_in.cpu().numpy().astype(np.int64),
            "memory_keys": cache.memory_keys,
            "memory_values": cache.memory_values,
            "memory_bias": cache.memory_bias,
            "past_keys": cache.keys,
            "past_values": cache.values,
        }
        log_probs, cache.keys, cache.values = self.step.run(None, feed)
        return torch.from_numpy(log_probs)


def _marker(directory: Path) -> dict[str, Any] | None:
    try:
        found = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _fingerprint(ckpt: Path) -> str:
    """SHA-256 of the checkpoint's files the export is made from, this exporter's format and
    ONNX Runtime's version."""
    import onnxruntime

    digest = hashlib.sha256(f"format {FORMAT} onnxruntime {onnxruntime.__version__}\n".encode())
    vocab = vocabulary_file(ckpt)
    names = [WEIGHTS, META] + ([] if vocab is None else [p.name for p in vocabulary_files(vocab)])
    for name in names:
        if not (ckpt / name).is_file():
            raise ExportError(f"{ckpt}: no {name}; --engine onnxruntime exports from it")
        digest.update(f"{name}\n".encode())
        with open(ckpt / name, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def onnx_directory(path: str | os.PathLike) -> Path:
    """What ``--engine onnxruntime --checkpoint PATH`` decodes: PATH when it is not a
    checkpoint (an ONNX export, or what ``OnnxEngine.open`` refuses), else the checkpoint's
    export in ``PATH.onnx`` beside it, made on first use (a note on stderr) and again when
    the checkpoint's files change; a directory there that is not that cache is never replaced."""
    ckpt = Path(path)
    if not (ckpt / META).is_file():
        return ckpt
    require("onnxruntime", TARGET, extra="onnx")
    fingerprint = _fingerprint(ckpt)
    out = ckpt.parent / (ckpt.name + CACHE_SUFFIX)
    marker = _marker(out)
    if marker is not None and marker.get("fingerprint") == fingerprint:
        return out
    if out.exists() and (marker is None or "fingerprint" not in marker):
        raise ExportError(
            f"{out}: the ONNX cache of {ckpt} is taken by a directory the engine did not make; "
            "move it away (it is never replaced)"
        )
    print(f"aiayn: exporting {ckpt} to ONNX in {out} (once per checkpoint)", file=sys.stderr)
    model, vocab = load_for_export(ckpt)
    return export_onnx(model, vocab, out, source=str(ckpt), fingerprint=fingerprint)


def _config(directory: Path) -> dict[str, Any]:
    """``model.json`` of an ONNX export of ours, or a one-line ExportError saying what it is not."""
    path = directory / CONFIG
    if not directory.is_dir():
        raise ExportError(
            f"{directory}: not a directory; --engine onnxruntime reads an ONNX export"
        )
    if (_marker(directory) or {}).get("format") != "onnx":
        raise ExportError(
            f"{directory}: not an ONNX export of aiayn (no {MARKER} saying format onnx); "
            f"make one with: aiayn export --checkpoint CKPT --to onnx --out {directory}"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: unreadable ({e.__class__.__name__}); export again") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise ExportError(f"{path}: format {found!r}, this aiayn reads {FORMAT}; export again")
    _check_config(config, path)
    return config


# What the engine reads of ``model.json`` (``consumer_config``), each a count or an id.
NUMBERS = ("vocab_size", "max_len", "layers", "heads", "d_k", "d_v")
IDS = ("pad", "bos", "eos", "unk")


def _check_config(config: dict[str, Any], path: Path) -> None:
    """One ExportError line naming the first key of ``model.json`` the engine cannot use: a
    JSON of another program's that happens to say format 1, or one edited by hand."""
    ids = config.get("ids")
    vocabulary = config.get("vocabulary")
    if not isinstance(vocabulary, str) or not vocabulary:
        raise ExportError(f"{path}: vocabulary is {vocabulary!r}, not a file name; export again")
    if not isinstance(ids, dict):
        raise ExportError(f"{path}: ids is {ids!r}, not the special ids; export again")
    counts = [(k, config.get(k), 1) for k in NUMBERS] + [(f"ids.{k}", ids.get(k), 0) for k in IDS]
    for key, value, least in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ExportError(
                f"{path}: {key} is {value!r}, not a whole number >= {least}; export again"
            )


def _io(config: dict[str, Any]) -> dict[str, tuple[str, list[int | None]]]:
    """Each graph input's and output's type and shape, as ``model.json`` fixes them (None: a
    dynamic axis, the module docstring of ``export.onnx``)."""
    L, h, V = config["layers"], config["heads"], config["vocab_size"]
    cache = {d: ("tensor(float)", [L, None, h, None, config[d]]) for d in ("d_k", "d_v")}
    lengths: tuple[str, list[int | None]] = ("tensor(float)", [None, None])
    return {
        "src": ("tensor(int64)", lengths[1]),
        "tokens": ("tensor(int64)", [None, 1]),
        "memory_bias": lengths,
        "log_probs": ("tensor(float)", [None, V]),
        **{name: cache["d_k"] for name in ("memory_keys", "past_keys", "keys")},
        **{name: cache["d_v"] for name in ("memory_values", "past_values", "values")},
    }


def _check_io(graph: Any, path: Path, config: dict[str, Any]) -> None:
    """One ExportError line naming the first input or output whose type or fixed sizes are not
    those ``model.json`` describes (a graph of another model, or of another export)."""
    expected = _io(config)
    for arg in [*graph.get_inputs(), *graph.get_outputs()]:
        kind, shape = expected[arg.name]
        dims = [d if isinstance(d, int) else None for d in arg.shape]
        if arg.type != kind or dims != shape:
            said = [d if d is not None else "*" for d in shape]
            raise ExportError(
                f"{path}: {arg.name} is {arg.type} {arg.shape}, {CONFIG} says {kind} {said}; "
                "export again"
            )


def _session(
    path: Path, names: tuple[list[str], list[str]], threads: int, config: dict[str, Any]
) -> Any:
    """The graph at ``path`` with the inputs and outputs ``names`` of the types and sizes
    ``config`` says, or one line saying why not."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidGraph, InvalidProtobuf

    if not path.is_file():
        raise ExportError(f"{path}: missing; export again")
    try:
        graph = session(path, threads)
    except (Fail, InvalidGraph, InvalidProtobuf) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{path}: ONNX Runtime cannot load it: {first}") from None
    found = ([i.name for i in graph.get_inputs()], [o.name for o in graph.get_outputs()])
    if found != names:
        raise ExportError(f"{path}: inputs/outputs {found}, expected {names}; export again")
    _check_io(graph, path, config)
    return graph


def _vocabulary(directory: Path, config: dict[str, Any]) -> Any:
    """The export's vocabulary, or one line: missing, damaged, or not the graphs' (its size or
    special ids differ from ``model.json``'s)."""
    path = directory / config["vocabulary"]
    if not path.is_file():
        raise ExportError(f"{directory}: no vocabulary {config['vocabulary']} beside the graphs")
    vocab = load_vocabulary(path)  # a damaged model: its own one line
    ids = {"pad": vocab.pad_id, "bos": vocab.bos_id, "eos": vocab.eos_id, "unk": vocab.unk_id}
    if len(vocab) != config["vocab_size"] or ids != {k: config["ids"][k] for k in IDS}:
        raise ExportError(
            f"{path}: {len(vocab)} pieces, ids {ids}; {directory / CONFIG} says "
            f"{config['vocab_size']}, {config['ids']}: not the graphs' vocabulary; export again"
        )
    return vocab


@dataclass
class OnnxEngine(IdsEngine):
    """An ONNX export answering as ``decode_ids``, by our search over ONNX Runtime."""

    model: OnnxModel
    vocab: Any
    name: str = "onnxruntime"
    supports: frozenset[Feature] = SUPPORTS

    @classmethod
    def open(cls, directory: str | os.PathLike, *, threads: int = 0) -> OnnxEngine:
        """The export in ``directory`` (``aiayn export --to onnx``); ``threads``: ONNX
        Runtime's intra-op threads (0: its default). What is not an export of ours, or is
        damaged, is one ExportError line."""
        require("onnxruntime", TARGET, extra="onnx")
        directory = Path(directory)
        config = _config(directory)
        encoder = _session(directory / ENCODER, ENCODER_IO, threads, config)
        step = _session(directory / DECODER, DECODER_IO, threads, config)
        return cls(OnnxModel(encoder, step, config), _vocabulary(directory, config))

    @property
    def max_positions(self) -> int:
        return self.model.max_positions

    def decode_ids(
        self,
        sources: Sequence[Sequence[int]],
        request: SearchRequest,
        *,
        progress: bool | Progress = False,
        on_truncate: OnTruncate | None = None,
    ) -> list[list[Hypothesis]]:
        """``decode_ids`` on the graphs, in one process: ONNX Runtime's threads decode a
        batch, where forking a process that holds its sessions is not safe."""
        check_supported(request.features(), self.name, self.supports, where=request.where())
        one = replace(request, batching=replace(request.batching, workers=1), device="cpu")
        return decode_ids(self.model, sources, one, progress=progress, on_truncate=on_truncate)
