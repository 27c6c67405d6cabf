"""The figures every ``auto`` decides from, measured on this machine (``aiayn measure``):

    aiayn measure train_bf16     # amp: auto -- the demo recipe in fp32 and bf16, A-B-B-A (~5 min)
    aiayn measure decode_bf16 --checkpoint runs/demo/averaged   # --precision auto (~4 min)
    aiayn measure compile        # compile: auto -- the demo recipe eager and compiled (~3 min)
    aiayn measure train_bf16_matmul_attention   # bf16 training's attention path (~7 min)

Each figure goes under the chip's class (``hardware.Bf16.chip``) into this machine's table
(``figures.user_table()``), which every ``auto`` reads before the package's, with the CPU, the
threads, torch, the date and the command, so that a decision can say what it rests on.

train_bf16: each run starts from the same seed; tokens/s is the run's own (the trainer's summary),
the median over the two runs of a precision; the validation perplexity is after the same updates.
decode_bf16: ``evaluate_model`` (what ``aiayn evaluate`` runs) with the fp32 and the bf16 model,
A-B-B-A, decoding seconds the median of a precision's two runs (whose outputs must be equal);
sacrebleu's paired bootstrap (and approximate randomization) of bf16's outputs against fp32's,
outputs compared line by line; ``attention`` says what the bf16 model's decoder attention
computes in (default: the chip's current choice, ``policy.decoder_attention``).
compile: per update from log.jsonl; the steady rate over the updates after the first ``warm``, the
compile time as the compiled run's extra seconds to reach update ``warm``.
train_bf16_matmul_attention: the demo recipe in bf16 with attention as bf16 matmuls and with SDPA
in fp32, A-B-B-A, whatever the table says now (the path is set on the trainer); a path's step is
the median of its runs' median milliseconds an update after the first ``warm`` (log.jsonl);
the perplexities, bf16 matmuls' and fp32 training's (one more run), after the same updates.
"""

from __future__ import annotations

import json
import shlex
import statistics
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..files import read_jsonl, write_text_atomic
from ..runtime import figures
from ..runtime.cpu import cpu_description

WARMED = "train_bf16_matmul_attention"  # with compile, timed after --warm updates
# updates a run when not given: enough for a steady tokens/s on the demo recipe
DEFAULT_UPDATES = {"train_bf16": 100, "compile": 40, "train_bf16_matmul_attention": 100}


@dataclass(frozen=True)
class Plan:
    """What a measurement trains or decodes: the demo recipe on ``data`` (or ``preset`` in place
    of the demo's model, e.g. tiny for a check in seconds), or the model at ``checkpoint``."""

    data: Path
    updates: int
    threads: int
    preset: str | None = None
    warm: int = 5
    checkpoint: Path | None = None
    sentences: int | None = None
    attention: str | None = None


def measure(setting: str, plan: Plan, work: Path) -> dict[str, Any]:
    """The figure of ``setting`` on this machine; training runs go under ``work``."""
    if setting == "decode_bf16":
        return decode_bf16(plan)
    from ..data import prepare_bundled

    if not (plan.data / "meta.json").exists():  # a prepared dataset (ours, the demo's) is reused
        prepare_bundled(plan.data)
    if setting == "train_bf16_matmul_attention":
        return bf16_attention(plan, work)
    return train_bf16(plan, work) if setting == "train_bf16" else compile_step(plan, work)


def train(plan: Plan, out: Path, attention: str | None = None, **sets: Any) -> dict[str, Any]:
    """One fresh run of the demo recipe for ``plan.updates`` updates; its summary. ``attention``:
    the training attention path to take (``policy.resolve_attention``'s names) in place of the
    one this machine's tables choose."""
    from ..train.config import recipe_config
    from ..train.trainer import Trainer

    cfg = recipe_config(
        "demo",
        [f"preset={plan.preset}"] if plan.preset else [],
        data=str(plan.data),
        out=str(out),
        max_minutes=None,
        max_updates=plan.updates,
        save_every_minutes=None,
        valid_bleu_sentences=0,
        num_threads=plan.threads,
        log_every=1,
        seed=1,
        **sets,
    )
    trainer = Trainer(cfg)
    if attention is not None:
        trainer.attention = attention
    return trainer.run(resume=None)


