"""The main job: train and evaluate a real English->Spanish translator on the bundled Bible
corpus, on a laptop CPU, for a fixed number of updates.

    aiayn demo                       # DEMO_UPDATES updates, then evaluation and a record
    aiayn demo --updates 8800        # a longer run
    aiayn demo --minutes 15          # stop on the clock instead: the BLEU is then the machine's

A fixed number of updates trains the same recipe on every CPU (seeded; the weights differ only by
the rounding of the arithmetic, bf16's included), so the BLEU is the recipe's and the time is
what varies; the report says so. Stages:
prepare the data (reused when already there) -> train (a checkpoint every 1/15 of the budget)
-> average the last k <= 5 checkpoints (paper section 6.1; k chosen on the validation split)
-> beam-decode the test split (beam 4, alpha 0.6, +50) -> BLEU both ways, perplexity,
samples, cost, plots and attention maps -> a record of the run (``aiayn.records``).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from . import checkpoint as ckpt
from .analysis.plots import attention_maps, plot_training
from .checkpoint.averaging import average_last_best
from .data import bundled_corpus_paths, prepare_bundled
from .decode import Batching, SearchRequest
from .errors import UserError
from .evaluate import Evaluation, evaluate_model, perplexity_on
from .files import (
    check_not_input,
    read_jsonl,
    read_lines,
    write_lines_atomic,
    write_text_atomic,
)
from .metrics.significance import with_interval
from .records import Record, make_record, write_record
from .runtime.flops import measure_matmul_peak
from .runtime.ready import for_decoding
from .runtime.workers import auto_workers
from .train import TrainConfig
from .train.config import recipe_config
from .train.preemption import stop_on_signals
from .train.trainer import Resolved, Trainer

AVERAGE_AT_MOST = 5  # the paper averaged the last 5 checkpoints (base models)
# what 15 minutes of fp32 training on 2 cores of an AVX2 EPYC reached (2,186), rounded
DEMO_UPDATES = 2200
CHECKPOINTS = 15  # a checkpoint every 1/15 of the budget: recent ones for the averaging
RECORDS_DIR = "records"  # the run directory's records, unless --record names another
# Keys of the recipe that have their own flag; a --set would train in one place and evaluate another.
FLAGGED_KEYS = {"out": "--out", "data": "--work"}


def demo_train_config(
    data: Path,
    out: Path,
    minutes: float | None = None,
    sets: Sequence[str] = (),
    updates: int | None = None,
) -> TrainConfig:
    """The bundled recipe ``configs/demo.yaml`` (its deviations and their measurements are
    stated there) for this run: its corpus, run directory and budget (``updates``, by default
    DEMO_UPDATES, or the wall-clock ``minutes`` when given), with a checkpoint every 1/15 of the budget, then
    ``sets`` (``--set key=value``) on top."""
    _refuse_flagged_sets(sets)
    budget: dict[str, float | None]
    if minutes is None:
        updates = updates or DEMO_UPDATES
        budget = {"max_updates": updates, "max_minutes": None, "save_every_minutes": None}
        budget["save_every_updates"] = max(updates // CHECKPOINTS, 1)
    else:
        budget = {"max_updates": None, "max_minutes": minutes, "save_every_updates": None}
        budget["save_every_minutes"] = max(minutes / CHECKPOINTS, 0.05)
    return recipe_config(
        "demo",
        list(sets),
        data=str(data),
        out=str(out),
        num_threads=torch.get_num_threads(),
        **budget,
    )


def _budget(cfg: TrainConfig) -> str:
    """What stops the training, as the recipe after ``--set`` has it (e.g. max_minutes=null)."""
    limits = []
    if cfg.max_minutes is not None:
        limits.append(f"{cfg.max_minutes:g} minutes")
    if cfg.max_updates is not None:
        limits.append(f"{cfg.max_updates:,} updates")
    return " or ".join(limits)  # TrainConfig refuses neither


def _refuse_flagged_sets(sets: Sequence[str]) -> None:
    for item in sets:
        key = item.partition("=")[0].strip()
        if key in FLAGGED_KEYS:
            flag = FLAGGED_KEYS[key]
            raise UserError(f"--set {key}: the demo's {key} is given by {flag}; use {flag} instead")


# Written by the demo into a run directory it creates: ``--fresh`` deletes no other directory.
DEMO_MARKER = ".aiayn-demo"
# What a demo run directory holds; ``--fresh`` deletes nothing else.
DEMO_OUTPUTS = frozenset(
    {
        "checkpoints",
        "config.json",
        "log.jsonl",
        "tensorboard",
        "summary.json",
        "averaged",
        "test.hyp.es",
        "training.png",
        "attention",
        "report.json",
        RECORDS_DIR,
    }
)


def _check_demo_run(out: Path) -> None:
    if out.is_symlink() or not out.is_dir():
        raise UserError(
            f"--fresh would delete {out}, which is not a demo run directory; choose another --out"
        )
    strangers = sorted(
        p.name for p in out.iterdir() if p.name not in DEMO_OUTPUTS and not p.name.startswith(".")
    )
    if strangers:
        raise UserError(
            f"--fresh would delete {out}, which is not a demo run directory (it holds "
            f"{', '.join(strangers[:5])}); choose another --out"
        )
    if not (out / DEMO_MARKER).is_file():
        raise UserError(
            f"--fresh would delete {out}, but aiayn demo did not create it (it has no "
            f"{DEMO_MARKER}; demo runs of older versions have none): delete it by hand or "
            "choose another --out"
        )


def _start_run_dir(out: Path) -> None:
    """Create ``out`` with the marker ``--fresh`` asks for; one that exists is not ours to mark."""
    if not out.exists():
        out.mkdir(parents=True)
        write_text_atomic(out / DEMO_MARKER, "made by aiayn demo, which --fresh may delete\n")


def _test_search() -> SearchRequest:
    """The paper's search, in a decoding process per thread as ``aiayn evaluate`` runs it."""
    return SearchRequest(batching=Batching(workers=auto_workers("cpu")))


