"""Binarised, memory-mapped token datasets: encode the text once, then load in O(1).

A dataset directory holds, per split and side, a flat token array (``uint16`` when the
vocabulary fits, else ``int32``) and ``int64`` offsets (n + 1 entries), all ``.npy`` so that
``np.load(mmap_mode="r")`` maps them without reading. ``meta.json`` records the vocabulary
fingerprint, so that training or evaluating with a different vocabulary fails instead of
reading garbage ids. Subword ids are stored WITHOUT bos/eos; ``collate`` adds them.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain, compress, islice
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from ..errors import UserError
from ..files import temp_dir_beside
from .pieces import PAIR_FILES, AnyVocab, load_vocabulary

SIDES = ("src", "tgt")
META, VOCAB_MODEL = "meta.json", "spm.model"
ONE_MODEL = (VOCAB_MODEL, "spm.vocab")
VOCAB_FILES = (*ONE_MODEL, *PAIR_FILES)  # one model, or two (``pieces``)
_ARRAY_FILE = re.compile(r".+\.(src|tgt)\.(tokens\.npy|offsets\.npy|txt)")
_CHUNK = 10_000  # pairs encoded per sentencepiece call (bounds memory, uses threads)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 2**16 else np.dtype(np.int32)


class _ArrayWriter:
    """Appends 1-D chunks to an ``.npy`` file whose length is known only at the end.

    The header is written first for shape (0,) and rewritten in place by ``close``: numpy
    pads every header with room for a 21-digit length, so both headers have the same size
    and the file is byte for byte what ``np.save`` writes for the whole array.
    """

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.n = path, np.dtype(dtype), 0
        self.file = open(path, "wb")
        self._write_header()
        self.data_start = self.file.tell()

    def _write_header(self) -> None:
        np.lib.format.write_array_header_1_0(
            self.file,
            {
                "descr": np.lib.format.dtype_to_descr(self.dtype),
                "fortran_order": False,
                "shape": (self.n,),
            },
        )

    def append(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.n += len(values)

    def close(self) -> None:
        self.file.seek(0)
        self._write_header()
        if self.file.tell() != self.data_start:  # numpy reserves the digits; checked anyway
            raise RuntimeError(f"{self.path}: .npy header changed size while streaming")
        self.file.close()


class _SideWriter:
    """``{path}.tokens.npy`` (ids of all sentences, concatenated) and ``{path}.offsets.npy``
    (n + 1 int64 starts), streamed a chunk of sentences at a time."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.tokens = _ArrayWriter(Path(f"{path}.tokens.npy"), dtype)
        self.offsets = _ArrayWriter(Path(f"{path}.offsets.npy"), np.dtype(np.int64))
        self.offsets.append(np.zeros(1, np.int64))

    def append(self, lengths: np.ndarray, tokens: np.ndarray) -> None:
        """Sentences of ``lengths`` (n,) whose ids are ``tokens`` (sum of lengths,), in order."""
        self.offsets.append(self.tokens.n + np.cumsum(lengths))  # (n,) offsets after each
        self.tokens.append(tokens)

    def close(self) -> None:
        self.tokens.close()
        self.offsets.close()


