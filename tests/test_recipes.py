"""The bundled WMT14 recipes against the paper: every Transformer row of Table 2 is a recipe,
and each recipe, resolved as `aiayn train NAME` resolves it, holds that row's settings; the
commands and figures at its top (prepare, average, evaluate; expected BLEU, cost) are the row's.

The table below is written from ../shared/PAPER.md (sections 2-4), not read from the code."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import pytest

from aiayn.cli.decoding import decode_config
from aiayn.cli.main import build_parser
from aiayn.train import load_train_config
from aiayn.train.config import bundled_configs


@dataclass(frozen=True)
class Row:
    """One Transformer row of Table 2 with the settings sections 5 and 6.1 give it."""

    target: str  # the target language (source: English)
    vocab: int  # shared vocabulary: 37k BPE (EN-DE), 32k word-pieces (EN-FR)
    d_model: int
    d_ff: int
    h: int
    P_drop: float
    updates: int
    averaged: int  # last checkpoints averaged
    bleu: float  # newstest2014, Table 2
    hours: float  # wall clock on 8 P100s (section 5.2)
    step_s: float  # seconds per update on them
    cost_flops: str  # Table 2's training-cost column, as printed


PAPER_TABLE2 = {
    "wmt14-base": Row("de", 37000, 512, 2048, 8, 0.1, 100_000, 5, 27.3, 12, 0.4, "3.3e18"),
    "wmt14-big": Row("de", 37000, 1024, 4096, 16, 0.3, 300_000, 20, 28.4, 84, 1.0, "2.3e19"),
    "wmt14-enfr-base": Row("fr", 32000, 512, 2048, 8, 0.1, 100_000, 5, 38.1, 12, 0.4, "3.3e18"),
    "wmt14-enfr-big": Row("fr", 32000, 1024, 4096, 16, 0.1, 300_000, 20, 41.8, 84, 1.0, "2.3e19"),
}
# What every row shares: N = 6, d_k = d_v = d_model / h, eps_ls 0.1, Adam(0.9, 0.98, 1e-9),
# warm-up 4000, ~25,000 tokens per side per update, checkpoints every 10 minutes, 8 P100s of
# 9.5 TFLOPS; beam 4, alpha 0.6, at most input length + 50.
N, EPS_LS, ADAM, WARMUP, TOKENS, SAVE_MINUTES = 6, 0.1, (0.9, 0.98, 1e-9), 4000, 25_000, 10
GPUS, P100_FLOPS = 8, 9.5e12
BEAM, ALPHA, MAX_LEN_A, MAX_LEN_B = 4, 0.6, 1.0, 50
PAIR = {"de": "de-en", "fr": "fr-en"}


def header(name: str) -> str:
    """The comment block at the top of recipe ``name``."""
    lines = bundled_configs()[name].read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines[: next(i for i, x in enumerate(lines) if x[:1] != "#")])


def command(name: str, label: str):
    """The ``aiayn`` command on the header line ``# {label}:``, parsed by the real CLI."""
    (line,) = re.findall(rf"^# {label}:\s+aiayn (.*)$", header(name), re.M)
    return build_parser().parse_args(shlex.split(line))


def test_every_transformer_row_of_table_2_is_a_bundled_recipe_and_no_other_wmt14_one():
    assert sorted(n for n in bundled_configs() if n.startswith("wmt14")) == sorted(PAPER_TABLE2)


@pytest.mark.parametrize("name", sorted(PAPER_TABLE2))
def test_a_resolved_recipe_holds_its_rows_settings(name):
    row = PAPER_TABLE2[name]
    cfg = load_train_config(name)
    model = cfg.model_config(vocab_size=row.vocab)
    d_k = row.d_model // row.h
    assert (model.N_enc, model.N_dec, model.d_model, model.d_ff, model.h) == (
        N,
        N,
        row.d_model,
        row.d_ff,
        row.h,
    )
    assert (model.resolved_d_k, model.resolved_d_v, model.P_drop) == (d_k, d_k, row.P_drop)
    assert (model.norm, model.positional, model.share_embeddings) == ("post", "sinusoidal", True)
    assert (cfg.max_updates, cfg.keep_last, cfg.save_every_minutes) == (
        row.updates,
        row.averaged,
        SAVE_MINUTES,
    )
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps) == ADAM
    assert (cfg.warmup, cfg.lr_scale, cfg.eps_ls, cfg.tokens_per_update) == (
        WARMUP,
        1.0,
        EPS_LS,
        TOKENS,
    )
    assert (cfg.max_minutes, cfg.save_every_updates, cfg.valid_beam) == (None, None, None)
    assert cfg.valid_bleu_lang == row.target


@pytest.mark.parametrize("name", sorted(PAPER_TABLE2))
def test_a_recipes_commands_prepare_its_data_average_its_rows_checkpoints_and_decode_as_6_1(
    name,
):
    row, cfg = PAPER_TABLE2[name], load_train_config(name)
    prepare = command(name, "Prepare")
    assert (prepare.wmt14, prepare.out, prepare.vocab_size) == (
        PAIR[row.target],
        cfg.data,
        row.vocab,
    )
    average = command(name, "Average")
    assert (average.checkpoints, average.last, average.out) == (
        f"{cfg.out}/checkpoints",
        row.averaged,
        f"{cfg.out}/averaged",
    )
    evaluate = command(name, "Evaluate")
    assert (evaluate.checkpoint, evaluate.lang) == (average.out, row.target)
    assert (evaluate.src, evaluate.ref) == (
        f"{cfg.data}/raw/test.en",
        f"{cfg.data}/raw/test.{row.target}",
    )
    decode = decode_config(evaluate)
    assert (decode.beam, decode.alpha, decode.max_len_a, decode.max_len_b) == (
        BEAM,
        ALPHA,
        MAX_LEN_A,
        MAX_LEN_B,
    )
    for train in re.findall(r"aiayn train (\S+)", header(name)):
        assert train == name


@pytest.mark.parametrize("name", sorted(PAPER_TABLE2))
def test_a_recipe_states_its_rows_bleu_and_cost_at_its_top(name):
    row, top = PAPER_TABLE2[name], header(name)
    assert re.search(rf"^# Expected: {row.bleu} BLEU on newstest2014", top, re.M)
    # the paper's hours are its steps at its step time, rounded up (11.1 h -> 12, 83.3 -> 84)
    assert row.updates * row.step_s / 3600 == pytest.approx(row.hours, rel=0.1)
    # Table 2's cost column is wall clock x GPUs x 9.5 TFLOPS
    assert f"{row.hours * 3600 * GPUS * P100_FLOPS:.1e}".replace("+", "") == row.cost_flops
    gpu_hours = f"{row.hours * GPUS:,.0f} P100-hours ({row.cost_flops} FLOPs"
    step = f"{row.updates:,} updates at {row.step_s} s on {GPUS} P100s"
    assert step in top and gpu_hours in " ".join(top.replace("#", " ").split())
