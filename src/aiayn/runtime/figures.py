"""What every ``auto`` decides from: figures measured on each class of chip, never a constant.

    decision = train_bf16("cpu-avx512_bf16")   # Decision(on=..., reason="bf16 measured ...x ...")

``amp: auto``, ``--precision auto`` and ``compile: auto`` each turn a speed-up on only where a
measurement on that class of chip (``hardware.Bf16.chip``) has shown that it pays, by the rules
below; a class with no figure keeps the paper's fp32 and the eager step. The figures live in
two tables of one entry per class and setting, each with the CPU, torch version, date and the
command that measured it: this machine's own (``user_table()``, written by ``aiayn measure``), read
first, then ``figures.json`` beside this module, the figures the project measured. So a new
class is one command away, and every ``auto`` can say what it rests on.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError

TABLE = Path(__file__).with_name("figures.json")
# where this machine's figures live, if not in the user's cache (see user_table)
USER_TABLE = "AIAYN_MEASURED"

# training: bf16 must buy a quarter more updates per minute at the same perplexity after the same
# updates; less is within the noise of a shared machine and not worth leaving the paper's fp32
TRAIN_MIN_SPEEDUP = 1.25
TRAIN_MAX_PPL_CHANGE = 0.03
# bf16 matmul attention in training: its step at least 2% faster than with SDPA in fp32; on
# cpu-amx the two steps measured 1.004x and 1.008x apart in two runs: noise, not a gain
TRAIN_ATTENTION_MIN_SPEEDUP = 1.02
# decoding (docs/decoding.md#precision): on the demo model's test split, SacreBLEU within 0.2 of
# fp32's and no difference that sacrebleu's paired bootstrap finds at the 5% level, and faster
DECODE_MAX_BLEU_CHANGE = 0.2
DECODE_MIN_P = 0.05
DECODE_KEYS = frozenset(
    {"fp32_sacrebleu", "bf16_sacrebleu", "p_bootstrap", "fp32_decode_s", "bf16_decode_s"}
    | {"outputs", "unchanged"}
)
# compiling must have paid back its compile time within 5% of a 15-minute demo run
COMPILE_PAYBACK_S = 45.0

MEASURE = "aiayn measure"
# the settings it measures
SETTINGS = ("train_bf16", "decode_bf16", "compile", "train_bf16_matmul_attention")
# per setting, the figures its rule reads (numbers >= 0) and those it divides by (> 0); a
# decode_bf16 figure may lack DECODE_KEYS (an older rule's: it decides nothing now)
NUMBERS = {
    "train_bf16": {"fp32_tokens_per_s", "bf16_tokens_per_s", "fp32_valid_ppl", "bf16_valid_ppl"},
    "train_bf16_matmul_attention": {
        "sdpa_fp32_step_ms",
        "bf16_matmuls_step_ms",
        "fp32_valid_ppl",
        "bf16_matmuls_valid_ppl",
    },
    "decode_bf16": set(),
    "compile": {"eager_tokens_per_s", "compiled_tokens_per_s", "compile_s"},
}
DIVISORS = {
    "train_bf16": {"fp32_tokens_per_s", "fp32_valid_ppl"},
    "train_bf16_matmul_attention": {"bf16_matmuls_step_ms", "fp32_valid_ppl"},
    "decode_bf16": {"bf16_decode_s", "outputs"},
    "compile": {"eager_tokens_per_s"},
}
SOURCE_KEYS = ("date", "torch")  # what every decision says it rests on


@dataclass(frozen=True)
class Decision:
    """Whether ``auto`` turns a setting on, and the phrase (with the figure) that says why."""

    on: bool
    reason: str


def user_table() -> Path:
    """This machine's table, which ``aiayn measure`` writes: ``$AIAYN_MEASURED``, else
    ``measured.json`` in the user's cache (``$XDG_CACHE_HOME/aiayn``, ``~/.cache/aiayn``), where
    torch and Hugging Face keep theirs: figures of this machine belong to its user, not to an
    installed package that an upgrade replaces."""
    if os.environ.get(USER_TABLE):
        return Path(os.environ[USER_TABLE]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "aiayn" / "measured.json"


def load_table(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """The measured figures by chip class, then by setting (``train_bf16``, ``decode_bf16``,
    ``compile``)."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: not a table of measured figures: not UTF-8 ({e.reason})"
        ) from None
    except json.JSONDecodeError as e:  # a table edited by hand, or cut short by a full disk
        raise UserError(
            f"{path}: line {e.lineno}: not a table of measured figures: {e.msg}"
        ) from None
    if not isinstance(content, dict):
        raise UserError(f"{path}: not a table of measured figures (a JSON object by chip class)")
    for chip, settings in content.items():
        if not isinstance(settings, dict):
            raise UserError(f"{path}: {chip}: not an object of figures by setting")
        for setting, figure in settings.items():
            if not isinstance(figure, dict):
                raise UserError(f"{path}: {chip}.{setting}: not an object of figures")
    return content


