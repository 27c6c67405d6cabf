"""The figures every ``auto`` decides from, measured on this machine and written into the table
(``src/aiayn/measured.json``) under its chip class (``aiayn.hardware.Bf16.chip``):

    # amp: auto -- the demo recipe in fp32 and bf16 autocast, A-B-B-A, 100 updates each (~5 min)
    PYTHONPATH=src .venv/bin/python benchmarks/measure_auto.py train_bf16
    # --precision auto -- the demo model's test split decoded in fp32 and bf16, A-B-B-A (~4 min)
    PYTHONPATH=src .venv/bin/python benchmarks/measure_auto.py decode_bf16 \
        --checkpoint runs/demo/averaged
    # compile: auto -- the demo recipe eager and compiled, 40 updates each (~3 min)
    PYTHONPATH=src .venv/bin/python benchmarks/measure_auto.py compile

Run with nothing else on the machine: a second job changes the speed ratios. The bf16 settings
are refused on a chip without native bf16, where ``auto`` never chooses bf16 whatever the table
says. ``--table`` writes elsewhere; ``--preset tiny --updates 3`` checks the command in seconds
(the test suite does).

train_bf16: each run starts from the same seed; tokens/s is the run's own (the trainer's summary),
the median over the two runs of a precision; the validation perplexity is after the same updates.
decode_bf16: ``evaluate_model`` (what ``aiayn evaluate`` runs) with the fp32 and the bf16 model,
A-B-B-A, decoding seconds the median of a precision's two runs (whose outputs must be equal);
sacrebleu's paired bootstrap (and approximate randomization) of bf16's outputs against fp32's
(``metrics.significance``), outputs compared line by line. ``--attention`` says what the bf16
model's decoder attention computes in (default: the chip's current choice,
``policy.decoder_attention``), so that both can be measured; the figure records it, and
it becomes the chip's choice. compile: per update from log.jsonl; the steady rate over the
updates after the first ``--warm``, the compile time as the compiled run's extra seconds to reach
update ``--warm``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import torch

from aiayn import hardware, measured
from aiayn.checkpoint import load_translator
from aiayn.data import bundled_corpus_paths, prepare_bundled
from aiayn.decode import SearchRequest, for_decoding
from aiayn.errors import UserError
from aiayn.evaluate import evaluate_model
from aiayn.files import read_lines, write_text_atomic
from aiayn.metrics.significance import significance
from aiayn.policy import decoder_attention
from aiayn.train.config import recipe_config
from aiayn.train.trainer import Trainer

SETTINGS = ("train_bf16", "decode_bf16", "compile")


def train(data: Path, out: Path, args: argparse.Namespace, **sets: Any) -> dict[str, Any]:
    """One fresh run of the demo recipe for ``--updates`` updates; its summary."""
    cfg = recipe_config(
        "demo",
        [f"preset={args.preset}"] if args.preset else [],
        data=str(data),
        out=str(out),
        max_minutes=None,
        max_updates=args.updates,
        save_every_minutes=None,
        valid_bleu_sentences=0,
        num_threads=args.threads,
        log_every=1,
        seed=1,
        **sets,
    )
    return Trainer(cfg).run(resume=None)


def train_bf16(data: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"none": [], "bf16": []}
    for i, amp in enumerate(("none", "bf16", "bf16", "none")):  # A-B-B-A: drift hits both alike
        summary = train(data, work / f"{i}-{amp}", args, amp=amp, compile=False)
        runs[amp].append(summary)
        print(
            f"  amp={amp}: {summary['tokens_per_s']:.0f} tokens/s, ppl {summary['valid_ppl']:.2f}"
        )
    return {
        "fp32_tokens_per_s": round(statistics.median(s["tokens_per_s"] for s in runs["none"])),
        "bf16_tokens_per_s": round(statistics.median(s["tokens_per_s"] for s in runs["bf16"])),
        "fp32_valid_ppl": round(runs["none"][-1]["valid_ppl"], 2),
        "bf16_valid_ppl": round(runs["bf16"][-1]["valid_ppl"], 2),
        "updates": args.updates,
    }


def decode_bf16(args: argparse.Namespace) -> dict[str, Any]:
    if args.checkpoint is None:
        raise UserError("decode_bf16 needs --checkpoint (the demo model: runs/demo/averaged)")
    src, ref = bundled_corpus_paths()["test"]
    sources, references = read_lines(src)[: args.sentences], read_lines(ref)[: args.sentences]
    seconds: dict[str, list[float]] = {"fp32": [], "bf16": []}
    outputs: dict[str, list[str]] = {}
    attention = args.attention or decoder_attention("cpu")
    for precision in ("fp32", "bf16", "bf16", "fp32"):  # A-B-B-A: drift hits both alike
        model, vocab = load_translator(args.checkpoint)
        if precision == "bf16":
            model = for_decoding(model, precision="bf16", attention=attention)
        else:
            model = for_decoding(model)
        result = evaluate_model(model, vocab, sources, references, SearchRequest(), "es")
        seconds[precision].append(result.decode_s)
        if outputs.setdefault(precision, result.hypotheses) != result.hypotheses:
            raise RuntimeError(f"two {precision} runs decoded differently: not deterministic")
        print(f"  {precision}: {result.decode_s:.1f} s, SacreBLEU {result.sacrebleu:.2f}")
    fp32, bf16 = outputs["fp32"], outputs["bf16"]
    tested = significance([("fp32", fp32), ("bf16", bf16)], references, ["bleu"])
    fp32_bleu, bf16_bleu = (scores["BLEU"] for scores in tested.scores)
    return {
        "fp32_sacrebleu": round(fp32_bleu.score, 2),
        "bf16_sacrebleu": round(bf16_bleu.score, 2),
        "p_bootstrap": round(bf16_bleu.p_bootstrap, 4),
        "p_ar": round(bf16_bleu.p_ar, 4),
        "fp32_decode_s": round(statistics.median(seconds["fp32"]), 1),
        "bf16_decode_s": round(statistics.median(seconds["bf16"]), 1),
        "attention": attention,
        "outputs": len(fp32),
        "unchanged": sum(a == b for a, b in zip(fp32, bf16)),
    }


def steady(run: Path, warm: int) -> tuple[float, float]:
    """(tokens/s over the updates after ``warm``, seconds to reach update ``warm``) of a run."""
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    timed = [r for r in records if "tok_s" in r]
    reached = next(r["elapsed_s"] for r in timed if r["update"] == warm)
    return statistics.median(r["tok_s"] for r in timed if r["update"] > warm), reached


def compile_step(data: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    if args.updates <= args.warm:
        raise UserError(f"--updates {args.updates} must exceed --warm {args.warm}")
    figures = {}
    for on in (False, True):
        train(data, work / f"compile-{on}", args, amp="none", compile=on)
        figures[on] = steady(work / f"compile-{on}", args.warm)
        print(
            f"  compile={on}: {figures[on][0]:.0f} tokens/s, update {args.warm} at "
            f"{figures[on][1]:.1f} s"
        )
    return {
        "eager_tokens_per_s": round(figures[False][0]),
        "compiled_tokens_per_s": round(figures[True][0]),
        "compile_s": round(max(figures[True][1] - figures[False][1], 0.0), 1),
    }


def record(table: Path, chip: str, setting: str, figure: dict[str, Any], command: str) -> None:
    """``figure`` with where it was measured, under ``chip`` and ``setting`` in ``table``."""
    content = measured.load_table(table) if table.exists() else {}
    content.setdefault(chip, {})[setting] = {
        **figure,
        "cpu": hardware.cpu_description(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__.split("+")[0],
        "date": date.today().isoformat(),
        "command": command,
    }
    write_text_atomic(table, json.dumps(content, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("setting", choices=SETTINGS)
    parser.add_argument("--table", type=Path, default=measured.TABLE)
    parser.add_argument("--data", type=Path, default=Path("work/bible"), help="prepared if absent")
    parser.add_argument("--updates", type=int, help="per run (train_bf16 100, compile 40)")
    parser.add_argument(
        "--warm", type=int, default=5, help="compile: updates before the steady rate"
    )
    parser.add_argument("--preset", help="a model preset in place of the demo's (tiny: a check)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--checkpoint", type=Path, help="decode_bf16: the demo model")
    parser.add_argument("--sentences", type=int, help="decode_bf16: the first N test verses")
    parser.add_argument(
        "--attention",
        choices=["fp32", "bf16"],
        help="decode_bf16: what the bf16 model's decoder attention computes in (default: the "
        "chip's current choice, policy.decoder_attention)",
    )
    args = parser.parse_args(argv)
    args.updates = args.updates or (100 if args.setting == "train_bf16" else 40)
    torch.set_num_threads(args.threads)
    support = hardware.bf16_support(torch.device("cpu"))
    try:
        if args.setting != "compile" and not support.native:
            raise UserError(f"{args.setting}: {support.reason}, where auto never chooses bf16")
        print(
            f"{args.setting} on {hardware.cpu_description()} ({support.chip}), "
            f"{args.threads} threads"
        )
        with tempfile.TemporaryDirectory(prefix="measure_auto-") as tmp:
            if args.setting == "decode_bf16":
                figure = decode_bf16(args)
            else:
                if not (args.data / "meta.json").exists():  # prepared by us or by aiayn demo
                    prepare_bundled(args.data)
                measure = train_bf16 if args.setting == "train_bf16" else compile_step
                figure = measure(args.data, Path(tmp), args)
    except UserError as e:
        sys.exit(f"measure_auto: {e}")
    command = "benchmarks/measure_auto.py " + " ".join(argv if argv is not None else sys.argv[1:])
    record(args.table, support.chip, args.setting, figure, command)
    decide = {
        "train_bf16": measured.train_bf16,
        "decode_bf16": measured.decode_bf16,
        "compile": measured.compile_step,
    }[args.setting]
    decision = decide(support.chip, args.table)
    print(f"{args.table}: {support.chip} {args.setting} = {figure}")
    print(f"auto: {'on' if decision.on else 'off'}: {decision.reason}")


if __name__ == "__main__":
    main()