def run_demo(
    minutes: float | None = None,
    work: Path = Path("work/bible"),
    out: Path = Path("runs/demo"),
    sets: Sequence[str] = (),
    test_limit: int | None = None,
    fresh: bool = False,
    progress=print,
    updates: int | None = None,
    record: Path | None = None,
) -> dict[str, Any]:
    """Every stage of the demo; returns (and writes to ``out/report.json``) the report, and
    writes a record of the run into ``record`` (default ``out/records``). ``work`` and ``out``
    are relative to the working directory; the report names them absolute."""
    started = time.monotonic()
    work, out = work.resolve(), out.resolve()
    check_not_input(out, [work], option="--out", whole_dir=True)  # --fresh deletes the run
    cfg = demo_train_config(work, out, minutes, list(sets), updates)  # a bad --set fails first
    if fresh and out.exists():
        _check_demo_run(out)
        shutil.rmtree(out)
    progress("[1/5] preparing the bundled corpus (reused when present)")
    meta = prepare_bundled(work)
    pairs = json.dumps({k: v["pairs"] for k, v in meta["splits"].items()})
    progress(f"      {pairs} pairs, vocabulary {meta['vocab_size']}")

    progress(f"[2/5] training for {_budget(cfg)}")
    summary, cost = _train(cfg, out)

    progress("[3/5] averaging the last checkpoints (how many: chosen on the validation split)")
    averaged, k_best, valid_ppl_by_k = _average(out, progress)
    model, vocab = ckpt.load_translator(averaged)
    model = for_decoding(model)  # fp32, packed for decoding

    progress("[4/5] beam search on the test split (beam 4, alpha 0.6, max length input + 50)")
    sources, references, test = _evaluate_test(model, vocab, out, test_limit)

    progress("[5/5] plots: training curves, BLEU per checkpoint, attention maps")
    pictures = _pictures(out, model, vocab, sources, test.hypotheses)
    report = {
        "test": test.as_dict(),
        "valid_ppl_averaged": valid_ppl_by_k[k_best],
        "valid_ppl_by_number_averaged": valid_ppl_by_k,
        "averaged_checkpoints": k_best,
        "training": summary,
        "cost": cost,  # against the matmul peak measured after training
        "train_config": dataclasses.asdict(cfg),
        "bleu_per_checkpoint": _bleu_per_checkpoint(out / "log.jsonl"),
        "samples": [
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in list(zip(sources, references, test.hypotheses))[:10]
        ],
        "artefacts": {"checkpoint": summary["checkpoint"], "averaged": str(averaged), **pictures},
    }
    report["end_to_end_s"] = time.monotonic() - started
    report["record"] = str(
        write_record(demo_record(report, cfg, sets), record or out / RECORDS_DIR)
    )
    write_text_atomic(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False))
    return report


