"""Which pairs go where: the passes ``prepare_corpus`` makes over the raw corpora before any
vocabulary exists.

1. ``held_out_splits``: the valid and test pairs, from their own files (read whole: they are
   small) or carved out of the training corpora (``--valid-size``/``--test-size``: line
   numbers drawn with a seed, then one streamed pass collects them).
2. ``clean_train``: every training corpus streamed through the ``Cleaner`` (duplicates and
   overlap with 1. included) into two plain files in the dataset's temporary directory, which
   the vocabulary is trained on and binarised from; back-translated sources get their tag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..errors import UserError
from ..files import count_lines
from .clean import Cleaner, Cleaning, HeldOut
from .corpora import Corpus, Languages, Pair, iter_corpus

CLEAN_TEXT = (".train.clean.src", ".train.clean.tgt")  # in the temporary directory only


@dataclass(frozen=True)
class HeldOutSizes:
    """How many pairs to carve out of the training corpora for valid and test, drawn with
    ``seed`` (back-translated corpora are never drawn from)."""

    valid: int = 0
    test: int = 0
    seed: int = 1

    def __post_init__(self) -> None:
        for option, value in (("--valid-size", self.valid), ("--test-size", self.test)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{option} must be a number of pairs, 0 or more, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise UserError(f"--seed must be an integer, 0 or more, got {self.seed!r}")


@dataclass
class Plan:
    """What ``prepare_corpus`` was asked for, resolved: the corpora of each split, the
    filters, the languages and the sizes to carve."""

    corpora: dict[str, list[Corpus]]
    cleaning: Cleaning
    languages: Languages
    sizes: HeldOutSizes
    progress: bool = False
    language_fits: Callable[[str, str, str], bool] | None = None  # Cleaning.langid's test


def _kept(cleaner: Cleaner, pairs: Iterable[Pair]) -> Iterator[tuple[str, str]]:
    """The pairs ``cleaner`` keeps, each counted (a kept pair has both sides: it drops one
    with a side that is not UTF-8)."""
    for src, tgt in pairs:
        if cleaner.keep(src, tgt):
            assert src is not None and tgt is not None
            yield src, tgt


def _held_out_cleaning(cleaning: Cleaning) -> Cleaning:
    # valid and test keep what can be scored: a curated test set is not second-guessed
    return Cleaning(ratio=None, max_words=cleaning.max_words, copies=False, duplicates=False)


@dataclass
class HeldOutText:
    """The valid and test pairs (``pairs[split]``), each split's ``Cleaner`` with its counts,
    and the carved pairs' indices among the carvable training pairs (``carved[index]``: the
    split it went to), which ``clean_train`` skips."""

    pairs: dict[str, list[tuple[str, str]]]
    cleaners: dict[str, Cleaner]
    carved: dict[int, str]


def held_out_splits(plan: Plan) -> HeldOutText:
    """The valid and test pairs: from their own corpora (read whole: they are small), or
    carved out of the training corpora."""
    pairs: dict[str, list[tuple[str, str]]] = {}
    cleaners: dict[str, Cleaner] = {}
    keep = _held_out_cleaning(plan.cleaning)
    for split in ("valid", "test"):
        if split in plan.corpora:
            cleaner = cleaners[split] = Cleaner(keep, training=False)
            pairs[split] = [
                (c.source(src, training=False), tgt)
                for c in plan.corpora[split]
                for src, tgt in _kept(cleaner, iter_corpus(c, plan.languages))
            ]
    carved = _draw(plan)
    if carved:
        for split in sorted(set(carved.values())):
            pairs[split], cleaners[split] = [], Cleaner(keep, training=False)
        for index, corpus, pair in _carvable_pairs(plan):
            into = carved.get(index)
            if into is not None:
                kept = _kept(cleaners[into], [pair])
                pairs[into].extend((corpus.source(s, training=False), t) for s, t in kept)
    return HeldOutText(pairs, cleaners, carved)


def _carvable_pairs(plan: Plan) -> Iterator[tuple[int, Corpus, Pair]]:
    """(index among the carvable training pairs, its corpus, pair) for each pair of the
    training corpora that held-out pairs may be drawn from (not back-translated ones)."""
    index = 0
    for corpus in plan.corpora["train"]:
        if corpus.back_translated:
            continue
        for pair in iter_corpus(corpus, plan.languages):
            yield index, corpus, pair
            index += 1


def _draw(plan: Plan) -> dict[int, str]:
    sizes = plan.sizes
    wanted = sizes.valid + sizes.test
    if not wanted:
        return {}
    total = sum(_count(c, plan.languages) for c in plan.corpora["train"] if not c.back_translated)
    if wanted >= total:
        raise UserError(
            f"--valid-size {sizes.valid} + --test-size {sizes.test} leave nothing to train on: "
            f"the training corpora (not back-translated) have {total} pairs"
        )
    # Generator.choice draws a few from millions without a permutation of all of them
    drawn = np.random.default_rng(sizes.seed).choice(total, wanted, replace=False).tolist()
    return {i: "valid" if k < sizes.valid else "test" for k, i in enumerate(drawn)}


def _count(corpus: Corpus, langs: Languages) -> int:
    if corpus.kind == "tmx":
        return sum(1 for _ in iter_corpus(corpus, langs))
    return count_lines(corpus.files[0])


@dataclass
class TrainText:
    """The cleaned training text: its two files, how many pairs each corpus kept (in order),
    and the counts for ``meta.json``."""

    files: tuple[Path, Path]
    group_sizes: list[int]
    corpora: list[dict[str, Any]]
    cleaner: Cleaner


def clean_train(plan: Plan, out: Path, held: HeldOut, carved: dict[int, str]) -> TrainText:
    """Stream every training corpus through one ``Cleaner`` (duplicates are found across
    corpora) into ``out/CLEAN_TEXT``, skipping the ``carved`` pairs; a back-translated
    corpus's sources start with ``TAG_BT``, a tagged one's with its language's token."""
    cleaner = Cleaner(
        plan.cleaning,
        training=True,
        held_out=held if held.sizes else None,
        language_fits=plan.language_fits,
        langs=(plan.languages.src, plan.languages.tgt),
    )
    files = (out / CLEAN_TEXT[0], out / CLEAN_TEXT[1])
    corpora, sizes, index = [], [], 0
    bar = tqdm(desc="cleaning", unit=" pairs", disable=not plan.progress)
    with (
        open(files[0], "w", encoding="utf-8") as f_src,
        open(files[1], "w", encoding="utf-8") as f_tgt,
    ):
        for corpus in plan.corpora["train"]:
            before, n_carved = dict(cleaner.counts), 0
            for src, tgt in iter_corpus(corpus, plan.languages):
                bar.update()
                if not corpus.back_translated:
                    index += 1
                    if index - 1 in carved:
                        n_carved += 1
                        continue
                if cleaner.keep(src, tgt):
                    assert src is not None and tgt is not None  # an undecodable side is dropped
                    f_src.write(corpus.source(src, training=True) + "\n")
                    f_tgt.write(tgt + "\n")
            counts = {k: v - before[k] for k, v in cleaner.counts.items() if v - before[k]}
            sizes.append(counts.get("kept", 0))
            corpora.append(_corpus_record(corpus, counts, n_carved))
    bar.close()
    cleaner.forget_seen()  # the duplicate set is done with: not held through the vocabulary's peak
    return TrainText(files, sizes, corpora, cleaner)


def _corpus_record(corpus: Corpus, counts: dict[str, int], carved: int) -> dict[str, Any]:
    return {
        "name": corpus.name,
        "format": corpus.kind,
        "files": [str(f) for f in corpus.files],
        "weight": corpus.weight,
        "back_translated": corpus.back_translated,
        **({"tag": corpus.tag} if corpus.tag else {}),
        "carved_for_held_out": carved,
        "cleaning": counts,
    }
