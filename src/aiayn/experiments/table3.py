"""Table 3 in miniature: every variation of the paper's base model, applied to a small base.

    aiayn experiment table3                          # demo preset, 1000 updates per row
    aiayn experiment table3 --budget updates=2000    # closer to convergence, twice the time

The base is the ``demo`` preset (3+3 layers, d_model 256, d_ff 1024, h 4, d_k 64) with the
paper's dropout 0.1 and label smoothing 0.1, trained with the demo's batches and schedule.
Each row makes the paper's *change* to it, scaled where the paper's value is absolute: heads
x1/8 (1 head), x1/2, x2, x4 with d_k = d_v = d_model / h; d_k / 4 and / 2 with d_v fixed; N
x1/3, x2/3, x4/3; d_model and d_ff halved and doubled; P_drop and eps_ls 0 and 0.2; learned
positions; and a "big" with d_model, d_ff and h doubled and P_drop 0.3. Every row trains the
same number of updates (so does the paper, except big's 300K), and is scored without
checkpoint averaging: dev perplexity per subword and SacreBLEU on the first ``sentences``
validation sentences. The table puts ours beside the paper's and says, for each row, whether
the change moves perplexity and BLEU the same way (better or worse than base) as in the paper.

One row is not the paper's: ``base-seed2``, the base again with another seed (initialisation
and batch order). A single run per row, as in the paper, cannot tell a change from luck; the
two bases' difference is the noise floor, and a row closer to base than that counts as "same".
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

from ..config import PRESETS, ModelConfig
from .inputs import Corpus
from .runner import Budget, Experiment
from .tables import markdown_table
from .training import training_experiment, variant_rows

# The paper's Table 3 (newstest2013): dev perplexity per word-piece and BLEU, per row.
PAPER: dict[str, tuple[float, float]] = {
    "base": (4.92, 25.8),
    "A-h1": (5.29, 24.9),
    "A-h4": (5.00, 25.5),
    "A-h16": (4.91, 25.8),
    "A-h32": (5.01, 25.4),
    "B-dk16": (5.16, 25.1),
    "B-dk32": (5.01, 25.4),
    "C-N2": (6.11, 23.7),
    "C-N4": (5.19, 25.3),
    "C-N8": (4.88, 25.5),
    "C-d256": (5.75, 24.5),
    "C-d1024": (4.66, 26.0),
    "C-dff1024": (5.12, 25.4),
    "C-dff4096": (4.75, 26.2),
    "D-drop0.0": (5.77, 24.6),
    "D-drop0.2": (4.95, 25.5),
    "D-ls0.0": (4.67, 25.3),
    "D-ls0.2": (5.47, 25.7),
    "E-learned": (4.92, 25.7),
    "big": (4.33, 26.4),
}
PAPER_BASE = ModelConfig.preset("base")
SEED_ROW = "base-seed2"  # the base with another seed: how far apart two runs of one model land


def changes(base: ModelConfig) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Row name -> (model overrides, training overrides): the paper's change, scaled to ``base``."""
    d, h, N, dk = base.d_model, base.h, base.N_enc, base.resolved_d_k

    def heads(n: int) -> dict[str, Any]:
        return {"h": n, "d_k": d // n, "d_v": d // n}

    def layers(paper_n: int) -> dict[str, Any]:
        n = max(1, round(N * paper_n / PAPER_BASE.N_enc))
        return {"N_enc": n, "N_dec": n}

    return {
        "base": ({}, {}),
        "A-h1": (heads(1), {}),
        "A-h4": (heads(max(1, h // 2)), {}),
        "A-h16": (heads(2 * h), {}),
        "A-h32": (heads(4 * h), {}),
        "B-dk16": ({"d_k": max(1, dk // 4), "d_v": base.resolved_d_v}, {}),
        "B-dk32": ({"d_k": dk // 2, "d_v": base.resolved_d_v}, {}),
        "C-N2": (layers(2), {}),
        "C-N4": (layers(4), {}),
        "C-N8": (layers(8), {}),
        "C-d256": ({"d_model": d // 2, "d_k": d // 2 // h, "d_v": d // 2 // h}, {}),
        "C-d1024": ({"d_model": 2 * d, "d_k": 2 * d // h, "d_v": 2 * d // h}, {}),
        "C-dff1024": ({"d_ff": base.d_ff // 2}, {}),
        "C-dff4096": ({"d_ff": 2 * base.d_ff}, {}),
        "D-drop0.0": ({"P_drop": 0.0}, {}),
        "D-drop0.2": ({"P_drop": 0.2}, {}),
        "D-ls0.0": ({}, {"eps_ls": 0.0}),
        "D-ls0.2": ({}, {"eps_ls": 0.2}),
        "E-learned": ({"positional": "learned"}, {}),
        "big": ({"d_model": 2 * d, "d_ff": 2 * base.d_ff, "h": 2 * h, "P_drop": 0.3}, {}),
    }


def _describe(changed: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in changed.items()) or "-"


def plan(budget: Budget, out: Path, corpus: Corpus) -> Experiment:
    # Every row gets the paper's base dropout 0.1 (the demo trains without): row D varies it.
    base = ModelConfig.preset(budget.preset)
    paper_rows = changes(base)
    rows = {"base": paper_rows.pop("base"), SEED_ROW: ({}, {"seed": 2}), **paper_rows}
    variants = {name: ({"P_drop": 0.1, **model}, train) for name, (model, train) in rows.items()}
    variants = distinct(base, variants, budget.preset)
    return training_experiment(
        "table3",
        variant_rows(out, budget, corpus, variants),
        corpus=corpus,
        report=report,
        plot=plot,
    )


def distinct(
    base: ModelConfig, variants: dict[str, tuple[dict[str, Any], dict[str, Any]]], preset: str
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """``variants`` without the rows that scaling to ``base`` made another row's configuration
    (with ``preset=tiny``, C-N2 and C-N4 both give 1 layer, the base's): each is left out with
    a warning naming the row it equals, rather than reported as a second result."""
    kept: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    seen: dict[tuple[str, str], str] = {}
    for name, (model, train) in variants.items():
        cfg = dataclasses.replace(base, **model)
        resolved = dataclasses.replace(cfg, d_k=cfg.resolved_d_k, d_v=cfg.resolved_d_v)
        key = (repr(resolved), repr(sorted(train.items())))
        if key in seen:
            warnings.warn(
                f"table3: row {name} is the configuration of row {seen[key]} at preset "
                f"{preset} ({_describe(model)}); left out",
                stacklevel=2,
            )
            continue
        seen[key] = name
        kept[name] = (model, train)
    return kept


def paper_change(name: str) -> str:
    if name == SEED_ROW:
        return "(not in the paper: base, another seed)"
    if name == "big":  # its preset also lists what it shares with base
        return "d_model=1024 d_ff=4096 h=16 P_drop=0.3, 300K steps"
    return _describe({**PRESETS[name].fields, **PRESETS[name].train})


def direction(
    ours: float,
    base: float,
    paper: float,
    paper_base: float,
    lower_is_better: bool,
    noise: float = 0.0,
) -> str:
    """'worse/worse ✓': how the change moved the metric against base, ours/paper, and whether
    the directions agree. Ours within ``noise`` of base (the two seeds' difference) is "same",
    and so is a paper row equal to its base; "same" on either side has nothing to match."""

    def word(delta: float, noise: float) -> str:
        if abs(delta) <= noise:
            return "same"
        return "better" if (delta < 0) == lower_is_better else "worse"

    a, b = word(ours - base, noise), word(paper - paper_base, 0.0)
    if a == "same":
        return f"same/{b}"
    if b == "same":
        return f"{a}/same"
    return f"{a}/{b} {'✓' if a == b else '✗'}"


def noise(rows: list[dict[str, Any]], key: str) -> float:
    """How far the two seeds of the base landed apart in ``key`` (0 until both are measured)."""
    found = {r["name"]: r[key] for r in rows if r["name"] in ("base", SEED_ROW)}
    return abs(found["base"] - found[SEED_ROW]) if len(found) == 2 else 0.0


COLUMNS = [
    "row",
    "paper change",
    "our change",
    "params (M)",
    "paper params (M)",
    "PPL",
    "paper PPL",
    "BLEU",
    "paper BLEU",
    "PPL vs base (ours/paper)",
    "BLEU vs base (ours/paper)",
    "tokens/s",
]


def _cells(r: dict[str, Any]) -> list[Any]:
    """A row's cells up to the paper's BLEU: what changed, its size, ours and the paper's."""
    paper_ppl, paper_bleu = PAPER.get(r["name"], (None, None))
    return [
        r["name"],
        paper_change(r["name"]),
        _describe({k: v for k, v in r["variant"].items() if k != "P_drop" or v != 0.1}),
        r["params"] / 1e6,
        PRESETS[r["name"]].paper_params_m if r["name"] in PAPER else None,
        r["valid_ppl"],
        paper_ppl,
        r["bleu"],
        paper_bleu,
    ]


def report(rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["name"] == "base"), None)
    if base is None:
        return "base row not measured yet: no directions."
    ppl_noise, bleu_noise = noise(rows, "valid_ppl"), noise(rows, "bleu")
    pb_ppl, pb_bleu = PAPER["base"]
    paper_rows = [r for r in rows if r["name"] in PAPER]

    def verdicts(r: dict[str, Any]) -> tuple[str, str]:
        if r["name"] not in PAPER:
            return "-", "-"
        return (
            direction(
                r["valid_ppl"], base["valid_ppl"], PAPER[r["name"]][0], pb_ppl, True, ppl_noise
            ),
            direction(r["bleu"], base["bleu"], PAPER[r["name"]][1], pb_bleu, False, bleu_noise),
        )

    table = markdown_table(COLUMNS, [[*_cells(r), *verdicts(r), r["tokens_per_s"]] for r in rows])
    ppl = [verdicts(r)[0] for r in paper_rows if r is not base]
    agree, against = sum(v.endswith("✓") for v in ppl), sum(v.endswith("✗") for v in ppl)
    within = sum(v.startswith("same/") and not v.endswith("/same") for v in ppl)
    seeds = (
        f"The two seeds of the base differ by {ppl_noise:.2f} in perplexity and {bleu_noise:.2f} BLEU: "
        'a row closer to base than that is "same". '
        if ppl_noise
        else f"The {SEED_ROW} row is not measured yet: every difference counts, however small. "
    )
    return (
        table
        + f"\n\n{seeds}Of the rows whose paper perplexity differs from its base, ours moves the "
        f"paper's way in {agree}, the other way in {against}, and by less than the seed noise in {within}. "
        "PPL: dev perplexity per subword of the last checkpoint (no averaging); "
        "BLEU: SacreBLEU, beam 4, on the first validation sentences."
    )


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """Relative change against base, ours against the paper's: agreement is the two odd quadrants."""
    from ..analysis.plots import plt, save_figure

    base = next((r for r in rows if r["name"] == "base"), None)
    if base is None:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    fig.suptitle("each change against base: the paper's way = upper right or lower left")
    for ax, key, title in ((axes[0], "valid_ppl", "perplexity"), (axes[1], "bleu", "BLEU")):
        column = 0 if key == "valid_ppl" else 1
        spread = 100 * noise(rows, key) / base[key] if base[key] else 0.0
        ax.axhspan(-spread, spread, color="grey", alpha=0.2, label="within seed noise")
        for r in (r for r in rows if r["name"] in PAPER and r is not base):
            x = 100 * (PAPER[r["name"]][column] / PAPER["base"][column] - 1)
            y = 100 * (r[key] / base[key] - 1) if base[key] else 0.0
            ax.scatter(x, y, color="tab:blue")
            ax.annotate(r["name"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", lw=1)
        ax.axvline(0, color="grey", lw=1)
        ax.set(
            xlabel=f"paper: {title} change vs base (%)",
            ylabel=f"ours: {title} change vs base (%)",
            title=f"Table 3, {title}",
        )
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=7)
    return [save_figure(fig, out / "table3.png")]