def _evaluate_test(
    model: Any, vocab: Any, out: Path, limit: int | None
) -> tuple[list[str], list[str], Evaluation]:
    """The test split (its first ``limit`` pairs) decoded and scored; the hypotheses written."""
    sources, references = (read_lines(p) for p in bundled_corpus_paths()["test"])
    if limit is not None:
        sources, references = sources[:limit], references[:limit]
    test = evaluate_model(
        model, vocab, sources, references, _test_search(), lang="es", progress=True
    )
    write_lines_atomic(out / "test.hyp.es", test.hypotheses)
    return sources, references, test


def demo_record(report: dict[str, Any], cfg: TrainConfig, sets: Iterable[str]) -> Record:
    """The run as a record (``aiayn.records``): its BLEU, updates and time, and its budget."""
    t, tr = report["test"], report["training"]
    figures = {
        "SacreBLEU": round(t["sacrebleu"], 2),
        "updates": tr["updates"],
        "end to end": f"{report['end_to_end_s'] / 60:.1f} min",
        "paper BLEU": round(t["paper_bleu"], 2),
        "tokens/s": round(tr["tokens_per_s"]),
        "training": f"{tr['elapsed_s'] / 60:.1f} min",
    }
    budget = (
        f"--updates {cfg.max_updates}"
        if cfg.max_minutes is None
        else f"--minutes {cfg.max_minutes:g}"
    )
    return make_record(
        topic="demo",
        what=f"`aiayn demo`, {_budget(cfg)}, test split of {t['sentences']:,} verses",
        figures=figures,
        command=" ".join(["aiayn demo", budget, *(f"--set {item}" for item in sets)]),
        threads=torch.get_num_threads(),
        notes=Resolved(**tr["resolved"]).line(),
    )


class TrainingStopped(Exception):
    """A signal stopped the demo's training after a checkpoint: a re-run continues it."""

    def __init__(self, signal_name: str, updates: int, checkpoint: str | None) -> None:
        super().__init__(f"stopped by {signal_name} at update {updates}")
        self.signal_name, self.updates, self.checkpoint = signal_name, updates, checkpoint