def flatten(sentences: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(lengths (n,) int64, ids of all ``sentences`` concatenated (sum of lengths,) ``dtype``)."""
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
    tokens = np.fromiter(chain.from_iterable(sentences), dtype=dtype, count=int(lengths.sum()))
    return lengths, tokens


class _Encoded(NamedTuple):
    """One chunk's kept pairs as flat arrays: ``sides[side] = flatten(...)``; numpy arrays
    pickle as bytes, so a worker hands them back far cheaper than lists of ints."""

    sides: dict[str, tuple[np.ndarray, np.ndarray]]
    keep: np.ndarray  # (chunk,) bool: which input pairs were kept


def _encode_chunk(
    vocab: AnyVocab, chunk: list[tuple[str, str]], max_tokens: int | None, threads: int
) -> _Encoded:
    srcs = vocab.encode_batch([s for s, _ in chunk], num_threads=threads, side="source")
    tgts = vocab.encode_batch([t for _, t in chunk], num_threads=threads, side="target")
    keep = [max_tokens is None or max(len(s), len(t)) <= max_tokens for s, t in zip(srcs, tgts)]
    dtype = token_dtype(len(vocab))
    sides = {
        side: flatten(list(compress(ids, keep)), dtype) for side, ids in zip(SIDES, (srcs, tgts))
    }
    return _Encoded(sides, np.array(keep, dtype=bool))


_worker_vocab: AnyVocab | None = None  # a binarising worker's own copy, loaded once per process


def _load_worker_vocab(path: Path) -> None:
    global _worker_vocab
    # Ctrl-C reaches the whole process group: the parent stops the pool and says so, once
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_vocab = load_vocabulary(path)


def _encode_in_worker(chunk: list[tuple[str, str]], max_tokens: int | None) -> _Encoded:
    # one thread each: the workers are the parallelism, and more threads would only contend
    assert _worker_vocab is not None  # set by the pool's initializer
    return _encode_chunk(_worker_vocab, chunk, max_tokens, threads=1)


def _encoded_chunks(
    pairs: Iterator[tuple[str, str]],
    vocab: AnyVocab,
    max_tokens: int | None,
    chunk_pairs: int,
    workers: int,
) -> Iterator[_Encoded]:
    """Every ``chunk_pairs`` pairs encoded, in input order. With ``workers`` > 1 the chunks
    are encoded in that many processes while this one reads and writes; at most two chunks per
    worker are in flight, so memory stays bounded by the chunk size, not by the corpus."""
    chunks = iter(lambda: list(islice(pairs, chunk_pairs)), [])
    head = list(islice(chunks, 2))
    chunks = chain(head, chunks)
    if workers == 1 or len(head) < 2:  # a split of one chunk (valid, test) starts no processes
        for chunk in chunks:
            yield _encode_chunk(vocab, chunk, max_tokens, threads=2)
        return
    # spawn: a fresh interpreter per worker, safe whatever threads this process has started
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, _load_worker_vocab, (vocab.path,)) as pool:
        pending: deque[multiprocessing.pool.AsyncResult] = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (chunk, max_tokens)))
            if len(pending) == 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def binarize_split(
    pairs: Iterable[tuple[str, str]],
    vocab: AnyVocab,
    out_dir: Path,
    split: str,
    max_tokens: int | None = None,
    chunk_pairs: int = _CHUNK,
    workers: int = 1,
    group_sizes: list[int] | None = None,
) -> dict[str, Any]:
    """Encode ``pairs`` into ``out_dir/{split}.{src,tgt}.*.npy``; returns kept/skipped counts.

    Pairs with more than ``max_tokens`` subwords on either side are skipped (counted), because
    one outlier sets the padding of a whole batch. Ids go to disk ``chunk_pairs`` pairs at a
    time, so memory is bounded by the chunk, not the corpus (WMT14 English-French: 36M pairs).
    ``workers`` processes encode the chunks (sentencepiece, and flattening the ids) while this
    one reads the text and writes the chunks in their order: the files are byte for byte one
    worker's. The workers are spawned, so a script that calls this with ``workers`` > 1 needs
    multiprocessing's ``if __name__ == "__main__":`` guard (``aiayn`` has it).
    ``group_sizes``: the input is consecutive groups of that many pairs (named corpora); the
    result's ``group_pairs`` says how many of each were kept.
    """
    dtype = token_dtype(len(vocab))
    writers = {side: _SideWriter(out_dir / f"{split}.{side}", dtype) for side in SIDES}
    too_long, longest = 0, 0
    kept = np.zeros(len(group_sizes or []), np.int64)
    ends, start = np.cumsum(group_sizes or [], dtype=np.int64), 0  # ends: (groups,)
    try:
        for encoded in _encoded_chunks(iter(pairs), vocab, max_tokens, chunk_pairs, workers):
            too_long += int((~encoded.keep).sum())
            if group_sizes is not None:
                positions = start + np.flatnonzero(encoded.keep)  # kept pairs' input indices
                np.add.at(kept, np.searchsorted(ends, positions, side="right"), 1)
            start += len(encoded.keep)
            for side, (lengths, tokens) in encoded.sides.items():
                writers[side].append(lengths, tokens)
                if side == "src" and len(lengths):
                    longest = max(longest, int(lengths.max()))
    finally:
        for writer in writers.values():
            writer.close()
    return {
        "pairs": writers["src"].offsets.n - 1,
        "skipped_too_long_tokens": too_long,
        "longest_src_tokens": longest,  # what a model trained on it has seen (--split's limit)
        "src_tokens": writers["src"].tokens.n,
        "tgt_tokens": writers["tgt"].tokens.n,
        **({"group_pairs": kept.tolist()} if group_sizes is not None else {}),
    }


def write_meta(
    out_dir: Path,
    vocab: AnyVocab,
    splits: dict[str, dict[str, Any]],
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``meta.json``; ``record`` is what the preparer states about its text (``aiayn
    parse prepare``: the leaf form of its targets), kept as ``meta["record"]``."""
    meta = {
        "vocab_fingerprint": vocab.fingerprint,
        "vocab_size": len(vocab),
        "vocab_model": vocab.path.name,
        "dtype": token_dtype(len(vocab)).name,
        "splits": splits,
        **({"record": record} if record is not None else {}),
    }
    (out_dir / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def split_files(split: str) -> list[str]:
    """The names of the arrays of ``split`` in a dataset directory, and of a held-out split's
    text (``held_out_text``: what ``aiayn evaluate`` reads)."""
    arrays = [f"{split}.{side}.{kind}.npy" for side in SIDES for kind in ("tokens", "offsets")]
    return arrays + ([] if split == "train" else held_out_text(split))


def held_out_text(split: str) -> list[str]:
    """The text files of held-out ``split`` (source, target) as prepare kept it."""
    return [f"{split}.{side}.txt" for side in SIDES]


def dataset_files(splits: Iterable[str], vocab_files: Iterable[str] = ONE_MODEL) -> list[str]:
    """The names of the files ``prepare`` writes into a dataset directory of ``splits``, its
    vocabulary's ``vocab_files`` (``ONE_MODEL``, or ``VOCAB_FILES`` for either kind)."""
    return [META, *vocab_files, *chain.from_iterable(map(split_files, splits))]


def is_dataset_file(name: str) -> bool:
    """Whether ``name`` is one of the files ``prepare`` writes into a dataset directory."""
    return name in (META, *VOCAB_FILES) or _ARRAY_FILE.fullmatch(name) is not None


def read_meta(dataset_dir: str | os.PathLike) -> dict[str, Any]:
    """The dataset's ``meta.json``; ``UserError`` naming the file if it is missing or is not
    one that ``prepare`` wrote."""
    path = Path(dataset_dir) / META
    if not path.is_file():
        raise UserError(f"{dataset_dir} is not a prepared dataset (no {META})")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a dataset's {META}: {e}") from None
    missing = [
        k
        for k in ("vocab_fingerprint", "vocab_size", "splits")
        if not isinstance(meta, dict) or k not in meta
    ]
    if missing:
        raise UserError(f"{path}: not a dataset's {META}: no {', '.join(missing)}")
    return meta


def check_vocab(dataset_dir: str | os.PathLike, vocab: AnyVocab) -> None:
    """Raise ``UserError`` unless ``dataset_dir`` was binarised with ``vocab``."""
    meta = read_meta(dataset_dir)
    if meta["vocab_fingerprint"] != vocab.fingerprint:
        raise UserError(
            f"vocabulary mismatch: {Path(dataset_dir) / META} records a vocabulary of "
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
            raise UserError(
                f"{dataset_dir} has no split {split!r}; it has {sorted(self.meta['splits'])}"
            )
        self._tokens, self._offsets = {}, {}
        for side in SIDES:
            base = self.dir / f"{split}.{side}"
            self._tokens[side] = _load_array(Path(f"{base}.tokens.npy"), mmap_mode="r")
            self._offsets[side] = offsets = _load_array(Path(f"{base}.offsets.npy"))
            if offsets.ndim != 1 or not len(offsets) or offsets[-1] != len(self._tokens[side]):
                raise UserError(
                    f"{base}.offsets.npy does not fit {base.name}.tokens.npy: the dataset is "
                    f"damaged; rebuild it with aiayn prepare"
                )
        self.src_lens = np.diff(self._offsets["src"])
        self.tgt_lens = np.diff(self._offsets["tgt"])

    def __len__(self) -> int:
        return len(self.src_lens)

    def _get(self, side: str, i: int) -> np.ndarray:
        off = self._offsets[side]
        return self._tokens[side][off[i] : off[i + 1]]

    def src(self, i: int) -> np.ndarray:
        return self._get("src", i)

    def tgt(self, i: int) -> np.ndarray:
        return self._get("tgt", i)


def _load_array(path: Path, mmap_mode: Literal["r"] | None = None) -> np.ndarray:
    """``np.load``, a damaged (truncated) file named as such."""
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (ValueError, EOFError) as e:  # numpy's header and size checks
        raise UserError(
            f"{path}: not a readable .npy file ({e}): the dataset is damaged (truncated?); "
            "rebuild it with aiayn prepare"
        ) from None


def subset_dataset(
    dataset_dir: str | os.PathLike, out_dir: str | os.PathLike, split: str, keep: np.ndarray
) -> dict[str, Any]:
    """A copy of a prepared dataset holding only pairs ``keep`` of ``split``, with the same
    vocabulary and the other splits unchanged (low-resource and length experiments).

    Built in a temporary directory and renamed; an existing ``out_dir`` is reused as is.
    """
    src, out = Path(dataset_dir), Path(out_dir)
    if (out / "meta.json").exists():
        return read_meta(out)
    meta = read_meta(src)
    data = TokenDataset(src, split)
    if out.exists():
        raise UserError(
            f"{out} exists and is not a prepared dataset (no meta.json); not replacing it"
        )
    tmp = temp_dir_beside(out)  # new and ours, removed on failure
    try:
        for path in src.iterdir():  # vocabulary and the other splits
            if (
                path.is_file()
                and path.name != "meta.json"
                and not path.name.startswith(f"{split}.")
            ):
                shutil.copyfile(path, tmp / path.name)
        tokens = {}
        for side in SIDES:
            writer = _SideWriter(tmp / f"{split}.{side}", np.dtype(meta["dtype"]))
            try:
                for start in range(0, len(keep), _CHUNK):
                    chosen = [
                        data._get(side, int(i)).tolist() for i in keep[start : start + _CHUNK]
                    ]
                    writer.append(*flatten(chosen, writer.tokens.dtype))
            finally:
                writer.close()
            tokens[side] = writer.tokens.n
        splits = {
            **meta["splits"],
            split: {
                "pairs": len(keep),
                "subset_of": len(data),
                "src_tokens": tokens["src"],
                "tgt_tokens": tokens["tgt"],
            },
        }
        vocab = load_vocabulary(tmp / meta["vocab_model"])
        written = write_meta(tmp, vocab, splits, meta.get("record"))
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written
