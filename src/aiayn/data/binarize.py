"""Binarised, memory-mapped token datasets: encode the text once, then load in O(1).

A dataset directory holds, per split and side, a flat token array (``uint16`` when the
vocabulary fits, else ``int32``) and ``int64`` offsets (n + 1 entries), all ``.npy`` so that
``np.load(mmap_mode="r")`` maps them without reading. ``meta.json`` records the vocabulary
fingerprint, so that resuming with a different vocabulary fails instead of training on
garbage ids. Subword ids are stored WITHOUT bos/eos; ``collate`` adds them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from .readers import DataError
from .vocab import Vocab

SIDES = ("src", "tgt")
_CHUNK = 10_000  # sentences encoded per sentencepiece call (bounds memory, uses threads)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 2**16 else np.dtype(np.int32)


def _write_side(path: Path, arrays: list[np.ndarray], dtype: np.dtype) -> None:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)
    np.save(f"{path}.tokens.npy", tokens)
    np.save(f"{path}.offsets.npy", offsets)


def binarize_split(
    pairs: Iterable[tuple[str, str]], vocab: Vocab, out_dir: Path, split: str,
    max_tokens: int | None = None,
) -> dict[str, int]:
    """Encode ``pairs`` into ``out_dir/{split}.{src,tgt}.*.npy``; returns kept/skipped counts.

    Pairs with more than ``max_tokens`` subwords on either side are skipped (counted), because
    one outlier sets the padding of a whole batch.
    """
    kept: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    too_long = 0
    pairs = iter(pairs)
    while chunk := list(islice(pairs, _CHUNK)):
        srcs = vocab.encode_batch([s for s, _ in chunk])
        tgts = vocab.encode_batch([t for _, t in chunk])
        for s, t in zip(srcs, tgts):
            if max_tokens is not None and max(len(s), len(t)) > max_tokens:
                too_long += 1
                continue
            kept["src"].append(np.asarray(s))
            kept["tgt"].append(np.asarray(t))
    dtype = token_dtype(len(vocab))
    for side in SIDES:
        _write_side(out_dir / f"{split}.{side}", kept[side], dtype)
    return {"pairs": len(kept["src"]), "skipped_too_long_tokens": too_long,
            "src_tokens": int(sum(map(len, kept["src"]))),
            "tgt_tokens": int(sum(map(len, kept["tgt"])))}


def write_meta(out_dir: Path, vocab: Vocab, splits: dict[str, dict[str, Any]]) -> dict[str, Any]:
    meta = {"vocab_fingerprint": vocab.fingerprint, "vocab_size": len(vocab),
            "vocab_model": vocab.path.name, "dtype": token_dtype(len(vocab)).name,
            "splits": splits}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def read_meta(dataset_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(dataset_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{dataset_dir} is not a prepared dataset (no meta.json)")
    return json.loads(path.read_text())


def check_vocab(dataset_dir: str | os.PathLike, vocab: Vocab) -> None:
    """Raise ``DataError`` unless ``dataset_dir`` was binarised with ``vocab``."""
    meta = read_meta(dataset_dir)
    if meta["vocab_fingerprint"] != vocab.fingerprint:
        raise DataError(
            f"vocabulary mismatch: {dataset_dir} was binarised with a vocabulary of "
            f"{meta['vocab_size']} pieces (fingerprint {meta['vocab_fingerprint'][:12]}), "
            f"but {vocab.path} has {len(vocab)} pieces (fingerprint {vocab.fingerprint[:12]}); "
            "re-run prepare or pass the vocabulary the dataset was built with"
        )


class TokenDataset:
    """One split of a binarised dataset, memory-mapped: ``src(i)``/``tgt(i)`` are id arrays
    without specials; ``src_lens``/``tgt_lens`` are their lengths (for the sampler)."""

    def __init__(self, dataset_dir: str | os.PathLike, split: str) -> None:
        self.dir, self.split = Path(dataset_dir), split
        self.meta = read_meta(dataset_dir)
        if split not in self.meta["splits"]:
            raise DataError(f"{dataset_dir} has no split {split!r}; it has {sorted(self.meta['splits'])}")
        self._tokens, self._offsets = {}, {}
        for side in SIDES:
            base = self.dir / f"{split}.{side}"
            self._tokens[side] = np.load(f"{base}.tokens.npy", mmap_mode="r")
            self._offsets[side] = np.load(f"{base}.offsets.npy")
        self.src_lens = np.diff(self._offsets["src"])
        self.tgt_lens = np.diff(self._offsets["tgt"])

    def __len__(self) -> int:
        return len(self.src_lens)

    def _get(self, side: str, i: int) -> np.ndarray:
        off = self._offsets[side]
        return self._tokens[side][off[i]:off[i + 1]]

    def src(self, i: int) -> np.ndarray:
        return self._get("src", i)

    def tgt(self, i: int) -> np.ndarray:
        return self._get("tgt", i)


def subset_dataset(dataset_dir: str | os.PathLike, out_dir: str | os.PathLike, split: str,
                   keep: np.ndarray) -> dict[str, Any]:
    """A copy of a prepared dataset holding only pairs ``keep`` of ``split``, with the same
    vocabulary and the other splits unchanged (low-resource and length experiments).

    Built in a temporary directory and renamed; an existing ``out_dir`` is reused as is.
    """
    src, out = Path(dataset_dir), Path(out_dir)
    if (out / "meta.json").exists():
        return read_meta(out)
    meta = read_meta(src)
    data = TokenDataset(src, split)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for path in src.iterdir():  # vocabulary and the other splits
        if path.is_file() and path.name != "meta.json" and not path.name.startswith(f"{split}."):
            shutil.copyfile(path, tmp / path.name)
    kept = {side: [np.asarray(data._get(side, int(i))) for i in keep] for side in SIDES}
    for side in SIDES:
        _write_side(tmp / f"{split}.{side}", kept[side], np.dtype(meta["dtype"]))
    splits = {**meta["splits"], split: {"pairs": len(keep), "subset_of": len(data),
                                        "src_tokens": int(sum(map(len, kept["src"]))),
                                        "tgt_tokens": int(sum(map(len, kept["tgt"])))}}
    written = write_meta(tmp, Vocab.load(tmp / meta["vocab_model"]), splits)
    os.rename(tmp, out)
    return written
