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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Any

from tqdm import tqdm

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
    held_out_text,
    is_dataset_file,
    read_meta,
    split_files,
    write_meta,
)
from .clean import Cleaning, HeldOut, language_identifier
from .corpora import TAG_BT, Corpus, Languages, language_token, resolve_languages, text_lines
from .moses_bpe import KIND, MosesBpeVocab
from .pieces import (
    AnyVocab,
    copy_vocabulary,
    load_vocabulary,
    resolve_vocabulary,
    vocabulary_files,
)
from .readers import iter_lines
from .select import HeldOutSizes, Plan, clean_train, held_out_splits
from .vocab import Vocab

PathPair = tuple[str | os.PathLike, str | os.PathLike]
SplitInput = PathPair | Corpus | list[Corpus]
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
    splits: Mapping[str, SplitInput],
    out_dir: str | os.PathLike,
    vocab_size: int = 8000,
    max_len: int | None = 256,
    max_words: int | None = None,
    num_threads: int = 2,
    user_defined_symbols: Sequence[str] = (),
    record: dict[str, Any] | None = None,
    vocab: str | os.PathLike | None = None,
    workers: int = 1,
    *,
    cleaning: Cleaning | None = None,
    languages: Languages | None = None,
    held_out: HeldOutSizes | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Clean ``splits["train"]``, train the vocabulary on what is kept (or copy the
    vocabulary ``vocab``: a SentencePiece model, or a checkpoint directory and its one or two
    models (``pieces``), ignoring ``vocab_size``) and binarise every split into ``out_dir``.

    A split is a pair of line-aligned files, a ``Corpus`` or a list of them (named, weighted).
    ``cleaning``: the filters (``clean.Cleaning``; default: only empty and invalid pairs go);
    valid and test lose only empty, invalid and over-long pairs. ``held_out`` carves valid/test
    out of train. ``languages`` (else the files' suffixes) and ``record`` go into ``meta.json``.
    ``max_len`` bounds subwords per side, ``max_words`` whitespace words (longer pairs
    skipped). ``user_defined_symbols``: atomic pieces (``Vocab.train``). ``workers`` processes
    binarise (the same files as one). Returns the ``meta.json`` contents plus timings.

    The dataset is built in a temporary directory beside ``out_dir`` and renamed into place
    (``check_target``: what may be there), so a failed or interrupted prepare leaves a previous
    dataset untouched: never a new vocabulary beside old ids.
    """
    corpora, sizes = {s: _as_corpora(s, v) for s, v in splits.items()}, held_out or HeldOutSizes()
    names = _split_names(corpora, sizes)
    inputs = _checked_inputs(corpora, max_len, max_words, workers, vocab)
    out = Path(out_dir).resolve()
    for output in [out, *(out / name for name in dataset_files(names, VOCAB_FILES))]:
        check_not_input(output, inputs)
    check_target(out)
    plan = _plan(corpora, cleaning, max_words, languages, sizes, progress)  # its errors first
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(out)
    try:
        meta = _build(
            plan,
            tmp,
            vocab_size,
            max_len,
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


def _plan(
    corpora: dict[str, list[Corpus]],
    cleaning: Cleaning | None,
    max_words: int | None,
    languages: Languages | None,
    sizes: HeldOutSizes,
    progress: bool,
) -> Plan:
    """What ``prepare_corpus`` will do, resolved: the filters (none asked for: only empty and
    invalid pairs go), the languages (given, else the files' suffixes) and langid's test."""
    base = cleaning or Cleaning.off()
    plan = Plan(
        corpora=corpora,
        cleaning=replace(base, max_words=max_words) if max_words is not None else base,
        languages=resolve_languages(languages or Languages(), _all(corpora)),
        sizes=sizes,
        progress=progress,
    )
    if plan.cleaning.langid:
        plan.language_fits = language_identifier((plan.languages.src, plan.languages.tgt))
    return plan


def _as_corpora(split: str, value: SplitInput) -> list[Corpus]:
    if isinstance(value, Corpus):
        return [value]
    if isinstance(value, list) and value and all(isinstance(c, Corpus) for c in value):
        return value
    assert not isinstance(value, list)  # a list is of Corpus (checked above)
    src, tgt = value
    return [Corpus(split, "pair", (Path(src), Path(tgt)))]


def _all(corpora: dict[str, list[Corpus]]) -> list[Corpus]:
    return [c for group in corpora.values() for c in group]


def _split_names(corpora: dict[str, list[Corpus]], sizes: HeldOutSizes) -> list[str]:
    names = list(corpora)
    for split, n in (("valid", sizes.valid), ("test", sizes.test)):
        if n and split in corpora:
            raise UserError(
                f"--{split}-size carves a {split} split out of train: give it or {split} files"
            )
        if n:
            names.append(split)
    return names


def _checked_inputs(
    corpora: dict[str, list[Corpus]],
    max_len: int | None,
    max_words: int | None,
    workers: int,
    vocab: str | os.PathLike | None,
) -> list[Path]:
    """``prepare_corpus``'s input files, each checked (with the limits) before any work."""
    if "train" not in corpora:
        raise UserError(f"prepare_corpus needs a 'train' split, got {sorted(corpora)}")
    for name, value in (("max_len", max_len), ("max_words", max_words)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be a positive number (or None for no limit), got {value}")
    for split, group in corpora.items():  # meta.json counts and weighs each corpus by name
        names = [c.name for c in group]
        if twice := next((n for n in names if names.count(n) > 1), None):
            raise UserError(f"two {split} corpora are named {twice!r}: give each its own name=")
    if workers < 1:  # before the vocabulary's minutes of training
        raise UserError(f"workers must be a positive number of processes, got {workers}")
    inputs = [path for corpus in _all(corpora) for path in corpus.files]
    if vocab is not None:
        if isinstance(load_vocabulary(vocab), MosesBpeVocab):  # not one, a UserError now
            raise UserError(
                f"{vocab}: its text is split by {KIND} (an imported fairseq model's), which "
                "aiayn does not train with: prepare data with a SentencePiece vocabulary"
            )
        inputs.extend(vocabulary_files(resolve_vocabulary(vocab)))
    for path in inputs:
        if not path.exists():
            raise UserError(f"{path}: no such file")
        if path.is_dir():
            raise UserError(f"{path}: is a directory; expected a text file of sentences")
    for corpus in corpora["train"]:
        for path in corpus.files if corpus.kind != "tmx" else ():
            if not any(line and line.strip() for line in text_lines(path)):
                raise UserError(f"{path}: empty training file (no line with text)")
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
    plan: Plan,
    out: Path,
    vocab_size: int,
    max_len: int | None,
    num_threads: int,
    user_defined_symbols: Sequence[str],
    *,
    record: dict[str, Any] | None,
    vocab: Path | None,
    workers: int,
) -> dict[str, Any]:
    start = time.perf_counter()
    held_out = held_out_splits(plan)
    held = HeldOut()
    for split, pairs in held_out.pairs.items():
        held.add(split, pairs)
    text = clean_train(plan, out, held, held_out.carved)
    if not sum(text.group_sizes):  # before the vocabulary trainer complains of an empty file
        nothing = {"pairs": 0, "skipped_too_long_tokens": 0, "max_len": max_len}
        _check_kept("train", _files(plan.corpora["train"]), nothing, text.cleaner.counts, plan)
    clean_s = time.perf_counter() - start
    tagged = any(c.back_translated for c in plan.corpora["train"])
    languages = target_tags(plan)
    symbols = [*user_defined_symbols, *([TAG_BT] if tagged else [])]
    symbols += [language_token(code) for code in languages]
    vocabulary = _vocabulary(out, vocab, text.files, vocab_size, num_threads, symbols)
    vocab_s = time.perf_counter() - start - clean_s
    summary = {"train": _binarise_train(plan, text, vocabulary, out, max_len, workers)}
    if held.sizes:
        summary["train"]["overlap"] = {**text.cleaner.overlap, "held_out": held.report()}
    for split, pairs in held_out.pairs.items():
        counts = binarize_split(pairs, vocabulary, out, split, max_len, workers=workers)
        where = _files(plan.corpora.get(split, [])) or "carved from train"
        read = held_out.cleaners[split].counts
        _check_kept(split, where, {**counts, "max_len": max_len}, read, plan)
        summary[split] = {**counts, **_read_counts(read)}
        for side, name in enumerate(held_out_text(split)):  # evaluate's --src and --ref
            write_lines_atomic(out / name, [pair[side] for pair in pairs])
    for path in text.files:
        path.unlink()
    tags = {"target_langs": list(languages)} if languages else {}
    record = {**plan.languages.record(), **tags, **(record or {})}
    meta = write_meta(out, vocabulary, summary, record or None)
    seconds = {"clean": clean_s, "vocab": vocab_s, "total": time.perf_counter() - start}
    return {**meta, "seconds": seconds}


def target_tags(plan: Plan) -> tuple[str, ...]:
    """The target languages the corpora are tagged with (``tag``), in order of first use;
    a held-out corpus's tag must be one a training corpus teaches."""
    taught = tuple(dict.fromkeys(c.tag for c in plan.corpora["train"] if c.tag))
    for split in ("valid", "test"):
        for corpus in plan.corpora.get(split, []):
            if corpus.tag is not None and corpus.tag not in taught:
                raise UserError(
                    f"{split} corpus {corpus.name}: tag {corpus.tag} is no training corpus's "
                    f"({', '.join(taught) or 'none is tagged'}): the model would never learn it"
                )
    return taught


def _vocabulary(
    out: Path,
    given: Path | None,
    text: tuple[Path, Path],
    vocab_size: int,
    num_threads: int,
    symbols: list[str],
) -> AnyVocab:
    """The given vocabulary (a SentencePiece model, or a checkpoint's one or two) copied into
    ``out``, or one trained on ``text``."""
    if given is None:
        return Vocab.train(
            _nonempty(*text),
            out / "spm",
            vocab_size,
            num_threads=num_threads,
            user_defined_symbols=symbols,
        )
    vocab = load_vocabulary(copy_vocabulary(given, out))
    vocab.write_listing(out / "spm.vocab")  # what training one writes beside it
    missing = [s for s in symbols if vocab.piece_to_id(s) == vocab.unk_id]
    if missing:
        raise UserError(
            f"{given}: has no piece {missing[0]}, which this data needs; train a vocabulary"
        )
    return vocab


def _binarise_train(
    plan: Plan, text: Any, vocab: AnyVocab, out: Path, max_len: int | None, workers: int
) -> dict[str, Any]:
    kept = sum(text.group_sizes)
    pairs = tqdm(
        zip(iter_lines(text.files[0]), iter_lines(text.files[1])),
        desc="binarising",
        unit=" pairs",
        total=kept,
        disable=not plan.progress,
    )
    counts = binarize_split(
        pairs, vocab, out, "train", max_len, workers=workers, group_sizes=text.group_sizes
    )
    for corpus, n in zip(text.corpora, counts.pop("group_pairs")):
        corpus["pairs"] = n
    where = _files(plan.corpora["train"])
    _check_kept("train", where, {**counts, "max_len": max_len}, text.cleaner.counts, plan)
    return {
        **counts,
        **_read_counts(text.cleaner.counts),
        "cleaning": {k: v for k, v in text.cleaner.counts.items() if k not in ("read", "kept")},
        "corpora": text.corpora,
    }


def _files(corpora: list[Corpus]) -> str:
    return ", ".join(str(path) for corpus in corpora for path in corpus.files)


def _read_counts(counts: dict[str, int]) -> dict[str, int]:
    """The counts every split has recorded from the start."""
    return {
        "read": counts["read"],
        "skipped_empty": counts["empty"],
        "skipped_too_long_words": counts["too_long_words"],
        "skipped_invalid_utf8": counts["invalid_utf8"],
    }


def _check_kept(
    split: str, where: str, counts: dict[str, Any], read: dict[str, int], plan: Plan
) -> None:
    """A ``UserError`` if ``split`` (from ``where``) kept no pair, saying what dropped them."""
    if counts["pairs"]:
        return
    others = ", ".join(
        f"{n} {k}"
        for k, n in read.items()
        if n and k not in ("read", "kept", "empty", "too_long_words")
    )
    raise UserError(
        f"{split} split ({where}): 0 of {read['read']} pairs kept: {read['empty']} with an empty "
        f"side, {read['too_long_words']} over max_words={plan.cleaning.max_words}, "
        f"{counts['skipped_too_long_tokens']} over max_len={counts['max_len']} subwords"
        + (f", {others}" if others else "")
    )


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
