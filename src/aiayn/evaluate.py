"""Evaluation as the paper reports it: translate a test set with beam search and score it with
SacreBLEU (detokenised, with its signature) and the paper's tokenised, compound-split BLEU,
plus the perplexity per subword of the references; beside them chrF and TER, and the 95%
bootstrap interval of each SacreBLEU metric (``aiayn.metrics.significance``: a score without
its interval cannot say whether another system's differs)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .checkpoint import checkpoint_files, load_translator
from .data.collate import pad_rows
from .data.pieces import AnyVocab
from .decode import SearchRequest, translate, translate_corpus
from .decode.engine import Engine, translate_with
from .decode.translate import check_sentences, eval_mode
from .errors import UserError
from .files import (
    check_not_input,
    check_output_file,
    read_lines,
)
from .metrics import paper_bleu, sacre_bleu
from .metrics.significance import MetricScore, significance
from .model import Transformer
from .runtime.kernels import use_fast_paths
from .train.loss import perplexity, teacher_forced


@dataclass
class Evaluation:
    sacrebleu: float
    signature: str
    paper_bleu: float
    ppl: float
    n: int
    hypotheses: list[str] = field(repr=False)
    decode_s: float = 0.0  # wall time of the beam search over all n sentences
    engine: str = "torch"  # what decoded: ours, or another engine (``decode.engine``)
    # sacrebleu's BLEU, chrF2 and TER (by those names) with their bootstrap intervals, and the
    # signatures they were computed with (resamples and seed included)
    metrics: dict[str, MetricScore] = field(default_factory=dict)
    metric_signatures: dict[str, str] = field(default_factory=dict)

    @property
    def sentences_per_s(self) -> float:
        return self.n / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "sacrebleu": self.sacrebleu,
            "signature": self.signature,
            "paper_bleu": self.paper_bleu,
            "ppl": self.ppl,
            "sentences": self.n,
            "decode_s": self.decode_s,
            "sentences_per_s": self.sentences_per_s,
            "engine": self.engine,
            "chrf": self.metrics["chrF2"].score if "chrF2" in self.metrics else None,
            "ter": self.metrics["TER"].score if "TER" in self.metrics else None,
            "intervals": {name: m.as_dict() for name, m in self.metrics.items()},
            "interval_signatures": self.metric_signatures,
        }


@torch.no_grad()
def reference_perplexity(
    model: Transformer,
    vocab: AnyVocab,
    sources: Sequence[str],
    references: Sequence[str],
    batch_size: int = 64,
) -> float:
    """exp(mean NLL per subword) of the references (eos included), teacher-forced, in eval
    mode (the model's mode is restored afterwards)."""
    with eval_mode(model):
        return _reference_perplexity(model, vocab, sources, references, batch_size=batch_size)


def _reference_perplexity(
    model: Transformer,
    vocab: AnyVocab,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    batch_size: int,
) -> float:
    device = next(model.parameters()).device
    nll_sum, tokens = 0.0, 0
    pairs = [
        (vocab.encode_source(s, model.cfg.max_len), vocab.encode_target(r, model.cfg.max_len))
        for s, r in zip(sources, references)
        if s.strip()
    ]
    pairs.sort(key=lambda p: len(p[0]))
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        refs = [r for _, r in chunk]
        src = pad_rows([s for s, _ in chunk], [], [], vocab.pad_id).to(device)
        tgt_in = pad_rows(refs, [vocab.bos_id], [], vocab.pad_id).to(device)
        tgt_out = pad_rows(refs, [], [vocab.eos_id], vocab.pad_id).to(device)
        _, nll, n = teacher_forced(model, src, tgt_in, tgt_out, vocab.pad_id, eps_ls=0.0)
        nll_sum, tokens = nll_sum + nll.item(), tokens + n
    return perplexity(nll_sum, tokens)


def perplexity_on(sources: Sequence[str], references: Sequence[str]) -> Callable[[Path], float]:
    """A checkpoint's perplexity on this test pair: the score ``averaging.average_last_best``
    chooses by (lower is better)."""

    def score(ckpt: Path) -> float:
        model, vocab = load_translator(ckpt)
        return reference_perplexity(use_fast_paths(model), vocab, sources, references)

    return score


def evaluate_model(
    model: Transformer,
    vocab: AnyVocab,
    sources: Sequence[str],
    references: Sequence[str],
    request: SearchRequest = SearchRequest(),
    lang: str = "de",
    progress: bool = False,
    engine: Engine | None = None,
) -> Evaluation:
    """Translate ``sources`` as ``aiayn translate --input`` does (``translate_corpus``: the
    same batches, so the same outputs) and score them against ``references``.

    ``engine``: what decodes (None: ``model``, our search); the perplexity is ``model``'s."""
    check_sentences(sources, "sources")
    check_sentences(references, "references")
    if len(sources) != len(references):
        raise UserError(f"{len(sources)} sources but {len(references)} references")
    start = time.perf_counter()
    decoder, outputs = (model, translate) if engine is None else (engine, translate_with)
    windows = translate_corpus(
        decoder, sources, vocab, request, progress=progress, total=len(sources), outputs=outputs
    )
    hyps = [hyp for window in windows for hyp in window]
    decode_s = time.perf_counter() - start
    name = "torch" if engine is None else engine.name
    return scored(model, vocab, sources, references, hyps, decode_s, lang=lang, engine=name)


def scored(
    model: Transformer,
    vocab: AnyVocab,
    sources: Sequence[str],
    references: Sequence[str],
    hyps: list[str],
    decode_s: float,
    *,
    lang: str,
    engine: str,
) -> Evaluation:
    """The ``Evaluation`` of hypotheses ``hyps`` (decoded in ``decode_s`` by ``engine``):
    their BLEU, chrF and TER with intervals, and ``model``'s perplexity of the references."""
    score, signature = sacre_bleu(hyps, [list(references)])
    intervals = significance([("test", hyps)], references)  # one system: its intervals
    return Evaluation(
        sacrebleu=score,
        signature=signature,
        paper_bleu=paper_bleu(hyps, [list(references)], lang=lang),
        ppl=reference_perplexity(model, vocab, sources, references),
        n=len(sources),
        hypotheses=hyps,
        decode_s=decode_s,
        engine=engine,
        metrics=intervals.scores[0],
        metric_signatures=intervals.signatures,
    )


def read_test_pair(
    src_path: str | Path, ref_path: str | Path, *, task: str = "evaluate"
) -> tuple[list[str], list[str]]:
    """The lines of a source file and of its references, refused unless they can be scored
    (``check_test_pair``; ``task`` names what would be done with them)."""
    sources, references = read_lines(src_path), read_lines(ref_path)
    check_test_pair(sources, references, str(src_path), str(ref_path), task=task)
    return sources, references


def check_test_pair(
    sources: Sequence[str],
    references: Sequence[str],
    src_name: str,
    ref_name: str,
    *,
    task: str = "evaluate",
) -> None:
    """The one check of sources and references before ``evaluate``, ``score`` and ``average
    --choose-on`` use them: refused when both are empty, there is no reference, the line
    counts differ (every score after the first missing line would compare the wrong
    sentences) or no source line has text (a perplexity of 1 over nothing). ``src_name`` and
    ``ref_name`` name them in errors (the same name: one file of pairs)."""
    if not sources and not references:
        empty = f"{src_name} is" if src_name == ref_name else f"{src_name} and {ref_name} are both"
        raise UserError(f"{empty} empty: nothing to {task}")
    if not references:
        raise UserError(
            f"the reference file {ref_name} is empty ({src_name} has {len(sources)} lines)"
        )
    if len(sources) != len(references):
        raise UserError(f"{src_name} has {len(sources)} lines but {ref_name} has {len(references)}")
    if not any(line.strip() for line in sources):
        where = f"source in {src_name}" if src_name == ref_name else f"line of {src_name}"
        raise UserError(f"no {where} has text: nothing to {task}")


def read_evaluation_inputs(
    src_path: str | Path,
    ref_path: str | Path,
    hyp_path: str | Path | None,
    checkpoint: str | Path | Sequence[str | Path],
) -> tuple[list[str], list[str]]:
    """The test pair, once every input is checked, before the model loads and decodes: an
    output path that cannot be written or that is one of the inputs (``checkpoint``'s files
    included), empty files and misaligned files fail at once, not after hours of beam search."""
    if hyp_path is not None:
        check_output_file(hyp_path)
        given = [checkpoint] if isinstance(checkpoint, (str, Path)) else list(checkpoint)
        inputs = [src_path, ref_path, *(f for c in given for f in checkpoint_files(Path(c)))]
        check_not_input(hyp_path, inputs, option="--output")
    return read_test_pair(src_path, ref_path)
