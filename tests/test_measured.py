"""Every ``auto`` is a decision made from a measured figure: the rules, the shipped table, and
what amp, --precision and compile resolve to under both of the CPU's bf16 answers."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.analysis import measure
from aiayn.cli.main import main
from aiayn.errors import UserError
from aiayn.runtime import cpu, hardware
from aiayn.runtime import figures as measured
from aiayn.runtime.kernels import BF16_MATMULS
from aiayn.runtime.policy import (
    Precision,
    choose_precision,
    decoder_attention,
    resolve_amp,
    resolve_attention,
    resolve_compile,
)

CPU = torch.device("cpu")
SOURCE = {"cpu": "test CPU", "threads": 2, "torch": "2.13.0", "date": "2026-12-01", "command": "x"}


def train_figure(fp32: float, bf16: float, ppl_fp32: float = 100.0, ppl_bf16: float = 100.0):
    return {
        "fp32_tokens_per_s": fp32,
        "bf16_tokens_per_s": bf16,
        "fp32_valid_ppl": ppl_fp32,
        "bf16_valid_ppl": ppl_bf16,
        "updates": 100,
        **SOURCE,
    }


def decode_figure(
    bleu_bf16: float = 24.0,
    p: float = 0.5,
    bf16_s: float = 40.0,
    *,
    fp32_s: float = 50.0,
    unchanged: int = 900,
    bleu_fp32: float = 24.0,
):
    return {
        "fp32_sacrebleu": bleu_fp32,
        "bf16_sacrebleu": bleu_bf16,
        "p_bootstrap": p,
        "p_ar": p,
        "fp32_decode_s": fp32_s,
        "bf16_decode_s": bf16_s,
        "attention": "fp32",
        "outputs": 1000,
        "unchanged": unchanged,
        **SOURCE,
    }


def attention_figure(sdpa_ms: float, matmuls_ms: float, ppl_matmuls: float = 100.0):
    return {
        "sdpa_fp32_step_ms": sdpa_ms,
        "bf16_matmuls_step_ms": matmuls_ms,
        "fp32_valid_ppl": 100.0,
        "bf16_matmuls_valid_ppl": ppl_matmuls,
        "updates": 20,
        **SOURCE,
    }


def compile_figure(eager: float, compiled: float, compile_s: float):
    return {
        "eager_tokens_per_s": eager,
        "compiled_tokens_per_s": compiled,
        "compile_s": compile_s,
        **SOURCE,
    }


@pytest.fixture
def table(tmp_path, monkeypatch):
    """A table of our own in place of the shipped one: ``table(chip, setting, figure)``."""
    path, content = tmp_path / "measured.json", {}
    monkeypatch.setattr(measured, "TABLE", path)

    def put(chip: str, setting: str, figure: dict) -> None:
        content.setdefault(chip, {})[setting] = figure
        path.write_text(json.dumps(content))

    path.write_text("{}")
    return put


# --- the rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bf16", "ppl_bf16", "on"),
    [(1300, 101.0, True), (1250, 97.0, True), (1240, 100.0, False), (1300, 104.0, False)],
)
def test_bf16_training_pays_at_a_quarter_more_tokens_at_equal_perplexity(table, bf16, ppl_bf16, on):
    table("cpu-avx512_bf16", "train_bf16", train_figure(1000, bf16, ppl_bf16=ppl_bf16))
    decision = measured.train_bf16("cpu-avx512_bf16")
    assert decision.on is on
    assert f"{bf16 / 1000:.2f}x" in decision.reason and "2026-12-01" in decision.reason
    assert ("needs >= 1.25x" in decision.reason) is not on


@pytest.mark.parametrize(
    ("bleu", "p", "bf16_s", "needs"),
    [
        (24.2, 0.05, 49.9, None),  # on every bound: passes
        (23.8, 0.9, 30.0, None),
        (24.0, 0.5, 40.0, None),
        (24.21, 0.5, 40.0, "SacreBLEU within 0.2"),
        (23.75, 0.5, 40.0, "SacreBLEU within 0.2"),
        (24.1, 0.049, 40.0, "p >= 0.05"),  # a difference the bootstrap finds, however small
        (24.0, 0.5, 50.0, "faster than fp32"),
        (24.5, 0.01, 60.0, "faster than fp32, SacreBLEU within 0.2, p >= 0.05"),
    ],
)
def test_bf16_decoding_passes_faster_within_a_fifth_bleu_and_no_significant_difference(
    bleu, p, bf16_s, needs
):
    # the rule on recorded figures alone; how many outputs changed is said, never judged
    decision = measured.decode_rule(decode_figure(bleu, p, bf16_s, unchanged=100), "cpu-amx")
    assert decision.on is (needs is None)
    assert f"{50.0 / bf16_s:.2f}x fp32's speed" in decision.reason
    assert f"SacreBLEU {bleu - 24.0:+.2f} (paired bootstrap p = {p:.3f})" in decision.reason
    assert "90.0% of outputs changed on cpu-amx (2026-12-01, torch 2.13.0)" in decision.reason
    assert decision.reason.endswith(f"; needs {needs}") if needs else "needs" not in decision.reason


def test_a_decode_figure_of_the_old_rule_decides_nothing_and_says_what_it_lacks(table):
    # the rule of 2026-12-01 recorded BLEU and unchanged outputs only: no speed, no p-value
    old = {"fp32_sacrebleu": 24.49, "bf16_sacrebleu": 24.5, "outputs": 1523, "unchanged": 1523}
    table("cpu-amx", "decode_bf16", {**old, **SOURCE})
    decision = measured.decode_bf16("cpu-amx")
    assert not decision.on
    assert decision.reason == (
        "the decode_bf16 figure for cpu-amx lacks bf16_decode_s, fp32_decode_s, p_bootstrap "
        "(`aiayn measure decode_bf16` measures them)"
    )
    table("cpu-amx", "decode_bf16", decode_figure())  # read from the table: the rule's verdict
    assert measured.decode_bf16("cpu-amx") == measured.decode_rule(decode_figure(), "cpu-amx")


def test_compiling_pays_where_it_has_caught_up_with_eager_within_45_s(table):
    # 150 tokens/s after 10 s of compiling catches 100 tokens/s at t: 150 (t - 10) = 100 t
    assert measured.payback_s(100, 150, 10) == pytest.approx(30)
    assert measured.payback_s(100, 100, 1) == math.inf == measured.payback_s(100, 90, 0)
    table("cpu-avx512_bf16", "compile", compile_figure(100, 150, 10))
    assert measured.compile_step("cpu-avx512_bf16").on
    table("cpu-avx512_bf16", "compile", compile_figure(100, 150, 20))  # pays back after 60 s
    decision = measured.compile_step("cpu-avx512_bf16")
    assert not decision.on and "within 45 s" in decision.reason


@pytest.mark.parametrize(
    ("matmuls_ms", "ppl", "on"),
    [
        (400, 102.9, True),
        (400, 97.0, True),
        (420, 100.0, False),
        (380, 103.5, False),
        (417, 100.0, False),  # 1.007x: the noise of two runs on cpu-amx, not a speed-up
        (411, 100.0, True),  # 1.022x
    ],
)
def test_bf16_matmul_attention_pays_with_a_faster_step_at_equal_perplexity(
    table, matmuls_ms, ppl, on
):
    table("cpu-avx512_bf16", "train_bf16_matmul_attention", attention_figure(420, matmuls_ms, ppl))
    decision = measured.train_bf16_matmul_attention("cpu-avx512_bf16")
    assert decision.on is on
    assert f"{420 / matmuls_ms:.2f}x" in decision.reason and "2026-12-01" in decision.reason
    assert ("needs a step >= 1.02x as fast" in decision.reason) is not on


def test_a_class_without_a_figure_keeps_fp32_and_names_the_command_that_measures(table):
    for decide, setting in (
        (measured.train_bf16, "train_bf16"),
        (measured.decode_bf16, "decode_bf16"),
        (measured.compile_step, "compile"),
        (measured.train_bf16_matmul_attention, "train_bf16_matmul_attention"),
    ):
        decision = decide("cpu-amx")
        assert not decision.on
        assert (
            decision.reason
            == f"no {setting} figure for cpu-amx yet (`aiayn measure {setting}` measures it)"
        )


# --- the shipped table -----------------------------------------------------------------------


KEYS = {
    "train_bf16": set(train_figure(1, 1)),
    "decode_bf16": set(decode_figure()),
    "compile": set(compile_figure(1, 1, 1)),
    "train_bf16_matmul_attention": set(attention_figure(1, 1)),
}
CHIPS = {"cpu-amx", "cpu-avx512_bf16", "cpu-no_bf16", "cuda"}


def test_the_shipped_figures_say_what_measured_them_and_are_read_by_the_rules():
    shipped = measured.load_table(measured.TABLE)
    assert shipped and set(shipped) <= CHIPS
    for chip, settings in shipped.items():
        for setting, figure in settings.items():
            assert set(figure) == KEYS[setting], (chip, setting)
            assert all(figure[k] for k in ("cpu", "torch", "date", "command")), (chip, setting)
    # each figure was taken on a CPU of its class
    for chip, settings in shipped.items():
        for figure in settings.values():
            flags = figure["cpu"].partition("flags: ")[2].split(", ")
            assert {
                "cpu-amx": "amx_bf16" in flags,
                "cpu-avx512_bf16": "avx512_bf16" in flags and "amx_bf16" not in flags,
                "cpu-no_bf16": "avx512_bf16" not in flags and "amx_bf16" not in flags,
                "cuda": True,
            }[chip], (chip, figure["cpu"])


# --- what each auto resolves to, under both answers of the CPU --------------------------------


def test_a_cpu_without_native_bf16_never_gets_bf16_by_default(table, monkeypatch):
    monkeypatch.setenv(hardware.ASSUME_BF16, "emulated")
    for chip in CHIPS:  # even a table that says bf16 pays everywhere
        table(chip, "train_bf16", train_figure(100, 1000))
        table(chip, "decode_bf16", decode_figure())
    assert resolve_amp("auto", CPU)[0] == "fp32"
    assert choose_precision("auto", "cpu").name == "fp32"


@pytest.mark.parametrize("pays", [True, False])
def test_amp_auto_follows_the_figure_of_the_cpus_class(table, bf16_answer, pays):
    chip = hardware.bf16_support(CPU).chip
    assert chip == {"native": "cpu-avx512_bf16", "emulated": "cpu-no_bf16"}[bf16_answer]
    table(chip, "train_bf16", train_figure(1000, 1400 if pays else 1100))
    amp, reason = resolve_amp("auto", CPU)
    assert amp == ("bf16" if pays and bf16_answer == "native" else "fp32")
    if bf16_answer == "native":
        assert reason.startswith("amp=auto and the CPU has avx512_bf16")
        assert ("1.40x" if pays else "1.10x") in reason
    else:
        assert reason == "amp=auto and the CPU has no native bf16 (AIAYN_ASSUME_BF16=emulated)"
    assert resolve_amp("none", CPU) == ("fp32", "amp=none")
    assert resolve_amp("bf16", CPU)[0] == "bf16"  # asked for, bf16 whatever the chip


def test_bf16_matmul_attention_without_a_figure_stays_off(table):
    decision = measured.train_bf16_matmul_attention("cpu-amx")
    assert not decision.on and "no train_bf16_matmul_attention figure" in decision.reason


@pytest.mark.parametrize("pays", [True, False])
def test_bf16_training_attention_follows_the_figure_of_the_cpus_class(table, bf16_answer, pays):
    figure = attention_figure(420, 400 if pays else 440)
    table("cpu-avx512_bf16", "train_bf16_matmul_attention", figure)  # the native class only
    chosen = BF16_MATMULS if pays and bf16_answer == "native" else "SDPA in fp32"
    assert resolve_attention("bf16", CPU) == chosen
    assert resolve_attention("fp32", CPU) == "SDPA in fp32"  # fp32 training: never


@pytest.mark.parametrize("passes", [True, False])
def test_precision_auto_follows_the_figure_of_the_cpus_class(table, bf16_answer, passes):
    chip = hardware.bf16_support(CPU).chip
    table(chip, "decode_bf16", decode_figure(24.1, 0.4 if passes else 0.01))
    chosen = choose_precision("auto", "cpu")
    assert chosen.name == ("bf16" if passes and bf16_answer == "native" else "fp32")
    if bf16_answer == "native":
        assert chosen.reason.startswith("auto: the CPU has avx512_bf16")
        assert (
            f"; bf16 measured 1.25x fp32's speed, SacreBLEU +0.10 (paired bootstrap p = {0.4 if passes else 0.01:.3f})"
            in chosen.reason
        )
        assert chosen.reason.endswith("2026-12-01, torch 2.13.0)" if passes else "needs p >= 0.05")
    else:
        assert (
            chosen.reason
            == "auto: the CPU has no native bf16 (AIAYN_ASSUME_BF16=emulated), so bf16 would be slower"
        )
    assert choose_precision("auto", "cpu", quantize="int8").name == "fp32"  # int8 keeps fp32
    other = choose_precision("auto", "cpu", engine="ctranslate2")  # its own float32
    assert other == Precision("fp32", "auto: --engine ctranslate2 decodes in float32")


@pytest.mark.parametrize("pays", [True, False])
def test_compile_auto_follows_the_figure_of_the_cpus_class(table, bf16_answer, pays):
    chip = hardware.bf16_support(CPU).chip
    table(chip, "compile", compile_figure(100, 200 if pays else 95, 10))
    on, reason = resolve_compile("auto", CPU)
    assert on is pays and reason.startswith("compile=auto: compiled")
    assert resolve_compile(True, CPU) == (True, "compile=true")
    assert resolve_compile(False, CPU) == (False, "compile=false")


# --- this machine's table, and the command that fills it ---------------------------------------


def test_this_machines_figure_wins_over_the_packages(table, tmp_path, monkeypatch):
    table("cpu-amx", "train_bf16", train_figure(1000, 1100))  # the package's: does not pay
    table("cpu-amx", "compile", compile_figure(100, 150, 10))
    mine = tmp_path / "mine.json"
    monkeypatch.setenv(measured.USER_TABLE, str(mine))
    assert not measured.train_bf16("cpu-amx").on  # no table of this machine yet: the package's
    mine.write_text(json.dumps({"cpu-amx": {"train_bf16": train_figure(1000, 1400)}}))
    decision = measured.train_bf16("cpu-amx")
    assert decision.on and "1.40x" in decision.reason
    assert measured.compile_step("cpu-amx").on  # a setting it lacks: still the package's
    assert not measured.train_bf16("cpu-amx", measured.TABLE).on  # a table named: that one only


def test_this_machines_table_is_in_the_users_cache_unless_named(monkeypatch, tmp_path):
    monkeypatch.delenv(measured.USER_TABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert measured.user_table() == tmp_path / "aiayn" / "measured.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert measured.user_table() == Path.home() / ".cache" / "aiayn" / "measured.json"
    monkeypatch.setenv(measured.USER_TABLE, str(tmp_path / "t.json"))
    assert measured.user_table() == tmp_path / "t.json"


@pytest.mark.parametrize(
    ("text", "error"),
    [("{", "line 1: not a table of measured figures"), ("[]", "not a table of measured")],
)
def test_a_broken_table_of_this_machine_is_a_one_line_error_naming_it(
    text, error, tmp_path, monkeypatch
):
    mine = tmp_path / "mine.json"
    mine.write_text(text)
    monkeypatch.setenv(measured.USER_TABLE, str(mine))
    with pytest.raises(UserError, match=f"^{re.escape(str(mine))}: {error}"):
        measured.train_bf16("cpu-amx")


@pytest.mark.slow
def test_measure_writes_the_figures_the_rules_read(
    tiny_corpus, tiny_run, tmp_path, monkeypatch, capsys
):
    """On tiny shapes, as a check that the command never rots: each setting's figure lands
    under the chip's class with the command that measures it again, and what it prints is the
    rule's decision, which auto then takes from this machine's table."""
    monkeypatch.setenv(hardware.ASSUME_BF16, "native")
    table = tmp_path / "cache" / "measured.json"  # its folder made too
    monkeypatch.setenv(measured.USER_TABLE, str(table))
    tiny = ["--data", str(tiny_corpus), "--preset", "tiny", "--updates", "2", "--threads", "1"]
    checkpoint = sorted((tiny_run / "checkpoints").glob("update_*"))[-1]
    threads, meta = torch.get_num_threads(), (tiny_corpus / "meta.json").read_text()
    try:
        main(["measure", "train_bf16", *tiny])
        main(["measure", "decode_bf16", "--checkpoint", str(checkpoint), "--sentences", "4"])
    finally:
        torch.set_num_threads(threads)  # the command sets the process's, as a command may
    assert (tiny_corpus / "meta.json").read_text() == meta  # a prepared dataset is only read
    written = json.loads(table.read_text())["cpu-avx512_bf16"]
    assert set(written) == {"train_bf16", "decode_bf16"}
    train, decode = written["train_bf16"], written["decode_bf16"]
    assert set(train) == KEYS["train_bf16"] and set(decode) == KEYS["decode_bf16"]
    assert train["updates"] == 2 and train["fp32_tokens_per_s"] > 0 < train["bf16_tokens_per_s"]
    assert train["fp32_valid_ppl"] > 1 and train["bf16_valid_ppl"] == pytest.approx(
        train["fp32_valid_ppl"], rel=0.05
    )  # the same two updates, in two precisions
    assert decode["outputs"] == 4 and 0 <= decode["unchanged"] <= 4
    assert decode["fp32_decode_s"] > 0 < decode["bf16_decode_s"] and 0 < decode["p_bootstrap"] <= 1
    assert decode["attention"] == decoder_attention("cpu")  # the chip's choice, unless --attention
    assert train["command"] == (
        f"aiayn measure train_bf16 --threads 1 --data {tiny_corpus} --updates 2 --preset tiny"
    )
    assert decode["command"] == (
        f"aiayn measure decode_bf16 --threads 1 --checkpoint {checkpoint} "
        f"--attention {decode['attention']} --sentences 4"
    )
    assert train["cpu"] == cpu.cpu_description() and train["threads"] == 1
    out = capsys.readouterr().out
    for setting in ("train_bf16", "decode_bf16"):
        decision = measured.decide(setting, "cpu-avx512_bf16")  # from this machine's table
        assert f"auto: {'on' if decision.on else 'off'}: {decision.reason}" in out, setting
        assert decision == measured.decide(setting, "cpu-avx512_bf16", table)


@pytest.mark.slow
def test_measure_times_both_training_attention_paths_whatever_the_table_chooses(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    """The figure train_bf16_matmul_attention's rule reads, from the trainer itself (it was two
    benchmarks by hand): each path really taken in its runs, A-B-B-A, and fp32's perplexity."""
    monkeypatch.setenv(hardware.ASSUME_BF16, "native")
    table = tmp_path / "measured.json"
    monkeypatch.setenv(measured.USER_TABLE, str(table))
    taken = []
    original = measure.train

    def train(plan, out, attention=None, **sets):
        summary = original(plan, out, attention, **sets)
        taken.append((sets["amp"], summary["attention"]))
        return summary

    monkeypatch.setattr(measure, "train", train)
    tiny = ["--data", str(tiny_corpus), "--preset", "tiny", "--threads", "1"]
    threads = torch.get_num_threads()
    try:
        main(["measure", "train_bf16_matmul_attention", *tiny, "--updates", "3", "--warm", "1"])
    finally:
        torch.set_num_threads(threads)
    sdpa = "SDPA in fp32"
    bf16_runs = [("bf16", path) for path in (sdpa, BF16_MATMULS, BF16_MATMULS, sdpa)]
    assert taken == [("none", sdpa), *bf16_runs]  # fp32 once, then A-B-B-A
    figure = json.loads(table.read_text())["cpu-avx512_bf16"]["train_bf16_matmul_attention"]
    assert set(figure) == KEYS["train_bf16_matmul_attention"] and figure["updates"] == 3
    assert figure["sdpa_fp32_step_ms"] > 0 < figure["bf16_matmuls_step_ms"]
    assert figure["bf16_matmuls_valid_ppl"] == pytest.approx(figure["fp32_valid_ppl"], rel=0.05)
    assert figure["command"] == (
        "aiayn measure train_bf16_matmul_attention --threads 1 "
        f"--data {tiny_corpus} --updates 3 --preset tiny --warm 1"
    )
    decision = measured.decide("train_bf16_matmul_attention", "cpu-avx512_bf16")
    assert f"auto: {'on' if decision.on else 'off'}: {decision.reason}" in capsys.readouterr().out
    assert resolve_attention("bf16", CPU) == (BF16_MATMULS if decision.on else sdpa)


