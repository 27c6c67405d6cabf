"""One call from raw parallel files to a prepared dataset, and the bundled corpus's paths.

``prepare_corpus`` is the entry point for the CLI: it trains the shared vocabulary on the
training split only (so valid/test statistics cannot leak into it), or takes an existing one
(``vocab``: a checkpoint's, to fine-tune it on new text), binarises every split and writes
``meta.json`` with the counts of everything skipped.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import (
    check_not_input,
    fsync_dir,
    fsync_tree,
    publish_dir,
    temp_dir_beside,
    write_lines_atomic,
)
from .binarize import (
    META,
    VOCAB_FILES,
    binarize_split,
    dataset_files,
    is_dataset_file,
    read_meta,
    split_files,
    write_meta,
)
from .pieces import copy_vocabulary, load_vocabulary, resolve_vocabulary, vocabulary_files
from .readers import ReadStats, iter_lines, iter_parallel
from .vocab import Vocab

PathPair = tuple[str | os.PathLike, str | os.PathLike]
BIBLE_SPLITS = ("train", "valid", "test")
# what meta.json records of the bundled corpus's languages (validation BLEU's tokeniser reads it)
BIBLE_LANGS = {"src_lang": "en", "tgt_lang": "es"}


BUNDLED_VOCAB_SIZE = 8000  # shared BPE pieces of the bundled corpus (the demo's and experiments')


def prepare_bundled_slice(
    root: Path, pairs: dict[str, int], vocab_size: int, max_len: int | None = 256
) -> Path:
    """The first ``pairs[split]`` pairs of each split of the bundled corpus, written as text
    under ``root`` and prepared into ``root/data``: a small dataset for tests and benchmarks,
    its languages recorded as ``prepare_bundled`` records them."""
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n in pairs.items():
        for side, path in zip(("en", "es"), bundled_corpus_paths()[split]):
            write_lines_atomic(root / f"{split}.{side}", list(islice(iter_lines(path), n)))
        files[split] = (root / f"{split}.en", root / f"{split}.es")
    prepare_corpus(files, root / "data", vocab_size=vocab_size, max_len=max_len, record=BIBLE_LANGS)
    return root / "data"


def prepare_bundled(work: Path, vocab_size: int = BUNDLED_VOCAB_SIZE) -> dict[str, Any]:
    """Prepare the bundled corpus into ``work`` once; later calls reuse it (same vocabulary size)."""
    if (work / META).exists() and read_meta(work).get("vocab_size") == vocab_size:
        return read_meta(work)
    return prepare_corpus(bundled_corpus_paths(), work, vocab_size=vocab_size, record=BIBLE_LANGS)


def bundled_corpus_paths(src: str = "en", tgt: str = "es") -> dict[str, tuple[Path, Path]]:
    """{split: (source file, target file)} of the Bible corpus shipped in ``aiayn/corpus/bible/``.

    Package data, found through importlib.resources, so the same call works from a source
    checkout, an editable install and an installed wheel. pip installs wheels unpacked, so the
    resource is a real directory and plain paths (which sentencepiece and gzip need) are safe.
    """
    root = Path(str(resources.files("aiayn") / "corpus" / "bible"))
    if not (root / "train.en.gz").is_file():
        raise UserError(f"bundled corpus not found: no {root / 'train.en.gz'}; reinstall aiayn")
    return {s: (root / f"{s}.{src}.gz", root / f"{s}.{tgt}.gz") for s in BIBLE_SPLITS}


def prepare_corpus(
    splits: dict[str, PathPair],
    out_dir: str | os.PathLike,
    vocab_size: int = 8000,
    max_len: int | None = 256,
    max_words: int | None = None,
    num_threads: int = 2,
    user_defined_symbols: Sequence[str] = (),
    record: dict[str, Any] | None = None,
    vocab: str | os.PathLike | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """Train the vocabulary on ``splits["train"]`` (or copy the vocabulary ``vocab``: a
    SentencePiece model, or a checkpoint directory and its one or two models (``pieces``),
    ignoring ``vocab_size``) and binarise every split into ``out_dir``.

    ``max_len`` bounds subwords per side (longer pairs skipped); ``max_words`` optionally
    bounds whitespace words while reading. ``user_defined_symbols`` become atomic
    vocabulary pieces (see ``Vocab.train``). ``record`` goes into ``meta.json`` as it is
    (``write_meta``), and from there into every checkpoint trained on the dataset. ``workers``
    processes binarise (``binarize_split``: the same files as one). Returns the ``meta.json``
    contents plus timings.

    The dataset is built in a temporary directory beside ``out_dir`` and renamed into place at
    the end (see ``check_target`` for what may already be there), so a failed or interrupted
    prepare leaves a previous dataset untouched: never a new vocabulary beside old ids.
    """
    inputs = _checked_inputs(splits, max_len, max_words, workers, vocab)
    out = Path(out_dir).resolve()
    for output in [out, *(out / name for name in dataset_files(splits, VOCAB_FILES))]:
        check_not_input(output, inputs)
    check_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(out)
    try:
        meta = _build(
            splits,
            tmp,
            vocab_size,
            max_len,
            max_words,
            num_threads,
            user_defined_symbols,
            record=record,
            vocab=resolve_vocabulary(vocab) if vocab is not None else None,
            workers=workers,
        )
    except BaseException:  # KeyboardInterrupt too: never leave a half-built directory behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_dataset(tmp, out)
    return meta


def _checked_inputs(
    splits: dict[str, PathPair],
    max_len: int | None,
    max_words: int | None,
    workers: int,
    vocab: str | os.PathLike | None,
) -> list[Path]:
    """``prepare_corpus``'s input files, each checked (with the limits) before any work."""
    if "train" not in splits:
        raise UserError(f"prepare_corpus needs a 'train' split, got {sorted(splits)}")
    for name, value in (("max_len", max_len), ("max_words", max_words)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be a positive number (or None for no limit), got {value}")
    if workers < 1:  # before the vocabulary's minutes of training
        raise UserError(f"workers must be a positive number of processes, got {workers}")
    inputs = [Path(p) for pair in splits.values() for p in pair]
    if vocab is not None:
        load_vocabulary(vocab)  # a UserError now if it is not one, before any work
        inputs.extend(vocabulary_files(resolve_vocabulary(vocab)))
    for path in inputs:
        if not path.exists():
            raise UserError(f"{path}: no such file")
        if path.is_dir():
            raise UserError(f"{path}: is a directory; expected a text file of sentences")
    return inputs


def check_target(out: Path) -> None:
    """Raise ``UserError`` unless ``prepare`` may write a dataset to ``out``: a new or empty
    directory, a dataset that ``prepare`` wrote before (its ``meta.json`` says so), or a
    directory without dataset files. Entries that are not dataset files (``aiayn parse
    prepare`` keeps its text and gold trees there) are never touched; dataset files that no
    ``meta.json`` vouches for may be someone else's, so they are not overwritten.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"output directory {out}: is a file")
    if (out / META).exists():
        read_meta(out)  # a UserError naming meta.json unless prepare wrote it
        return
    ours = sorted(e.name for e in out.iterdir() if is_dataset_file(e.name))
    if ours:
        shown = ", ".join(ours[:3]) + (", ..." if len(ours) > 3 else "")
        raise UserError(
            f"output directory {out}: holds {shown} but no {META}, so not a dataset "
            "prepare wrote; choose another directory or remove them"
        )


def _build(
    splits: dict[str, PathPair],
    out: Path,
    vocab_size: int,
    max_len: int | None,
    max_words: int | None,
    num_threads: int,
    user_defined_symbols: Sequence[str],
    *,
    record: dict[str, Any] | None,
    vocab: Path | None,
    workers: int,
) -> dict[str, Any]:
    start = time.perf_counter()
    train_src, train_tgt = (Path(p) for p in splits["train"])
    if vocab is not None:
        vocab = load_vocabulary(copy_vocabulary(vocab, out))
        vocab.write_listing(out / "spm.vocab")  # what training one writes beside it
    else:
        vocab = Vocab.train(
            _nonempty(train_src, train_tgt),
            out / "spm",
            vocab_size,
            num_threads=num_threads,
            user_defined_symbols=user_defined_symbols,
        )
    vocab_s = time.perf_counter() - start
    summary: dict[str, dict[str, int]] = {}
    for split, (src_path, tgt_path) in splits.items():
        stats = ReadStats()
        pairs = iter_parallel(src_path, tgt_path, max_words, stats)
        counts = binarize_split(pairs, vocab, out, split, max_len, workers=workers)
        if counts["pairs"] == 0:
            raise UserError(
                f"{split} split ({src_path}, {tgt_path}): 0 of {stats.read} pairs kept: "
                f"{stats.empty} with an empty side, {stats.too_long} over max_words={max_words}, "
                f"{counts['skipped_too_long_tokens']} over max_len={max_len} subwords"
            )
        summary[split] = {
            **counts,
            "read": stats.read,
            "skipped_empty": stats.empty,
            "skipped_too_long_words": stats.too_long,
        }
    meta = write_meta(out, vocab, summary, record)
    return {**meta, "seconds": {"vocab": vocab_s, "total": time.perf_counter() - start}}


def _replace_dataset(new: Path, out: Path) -> None:
    """Move the finished dataset ``new`` to ``out``.

    A directory of dataset files only is swapped whole (``publish_dir``). Beside other
    entries the files move one by one instead, so that the directory holding them is never
    renamed: the old ``meta.json`` goes first (the old dataset stops loading), the new one
    last (the new dataset starts loading).
    """
    fsync_tree(new)  # data, then the names: after a power cut the dataset is whole or absent
    if not out.exists():
        os.rename(new, out)
    elif all(is_dataset_file(e.name) for e in out.iterdir()):
        publish_dir(new, out)
    else:
        previous = read_meta(out)["splits"] if (out / META).exists() else {}
        (out / META).unlink(missing_ok=True)
        for split in previous.keys() - read_meta(new)["splits"].keys():
            for name in split_files(split):
                (out / name).unlink(missing_ok=True)
        for file in new.iterdir():
            if file.name != META:
                os.replace(file, out / file.name)
        os.replace(new / META, out / META)
        new.rmdir()
        fsync_dir(out)
    fsync_dir(out.parent)


def _nonempty(*paths: Path) -> Iterator[str]:
    # Both languages feed one shared vocabulary (paper section 5.1).
    for path in paths:
        n = 0
        for line in iter_lines(path):
            if line.strip():
                n += 1
                yield line
        if n == 0:
            raise UserError(f"{path}: empty training file (no line with text)")
