"""``aiayn prepare`` and ``aiayn train`` from Python: ``prepare`` and ``train_model`` return what
the commands print (the dataset's summary, the run's summary and cost) and where they wrote,
with the commands' checks and one-line errors (``UserError``), because the commands call them.

    import aiayn
    data = aiayn.prepare("work/mine", train=("corpus/train.en", "corpus/train.es"), vocab_size=300)
    run = aiayn.train_model({"data": str(data.out), "out": "runs/mine", "preset": "tiny"})
    print(run.out, run.summary["updates"])

``train_model`` is not ``aiayn.train``: that name is the training package.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UserError

DEFAULT_VOCAB_SIZE = 8000
Pair = tuple[str | os.PathLike, str | os.PathLike]


@dataclass(frozen=True)
class Written:
    """Where a command wrote (absolute) and the summary it prints as JSON."""

    out: Path
    summary: dict[str, Any]

    def json(self) -> str:
        """The summary as the command prints it."""
        return json.dumps(self.summary, indent=2)


@dataclass(frozen=True)
class Trained(Written):
    """A training run: its directory, its summary and cost (``aiayn train``'s JSON), the
    signal that stopped it early ("SIGTERM", "SIGINT"; None: it ran to its end), and whether
    this is the main process (the one that prints, of several under torchrun)."""

    stopped: str | None = None
    main: bool = True


def prepare(
    out: str | os.PathLike,
    *,
    bundled: bool = False,
    wmt14: str | None = None,
    train: Pair | None = None,
    valid: Pair | None = None,
    test: Pair | None = None,
    corpora: dict[str, list[Any]] | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    cleaning: Any = "default",
    valid_size: int = 0,
    test_size: int = 0,
    seed: int = 1,
    vocab_size: int | None = None,
    vocab: str | os.PathLike | None = None,
    max_len: int = 256,
    workers: int = 1,
    progress: bool = False,
) -> Written:
    """``aiayn prepare``: a shared BPE vocabulary and the binarised splits in ``out``, from
    the bundled English->Spanish Bible (``bundled``), WMT14 (``wmt14``: "de-en" or "fr-en") or
    your own (source, target) files (``train``, and optionally ``valid`` and ``test``) and
    corpora (``corpora``: split -> list of ``data.corpora.Corpus``: TSV, TMX, named, weighted).
    Your own data is cleaned (``cleaning``: a ``data.clean.Cleaning``, default the command's
    filters; None: only empty and invalid pairs go) and ``valid_size``/``test_size`` pairs are
    carved out of train with ``seed``; the bundled corpus and WMT14 are taken as they are.
    ``vocab``: binarise with this SentencePiece model (a checkpoint's ``spm.model``) instead
    of training one; ``vocab_size`` default 8000."""
    from .data import prepare_corpus

    if vocab and vocab_size is not None:
        raise UserError("--vocab reuses a vocabulary of its own size: give it or --vocab-size")
    if bundled or wmt14:
        inputs = _curated(out, wmt14)
    else:
        pairs = {"train": train, "valid": valid, "test": test}
        inputs = _own(corpora, pairs, (src_lang, tgt_lang), cleaning, (valid_size, test_size, seed))
    summary = prepare_corpus(
        inputs.pop("splits"),
        out,
        vocab_size=DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size,
        max_len=max_len,
        vocab=vocab,
        workers=workers,
        progress=progress,
        **inputs,
    )
    return Written(Path(out).resolve(), summary)


def _curated(out: str | os.PathLike, wmt14: str | None) -> dict[str, Any]:
    """``prepare_corpus``'s inputs for the bundled Bible or WMT14: taken as they are (no
    cleaning), their languages recorded (validation BLEU reads them)."""
    from .data import bundled_corpus_paths
    from .data.prepare import BIBLE_LANGS

    if wmt14:
        splits, record = _wmt14(wmt14, Path(out))
        return {"splits": splits, "record": record}
    return {"splits": bundled_corpus_paths(), "record": BIBLE_LANGS}


def _own(
    corpora: dict[str, list[Any]] | None,
    pairs: dict[str, Pair | None],
    languages: tuple[str | None, str | None],
    cleaning: Any,
    held_out: tuple[int, int, int],
) -> dict[str, Any]:
    """``prepare_corpus``'s inputs for your own files: the splits, their languages, the
    filters (``"default"``: the command's; None: only empty and invalid pairs go) and the
    sizes to carve out of train."""
    from .data.clean import Cleaning
    from .data.corpora import Languages
    from .data.select import HeldOutSizes

    return {
        "splits": _own_splits(corpora, pairs),
        "languages": Languages(*languages),
        "cleaning": Cleaning() if cleaning == "default" else cleaning or Cleaning.off(),
        "held_out": HeldOutSizes(*held_out),
    }


def _wmt14(pair: str, out: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """(splits, languages record) of WMT14 ``pair`` ("de-en": English->German), downloaded
    into ``out``/raw."""
    from .data.prepare import check_target
    from .data.wmt import download_wmt14

    if pair not in ("de-en", "fr-en"):
        raise UserError(f"--wmt14 {pair}: choose de-en or fr-en")
    check_target(out)  # before hours of downloading
    src, tgt = pair.split("-")[1], pair.split("-")[0]  # "de-en" -> en->de
    return download_wmt14(pair, src, tgt, out / "raw"), {"src_lang": src, "tgt_lang": tgt}


def _own_splits(
    corpora: dict[str, list[Any]] | None, pairs: dict[str, Pair | None]
) -> dict[str, list[Any]]:
    """Each split's corpora: ``corpora``'s and the (source, target) file pairs, checked."""
    from .data.corpora import Corpus

    splits = {name: list(given) for name, given in (corpora or {}).items()}
    for name, pair in pairs.items():
        if pair and all(pair):
            corpus = Corpus.from_dict({"src": pair[0], "tgt": pair[1]}, f"{name}=", name)
            splits.setdefault(name, []).append(corpus)
    if "train" not in splits:
        raise UserError(
            "no input: give --bundled, --wmt14, --data-spec, --corpus, or --train-src and "
            "--train-tgt (or --train-tsv, --train-tmx)"
        )
    for name in ("valid", "test"):
        if len(splits.get(name, [])) > 1:
            raise UserError(f"one {name} corpus at most, got {len(splits[name])}")
    return splits


def train_model(
    config: str | os.PathLike | dict[str, Any] | None = None,
    *,
    overrides: Sequence[str] = (),
    resume: str | None = "auto",
    device: str = "auto",
    init_from: str | os.PathLike | None = None,
    init_from_keep: str | None = None,
    on_stopped: Callable[[dict[str, Any]], None] | None = None,
    **defaults: Any,
) -> Trained:
    """``aiayn train``: train as ``config`` says (a YAML/TOML/JSON file, a bundled recipe's
    name, or a dict of ``TrainConfig`` keys), with ``overrides`` ("key=value", as ``--set``)
    and ``defaults`` (keys the config and overrides replace); ``resume`` "auto" takes OUT's
    latest checkpoint, None starts afresh. Returns the run's directory and the summary and
    cost ``aiayn train`` prints (in the main process of several; elsewhere the summary).

    SIGTERM or Ctrl-C (in the main thread) stops the run after the update in progress with a
    checkpoint: the result's ``stopped`` names the signal, and ``on_stopped`` gets the summary
    while a second signal is still held off (the command prints its resume line there)."""
    from .runtime.flops import measure_matmul_peak
    from .runtime.hardware import resolve_device
    from .train import distributed
    from .train.config import load_train_config, resolve_train_config
    from .train.trainer import Trainer

    sets = list(overrides)
    if init_from is not None:
        sets.append(f"init_from={init_from}")
    if init_from_keep is not None:
        sets.append(f"init_from_keep={init_from_keep}")
    if isinstance(config, dict):
        cfg = resolve_train_config(config, sets, defaults=defaults, where="config")
    else:
        cfg = load_train_config(config, sets, **defaults)
    trainer = Trainer(cfg, device=resolve_device(device))
    out = Path(cfg.out).resolve()
    with _stop_on_signals(trainer.request_stop):  # held while on_stopped prints: whole
        summary = trainer.run(resume=resume)
        if trainer.preempted:
            if on_stopped is not None and trainer.dist.is_main:
                on_stopped(summary)
            distributed.teardown()
            return Trained(out, summary, trainer.stopped, trainer.dist.is_main)
    main = trainer.dist.is_main
    if main:
        peak = measure_matmul_peak(trainer.device, trainer.peak_dtype)
        summary = {**summary, **trainer.cost(peak)}
    distributed.teardown()
    return Trained(out, summary, main=main)


@contextmanager
def _stop_on_signals(request: Callable[[int], None]) -> Iterator[None]:
    """``train.preemption.stop_on_signals`` where Python can install handlers (the main
    thread); a run started from another thread stops only when it ends."""
    from .train.preemption import stop_on_signals

    main = threading.current_thread() is threading.main_thread()
    with stop_on_signals(request) if main else nullcontext():
        yield