def train_bf16(plan: Plan, work: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"none": [], "bf16": []}
    for i, amp in enumerate(("none", "bf16", "bf16", "none")):  # A-B-B-A: drift hits both alike
        summary = train(plan, work / f"{i}-{amp}", amp=amp, compile=False)
        runs[amp].append(summary)
        print(
            f"  amp={amp}: {summary['tokens_per_s']:.0f} tokens/s, ppl {summary['valid_ppl']:.2f}"
        )
    return {
        "fp32_tokens_per_s": round(statistics.median(s["tokens_per_s"] for s in runs["none"])),
        "bf16_tokens_per_s": round(statistics.median(s["tokens_per_s"] for s in runs["bf16"])),
        "fp32_valid_ppl": round(runs["none"][-1]["valid_ppl"], 2),
        "bf16_valid_ppl": round(runs["bf16"][-1]["valid_ppl"], 2),
        "updates": plan.updates,
    }


def decode_bf16(plan: Plan) -> dict[str, Any]:
    from ..checkpoint import load_translator
    from ..data import bundled_corpus_paths
    from ..decode import SearchRequest
    from ..evaluate import evaluate_model
    from ..files import read_lines
    from ..runtime.policy import decoder_attention
    from ..runtime.ready import for_decoding

    if plan.checkpoint is None:
        raise UserError("decode_bf16 needs --checkpoint (the demo model: runs/demo/averaged)")
    src, ref = bundled_corpus_paths()["test"]
    sources, references = read_lines(src)[: plan.sentences], read_lines(ref)[: plan.sentences]
    seconds: dict[str, list[float]] = {"fp32": [], "bf16": []}
    outputs: dict[str, list[str]] = {}
    attention = plan.attention or decoder_attention("cpu")
    for precision in ("fp32", "bf16", "bf16", "fp32"):  # A-B-B-A: drift hits both alike
        model, vocab = load_translator(plan.checkpoint)
        if precision == "bf16":
            model = for_decoding(model, precision="bf16", attention=attention)
        else:
            model = for_decoding(model)
        result = evaluate_model(model, vocab, sources, references, SearchRequest(), "es")
        seconds[precision].append(result.decode_s)
        if outputs.setdefault(precision, result.hypotheses) != result.hypotheses:
            raise RuntimeError(f"two {precision} runs decoded differently: not deterministic")
        print(f"  {precision}: {result.decode_s:.1f} s, SacreBLEU {result.sacrebleu:.2f}")
    return {
        **_compared(outputs["fp32"], outputs["bf16"], references),
        "fp32_decode_s": round(statistics.median(seconds["fp32"]), 1),
        "bf16_decode_s": round(statistics.median(seconds["bf16"]), 1),
        "attention": attention,
    }


def _compared(fp32: list[str], bf16: list[str], references: list[str]) -> dict[str, Any]:
    """bf16's outputs against fp32's: both scores, the paired tests' p-values, lines unchanged."""
    from ..metrics.significance import significance

    tested = significance([("fp32", fp32), ("bf16", bf16)], references, ["bleu"])
    fp32_bleu, bf16_bleu = (scores["BLEU"] for scores in tested.scores)
    assert bf16_bleu.p_bootstrap is not None and bf16_bleu.p_ar is not None  # two systems: tested
    return {
        "fp32_sacrebleu": round(fp32_bleu.score, 2),
        "bf16_sacrebleu": round(bf16_bleu.score, 2),
        "p_bootstrap": round(bf16_bleu.p_bootstrap, 4),
        "p_ar": round(bf16_bleu.p_ar, 4),
        "outputs": len(fp32),
        "unchanged": sum(a == b for a, b in zip(fp32, bf16)),
    }


def steady(run: Path, warm: int) -> tuple[float, float]:
    """(tokens/s over the updates after ``warm``, seconds to reach update ``warm``) of a run."""
    timed = [r for r in read_jsonl(run / "log.jsonl") if "tok_s" in r]
    reached = next(r["elapsed_s"] for r in timed if r["update"] == warm)
    return statistics.median(r["tok_s"] for r in timed if r["update"] > warm), reached