def test_measure_refuses_bf16_on_a_chip_without_it_and_keeps_the_table(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(hardware.ASSUME_BF16, "emulated")
    table = tmp_path / "measured.json"
    table.write_text("{}")
    with pytest.raises(SystemExit):
        main(["measure", "train_bf16", "--table", str(table), "--data", str(tiny_corpus)])
    assert capsys.readouterr().err == (
        "aiayn measure: error: train_bf16: the CPU has no native bf16 "
        f"({hardware.ASSUME_BF16}=emulated), where auto never chooses bf16\n"
    )
    monkeypatch.setenv(hardware.ASSUME_BF16, "native")
    with pytest.raises(SystemExit):
        main(["measure", "decode_bf16", "--table", str(table)])
    assert capsys.readouterr().err.endswith(
        "error: decode_bf16 needs --checkpoint (the demo model: runs/demo/averaged)\n"
    )
    assert table.read_text() == "{}"


def test_measure_help_in_a_fresh_interpreter_names_the_settings():
    """``aiayn measure --help`` in a fresh interpreter (the same parser a wheel installs)."""
    result = subprocess.run(
        [sys.executable, "-m", "aiayn", "measure", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    settings = "{train_bf16,decode_bf16,compile,train_bf16_matmul_attention}"
    assert settings in result.stdout and "--table" in result.stdout


# --- a table of the wrong shape: one line naming the file and the key ------------------------


def _broken_tables(chip: str) -> list[tuple[bytes, str]]:
    """(the table's bytes, what the error must say after the file's name)."""
    without_key = {k: v for k, v in train_figure(1300, 1000).items() if k != "fp32_tokens_per_s"}
    zero = {**train_figure(1300, 1000), "fp32_tokens_per_s": 0}
    text = {**train_figure(1300, 1000), "bf16_valid_ppl": "low"}
    return [
        (json.dumps({chip: {"train_bf16": without_key}}).encode(), "no 'fp32_tokens_per_s'"),
        (json.dumps({chip: {"train_bf16": zero}}).encode(), "fp32_tokens_per_s: 0, which"),
        (json.dumps({chip: {"train_bf16": text}}).encode(), "bf16_valid_ppl: 'low' is not"),
        (json.dumps({chip: 5}).encode(), f"{chip}: not an object of figures by setting"),
        (json.dumps({chip: {"train_bf16": 5}}).encode(), "train_bf16: not an object of figures"),
        (b'{"\xff": {}}', "not a table of measured figures: not UTF-8"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_a_table_of_the_wrong_shape_is_one_line_naming_the_file_and_key(
    case, tmp_path, monkeypatch
):
    """What train (``amp: auto``) and translate (``--precision auto``) ask a table: a missing
    figure, a zero divided by, a string, an int for an object or bytes that are not UTF-8 are
    a ``UserError`` naming the file, not a KeyError, ZeroDivisionError or AttributeError."""
    monkeypatch.setenv(hardware.ASSUME_BF16, "native")
    chip = hardware.bf16_support(CPU).chip
    content, error = _broken_tables(chip)[case]
    mine = tmp_path / "mine.json"
    mine.write_bytes(content)
    monkeypatch.setenv(measured.USER_TABLE, str(mine))
    with pytest.raises(UserError, match=f"^{re.escape(str(mine))}: .*{re.escape(error)}"):
        resolve_amp("auto", CPU)


def test_a_decode_figure_of_the_wrong_shape_is_named_when_translate_chooses(tmp_path, monkeypatch):
    monkeypatch.setenv(hardware.ASSUME_BF16, "native")
    chip = hardware.bf16_support(CPU).chip
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({chip: {"decode_bf16": {**decode_figure(), "outputs": 0}}}))
    monkeypatch.setenv(measured.USER_TABLE, str(mine))
    with pytest.raises(UserError, match=re.escape(f"{mine}: {chip}.decode_bf16.outputs: 0")):
        choose_precision("auto", "cpu")


@pytest.mark.parametrize(
    ("option", "value"),
    [("--warm", "-1"), ("--warm", "0"), ("--updates", "0"), ("--threads", "0")],
)
def test_measure_refuses_a_count_below_one_before_it_trains(option, value, tmp_path, capsys):
    """--warm -1 used to train every run and then stop on StopIteration; --updates 0 and
    --threads 0 silently meant the defaults."""
    data = tmp_path / "never-prepared"
    with pytest.raises(SystemExit) as stop:
        main(["measure", "compile", "--data", str(data), option, value])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and not data.exists()
    assert f"argument {option}: must be a positive number, not {value}" in err.splitlines()[-1]