def _train(cfg: TrainConfig, out: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """Train into the run directory ``out``: the trainer's summary, and the run's cost against
    the matmul peak measured after training (the report's measurement, not the trainer's)."""
    _start_run_dir(out)
    trainer = Trainer(cfg, device="cpu")
    with stop_on_signals(trainer.request_stop):  # SIGTERM, Ctrl-C: save after this update
        summary = trainer.run()
    if trainer.preempted:
        assert trainer.stopped is not None  # preempted: a signal's name
        raise TrainingStopped(trainer.stopped, summary["updates"], summary["checkpoint"])
    return summary, trainer.cost(measure_matmul_peak(trainer.device, trainer.peak_dtype))


def _average(out: Path, progress: Callable[[str], Any]) -> tuple[Path, int, dict[int, float]]:
    """``average_run`` of the demo's run on the bundled validation split."""
    valid_src, valid_ref = (read_lines(p) for p in bundled_corpus_paths()["valid"])
    return average_run(out, valid_src, valid_ref, progress)


def average_run(
    out: Path, valid_src: list[str], valid_ref: list[str], progress: Callable[[str], Any]
) -> tuple[Path, int, dict[int, float]]:
    """The last checkpoints of the run ``out`` averaged into ``out/averaged``, as many as give
    the lowest perplexity of ``valid_ref``: (the averaged checkpoint, how many, the
    perplexity for each number tried)."""
    kept = ckpt.list_checkpoints(out / "checkpoints")[-AVERAGE_AT_MOST:]
    averaged, k_best, by_k = average_last_best(
        kept, out / "averaged", perplexity_on(valid_src, valid_ref)
    )
    shown = ", ".join(f"{k}: {ppl:.2f}" for k, ppl in by_k.items())
    progress(f"      valid ppl by number averaged: {shown}")
    return averaged, k_best, by_k


def _pictures(
    out: Path, model: Any, vocab: Any, sources: list[str], hypotheses: list[str]
) -> dict[str, Any]:
    """The training curves (BLEU as logged in training) and the first three test verses'
    attention maps, as the report's artefacts."""
    curve = plot_training(out / "log.jsonl", out / "training.png")
    maps = []
    for i in range(min(3, len(sources))):
        maps += attention_maps(
            model, vocab, sources[i], hypotheses[i], out / "attention", f"test{i + 1}"
        )
    return {
        "hypotheses": str(out / "test.hyp.es"),
        "training_plot": str(curve),
        "attention_maps": str(out / "attention"),
        "n_attention_maps": len(maps),
    }


def _bleu_per_checkpoint(log: Path) -> list[tuple[float, float]]:
    """(training minutes, validation SacreBLEU) of each validation, as logged in training."""
    return [(r["elapsed_s"] / 60, r["valid_bleu"]) for r in read_jsonl(log) if "valid_bleu" in r]


def _stopped_by(report: dict[str, Any]) -> str:
    """Which figure the budget fixed and which one this machine decided."""
    cfg, updates = report["train_config"], report["training"]["updates"]
    if cfg["max_updates"] is not None and updates >= cfg["max_updates"]:
        return (
            f"Training stopped after {updates:,} updates, as on every CPU: the BLEU is the "
            "recipe's (within rounding), the minutes are this machine's."
        )
    return (
        f"Training stopped on the clock after {cfg['max_minutes'] or 0:g} minutes: the "
        f"{updates:,} updates, and with them the BLEU, are this machine's."
    )


def format_report(report: dict[str, Any]) -> str:
    t, tr, a, cost = report["test"], report["training"], report["artefacts"], report["cost"]
    scores, signatures = t["intervals"], t["interval_signatures"]  # as aiayn evaluate has them
    lines = [
        "",
        (
            f"Test split ({t['sentences']} sentences), average of the last {report['averaged_checkpoints']} "
            f"checkpoint(s) (k with the lowest validation perplexity), beam 4:"
        ),
        f"  SacreBLEU   {with_interval(scores['BLEU'])}   ({t['signature']})",
        f"  paper BLEU  {t['paper_bleu']:.2f}   (Moses-tokenised, ##AT## compound split, multi-bleu)",
        f"  chrF2       {with_interval(scores['chrF2'])}   ({signatures['chrF2']})",
        f"  TER         {with_interval(scores['TER'])}, lower is better   ({signatures['TER']})",
        "  (in brackets: the bootstrap mean ± half-width of sacrebleu's 95% interval)",
        f"  perplexity  test {t['ppl']:.2f}, valid {report['valid_ppl_averaged']:.2f} per subword",
        f"  decoding    {t['decode_s']:.1f} s, {t['sentences_per_s']:.1f} sentences/s "
        f"({torch.get_num_threads()} threads)",
        "",
        "Samples:",
    ]
    for s in report["samples"]:
        lines += [f"  EN  {s['source']}", f"  REF {s['reference']}", f"  OUT {s['hypothesis']}", ""]
    lines += [
        _stopped_by(report),
        "",
        "Training cost (paper Table 2 terms):",
        f"  {tr['updates']} updates in {tr['elapsed_s'] / 60:.1f} min on {tr['devices']} x {tr['device']}, "
        f"{tr['tokens']['src'] + tr['tokens']['tgt']:,} tokens ({tr['tokens_per_s']:.0f} tokens/s)",
        f"  counted FLOPs {tr['counted_flops']:.2e}; paper-style estimate (time x devices x measured "
        f"peak {cost['matmul_peak_flops'] / 1e9:.0f} GFLOP/s) {cost['paper_cost_flops']:.2e}; MFU {cost['mfu']:.1%}",
        f"  {Resolved(**tr['resolved']).line()}",
        "",
        "Artefacts:",
        f"  record           {report['record']}",
        f"  last checkpoint  {a['checkpoint']}",
        f"  averaged model   {a['averaged']}",
        f"  hypotheses       {a['hypotheses']}",
        f"  training plot    {a['training_plot']}",
        f"  attention maps   {a['attention_maps']}/ ({a['n_attention_maps']} PNGs)",
        "",
        f'Try: echo "In the beginning God created the heavens and the earth." | aiayn translate --checkpoint {a["averaged"]}',
    ]
    return "\n".join(lines)