def compile_step(plan: Plan, work: Path) -> dict[str, Any]:
    if plan.updates <= plan.warm:
        raise UserError(f"--updates {plan.updates} must exceed --warm {plan.warm}")
    rates = {}
    for on in (False, True):
        train(plan, work / f"compile-{on}", amp="none", compile=on)
        rates[on] = steady(work / f"compile-{on}", plan.warm)
        print(
            f"  compile={on}: {rates[on][0]:.0f} tokens/s, update {plan.warm} at "
            f"{rates[on][1]:.1f} s"
        )
    return {
        "eager_tokens_per_s": round(rates[False][0]),
        "compiled_tokens_per_s": round(rates[True][0]),
        "compile_s": round(max(rates[True][1] - rates[False][1], 0.0), 1),
    }


def bf16_attention(plan: Plan, work: Path) -> dict[str, Any]:
    from ..runtime.kernels import BF16_MATMULS
    from ..runtime.policy import resolve_attention

    if plan.updates <= plan.warm:
        raise UserError(f"--updates {plan.updates} must exceed --warm {plan.warm}")
    sdpa = resolve_attention("none", torch.device("cpu"))  # fp32's path: SDPA in fp32
    step_ms: dict[str, list[float]] = {sdpa: [], BF16_MATMULS: []}
    ppl = {"fp32": train(plan, work / "fp32", amp="none", compile=False)["valid_ppl"]}
    for i, path in enumerate((sdpa, BF16_MATMULS, BF16_MATMULS, sdpa)):  # A-B-B-A
        run = work / f"{i}-bf16"
        ppl[path] = train(plan, run, attention=path, amp="bf16", compile=False)["valid_ppl"]
        step_ms[path].append(update_ms(run, plan.warm))
        print(f"  bf16, {path}: {step_ms[path][-1]:.1f} ms an update, ppl {ppl[path]:.2f}")
    return {
        "sdpa_fp32_step_ms": round(statistics.median(step_ms[sdpa]), 1),
        "bf16_matmuls_step_ms": round(statistics.median(step_ms[BF16_MATMULS]), 1),
        "fp32_valid_ppl": round(ppl["fp32"], 2),
        "bf16_matmuls_valid_ppl": round(ppl[BF16_MATMULS], 2),
        "updates": plan.updates,
    }


def update_ms(run: Path, warm: int) -> float:
    """Median milliseconds an update of a run after its first ``warm`` (log.jsonl, one record
    an update)."""
    records = read_jsonl(run / "log.jsonl")
    elapsed = {r["update"]: r["elapsed_s"] for r in records if "tok_s" in r}
    return 1e3 * statistics.median(
        elapsed[u] - elapsed[u - 1] for u in sorted(elapsed) if u > warm and u - 1 in elapsed
    )


def record(table: Path, chip: str, setting: str, figure: dict[str, Any], command: str) -> None:
    """``figure`` with where it was measured, under ``chip`` and ``setting`` in ``table`` (made
    with its folder if absent; the table's other figures kept)."""
    content = figures.load_table(table) if table.exists() else {}
    content.setdefault(chip, {})[setting] = {
        **figure,
        "cpu": cpu_description(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__.split("+")[0],
        "date": date.today().isoformat(),
        "command": command,
    }
    table.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(table, json.dumps(content, indent=2, ensure_ascii=False) + "\n")


def command(setting: str, plan: Plan) -> str:
    """The command line that measures ``plan`` again, defaults spelled out."""
    words = ["aiayn", "measure", setting, "--threads", str(plan.threads)]
    if setting == "decode_bf16":
        words += ["--checkpoint", str(plan.checkpoint), "--attention", str(plan.attention)]
        words += ["--sentences", str(plan.sentences)] if plan.sentences else []
    else:
        words += ["--data", str(plan.data), "--updates", str(plan.updates)]
        words += ["--preset", plan.preset] if plan.preset else []
        words += ["--warm", str(plan.warm)] if setting in ("compile", WARMED) else []
    return shlex.join(words)