def check_figure(figure: dict[str, Any], setting: str, where: str) -> dict[str, Any]:
    """``figure`` if its rule can read it, else a ``UserError`` naming ``where`` and the key: a
    figure missing, not a number, or zero where the rule divides by it. A decode_bf16 figure
    without every one of ``DECODE_KEYS`` is an older rule's, decided off (``decode_bf16``)."""
    numbers: AbstractSet[str] = NUMBERS[setting]
    if setting == "decode_bf16":
        if not DECODE_KEYS <= set(figure):
            return figure
        numbers = DECODE_KEYS
    for key in (*sorted(numbers), *SOURCE_KEYS):
        if key not in figure:
            raise UserError(f"{where}: no {key!r}")
    for key in sorted(numbers):
        value = figure[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise UserError(f"{where}.{key}: {value!r} is not a number >= 0")
        if value == 0 and key in DIVISORS[setting]:
            raise UserError(f"{where}.{key}: 0, which the rule divides by")
    return figure


def entry(chip: str, setting: str, table: Path | None = None) -> dict[str, Any] | None:
    """The figure for ``chip`` and ``setting``: from ``table`` alone where one is given, else
    this machine's own (``user_table()``) before the package's."""
    tables = [table] if table else [user_table(), TABLE]
    for path in tables:
        if path.exists():
            figure = load_table(path).get(chip, {}).get(setting)
            if figure is not None:
                return check_figure(figure, setting, f"{path}: {chip}.{setting}")
    return None


def _unmeasured(chip: str, setting: str) -> Decision:
    return Decision(
        False, f"no {setting} figure for {chip} yet (`{MEASURE} {setting}` measures it)"
    )


def _within(value: float, bound: float) -> bool:
    """``value <= bound``, a figure on the bound counting as within (24.2 - 24.0 is 0.19999...)."""
    return value <= bound or math.isclose(value, bound)


def _source(figure: dict[str, Any]) -> str:
    return f"{figure['date']}, torch {figure['torch']}"


def train_bf16(chip: str, table: Path | None = None) -> Decision:
    """bf16 autocast for training: on where it measured >= 1.25x fp32's tokens/s with the
    validation perplexity after the same updates within 3%."""
    figure = entry(chip, "train_bf16", table)
    if figure is None:
        return _unmeasured(chip, "train_bf16")
    speedup = figure["bf16_tokens_per_s"] / figure["fp32_tokens_per_s"]
    change = abs(figure["bf16_valid_ppl"] / figure["fp32_valid_ppl"] - 1)
    said = (
        f"bf16 measured {speedup:.2f}x fp32's tokens/s, perplexity {change:.1%} apart on {chip} "
        f"({_source(figure)})"
    )
    if _within(TRAIN_MIN_SPEEDUP, speedup) and _within(change, TRAIN_MAX_PPL_CHANGE):
        return Decision(True, said)
    return Decision(
        False, f"{said}; needs >= {TRAIN_MIN_SPEEDUP}x within {TRAIN_MAX_PPL_CHANGE:.0%}"
    )


def train_bf16_matmul_attention(chip: str, table: Path | None = None) -> Decision:
    """Attention as bf16 matmuls and softmax (``runtime.kernels.matmul_attention``) in bf16
    training on a CPU: on where the trainer's bf16 step measured at least 1.02x as fast with it
    as with SDPA in fp32, and the demo recipe's validation perplexity after the same updates
    within 3% of fp32 training's."""
    figure = entry(chip, "train_bf16_matmul_attention", table)
    if figure is None:
        return _unmeasured(chip, "train_bf16_matmul_attention")
    speedup = figure["sdpa_fp32_step_ms"] / figure["bf16_matmuls_step_ms"]
    change = abs(figure["bf16_matmuls_valid_ppl"] / figure["fp32_valid_ppl"] - 1)
    said = (
        f"bf16 matmul attention measured {speedup:.2f}x the bf16 step with SDPA in fp32, "
        f"perplexity {change:.1%} from fp32 training's on {chip} ({_source(figure)})"
    )
    if _within(TRAIN_ATTENTION_MIN_SPEEDUP, speedup) and _within(change, TRAIN_MAX_PPL_CHANGE):
        return Decision(True, said)
    return Decision(
        False,
        f"{said}; needs a step >= {TRAIN_ATTENTION_MIN_SPEEDUP}x as fast within "
        f"{TRAIN_MAX_PPL_CHANGE:.0%}",
    )


def decode_bf16(chip: str, table: Path | None = None) -> Decision:
    """bf16 for decoding: on where the demo model's test split measured it faster than fp32,
    within 0.2 SacreBLEU, and not significantly different (``decode_rule``)."""
    figure = entry(chip, "decode_bf16", table)
    if figure is None:
        return _unmeasured(chip, "decode_bf16")
    missing = sorted(DECODE_KEYS - set(figure))
    if missing:  # a figure of an older rule, which decides nothing now
        return Decision(
            False,
            f"the decode_bf16 figure for {chip} lacks {', '.join(missing)} "
            f"(`{MEASURE} decode_bf16` measures them)",
        )
    return decode_rule(figure, chip)


def decode_rule(figure: dict[str, Any], chip: str) -> Decision:
    """The rule for bf16 decoding on recorded figures: bf16 decoded the test split in less time
    than fp32, its SacreBLEU is within ``DECODE_MAX_BLEU_CHANGE`` of fp32's, and sacrebleu's
    paired bootstrap of the two outputs gives p >= ``DECODE_MIN_P`` (no significant difference).
    How many outputs changed is reported, not judged: a near tie may go either way in bf16."""
    speedup = figure["fp32_decode_s"] / figure["bf16_decode_s"]
    bleu = figure["bf16_sacrebleu"] - figure["fp32_sacrebleu"]
    p = figure["p_bootstrap"]
    changed = 1 - figure["unchanged"] / figure["outputs"]
    said = (
        f"bf16 measured {speedup:.2f}x fp32's speed, SacreBLEU {bleu:+.2f} (paired bootstrap "
        f"p = {p:.3f}), {changed:.1%} of outputs changed on {chip} ({_source(figure)})"
    )
    needs = [
        need
        for need, met in (
            ("faster than fp32", speedup > 1),
            (
                f"SacreBLEU within {DECODE_MAX_BLEU_CHANGE}",
                _within(abs(bleu), DECODE_MAX_BLEU_CHANGE),
            ),
            (f"p >= {DECODE_MIN_P}", p >= DECODE_MIN_P),
        )
        if not met
    ]
    return Decision(not needs, f"{said}; needs {', '.join(needs)}" if needs else said)


def payback_s(eager_rate: float, compiled_rate: float, compile_s: float) -> float:
    """Seconds of training after which the compiled run has made as many updates as the eager
    one: ``compiled * (t - compile_s) = eager * t``; never (inf) where compiled is not faster."""
    if compiled_rate <= eager_rate:
        return math.inf
    return compile_s * compiled_rate / (compiled_rate - eager_rate)


def compile_step(chip: str, table: Path | None = None) -> Decision:
    """The compiled training step: on where it paid back its compile time within 45 s."""
    figure = entry(chip, "compile", table)
    if figure is None:
        return _unmeasured(chip, "compile")
    eager, compiled = figure["eager_tokens_per_s"], figure["compiled_tokens_per_s"]
    after = payback_s(eager, compiled, figure["compile_s"])
    said = (
        f"compiled {compiled / eager:.2f}x eager after {figure['compile_s']:.0f} s of compiling "
        f"on {chip} ({_source(figure)})"
    )
    if _within(after, COMPILE_PAYBACK_S):
        return Decision(True, f"{said}: paid back after {after:.0f} s")
    return Decision(False, f"{said}; must pay back within {COMPILE_PAYBACK_S:.0f} s")


def decide(setting: str, chip: str, table: Path | None = None) -> Decision:
    """What ``auto`` decides for a setting of ``SETTINGS`` on ``chip``."""
    rules = {
        "train_bf16": train_bf16,
        "decode_bf16": decode_bf16,
        "compile": compile_step,
        "train_bf16_matmul_attention": train_bf16_matmul_attention,
    }
    return rules[setting](chip, table)
