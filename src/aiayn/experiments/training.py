"""A training row: the demo's recipe with one change, a fixed number of updates, then the
dev perplexity (teacher-forced) and BLEU (beam 4) of the last checkpoint, unaveraged (as
Table 3 reports). Every training experiment builds its rows with ``train_row``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import checkpoint as ckpt
from ..config import ModelConfig
from ..data import Vocab
from ..decode import SearchRequest
from ..evaluate import evaluate_model
from ..runtime.flops import count_parameters, forward_flops
from ..runtime.ready import for_decoding
from ..train.config import recipe_config
from ..train.trainer import Trainer
from .inputs import Corpus
from .runner import Budget, Experiment, Row, repeat_name


def train_row(
    out: Path,
    corpus: Corpus,
    budget: Budget,
    model: dict[str, Any],
    train: dict[str, Any] | None = None,
    data: Path | None = None,
    bleu: bool = True,
    repeat: int = 0,
) -> dict[str, Any]:
    """Train ``budget.updates`` updates of the demo recipe with ``model``/``train`` overrides
    into ``out`` (resuming there if interrupted), and score the last checkpoint. ``repeat``:
    the recipe's seed plus this (``--seeds``), unless ``train`` sets the seed."""
    demo = recipe_config("demo", data=str(data or corpus.data), out=str(out))  # budget below
    seeded = {"seed": demo.seed + repeat} if repeat else {}
    cfg = dataclasses.replace(
        demo,
        preset=budget.preset,
        model={**demo.model, **model},
        max_src_tokens=budget.max_tokens,
        max_tgt_tokens=budget.max_tokens,
        max_updates=budget.updates,
        max_minutes=None,
        save_every_minutes=5.0,
        keep_last=1,
        num_threads=budget.threads,
        **{**seeded, **(train or {})},
    )
    summary = Trainer(cfg, device="cpu").run()
    model_cfg = cfg.model_config(vocab_size=len(Vocab.load(Path(cfg.data) / "spm.model")))
    result = {
        "params": count_parameters(model_cfg),
        "updates": summary["updates"],
        "train_s": summary["elapsed_s"],
        "tokens_per_s": summary["tokens_per_s"],
        "valid_ppl": summary["valid_ppl"],
        "model": dataclasses.asdict(model_cfg),
        "eps_ls": cfg.eps_ls,
        "seed": cfg.seed,
        "checkpoint": summary["checkpoint"],
    }
    if bleu:
        sources, references = corpus.valid_pairs(budget.sentences)
        start = time.monotonic()
        result["bleu"] = score(Path(summary["checkpoint"]), sources, references, corpus.lang)[
            "sacrebleu"
        ]
        result["decode_sent_per_s"] = len(sources) / (time.monotonic() - start)
    return result


def training_experiment(
    name: str,
    rows: list[Row],
    *,
    corpus: Corpus,
    report: Callable,
    plot: Callable,
    baseline: str | None = None,
) -> Experiment:
    """An experiment whose rows train models: their numbers depend on the same budget keys.
    ``baseline``: the row ``--seeds`` tests the others against (None: the first)."""
    return Experiment(
        name=name,
        rows=rows,
        report=report,
        plot=plot,
        budget_keys=("preset", "updates", "sentences", "max_tokens"),
        inputs=corpus.record(),
        baseline=baseline,
    )


def variant_rows(
    out: Path,
    budget: Budget,
    corpus: Corpus,
    variants: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    data: Path | None = None,
) -> list[Row]:
    """One training row per variant, name -> (model overrides, training overrides) on the demo
    recipe, each in ``out/rows/NAME``; the ETA weighs rows by their FLOPs per token. A row
    can be reseeded (``--seeds``) unless its overrides set the seed."""
    base = ModelConfig.preset(budget.preset)

    def runner(name: str, model: dict[str, Any], train: dict[str, Any], k: int = 0):
        where = out / "rows" / (repeat_name(name, k) if k else name)
        return lambda: {
            **train_row(where, corpus, budget, model, train, data=data, repeat=k),
            "variant": {**model, **train},
        }

    def reseed(name: str, model: dict[str, Any], train: dict[str, Any]):
        return None if "seed" in train else lambda k: runner(name, model, train, k)

    return [
        Row(
            name,
            runner(name, model, train),
            cost=forward_flops(ModelConfig.preset(budget.preset, **model), [30], [30])
            / forward_flops(base, [30], [30]),
            reseed=reseed(name, model, train),
        )
        for name, (model, train) in variants.items()
    ]


def score(checkpoint: Path, sources: list[str], references: list[str], lang: str) -> dict[str, Any]:
    """SacreBLEU (beam 4, alpha 0.6) and reference perplexity of ``checkpoint`` on the pairs."""
    model, vocab = ckpt.load_translator(checkpoint)
    model = for_decoding(model)  # fp32, packed for decoding
    return evaluate_model(model, vocab, sources, references, SearchRequest(), lang=lang).as_dict()
