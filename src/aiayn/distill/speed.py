"""How fast and how good each model decodes in each form a CPU deployment uses: fp32 or int8
weights (``--quantize int8``), with or without the vocabulary shortlist (``--shortlist``), on
one thread and on two (``--threads``, with ``--workers auto``: a decoding process a thread, as
``aiayn evaluate`` decodes by default). Each form decodes the same first sentences of the test
split, its model already loaded, and is timed from the first sentence to the last.

A shortlist restricts one model's output layer, so an ensemble teacher has no shortlisted
form (``decode.shortlist``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from sacrebleu.metrics import CHRF
from safetensors import safe_open

from ..checkpoint import WEIGHTS
from ..metrics import sacre_bleu
from ..translator import Translator

# (form, --quantize, with the shortlist)
FORMS = (
    ("fp32", None, False),
    ("fp32 + shortlist", None, True),
    ("int8", "int8", False),
    ("int8 + shortlist", "int8", True),
)
THREADS = (1, 2)


@dataclass(frozen=True)
class Timed:
    """One model in one form on ``threads``: sentences decoded, seconds, and their SacreBLEU
    and chrF2 against the references."""

    model: str
    form: str
    threads: int
    sentences: int
    seconds: float
    bleu: float
    chrf: float

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sentences_per_s": self.sentences_per_s}


def decode_timed(
    checkpoints: Sequence[Path],
    sources: Sequence[str],
    *,
    quantize: str | None = None,
    shortlist: Path | None = None,
    threads: int = 1,
) -> tuple[list[str], float]:
    """The best translation of each source by ``checkpoints`` in this form on ``threads``,
    and the seconds the search took (loading and quantizing the model not counted)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with Translator(list(checkpoints), quantize=quantize, workers="auto") as translator:
            request = translator.request(shortlist=shortlist)
            assert translator.engine is not None  # loaded (and quantized) before the clock
            start = time.perf_counter()
            hyps = [t.text for t in translator.translate(list(sources), request)]
            return hyps, time.perf_counter() - start
    finally:
        torch.set_num_threads(before)


def speed_grid(
    models: dict[str, Sequence[Path]],
    sources: Sequence[str],
    references: Sequence[str],
    shortlist: Path,
    threads: Sequence[int] = THREADS,
) -> list[Timed]:
    """Every model of ``models`` (name -> its checkpoints) in every form of ``FORMS`` on each
    of ``threads``; an ensemble has no shortlisted form."""
    found = []
    for name, checkpoints in models.items():
        for form, quantize, listed in FORMS:
            if listed and len(checkpoints) > 1:
                continue
            for n in threads:
                hyps, seconds = decode_timed(
                    checkpoints,
                    sources,
                    quantize=quantize,
                    shortlist=shortlist if listed else None,
                    threads=n,
                )
                bleu = sacre_bleu(hyps, [list(references)])[0]
                chrf = CHRF().corpus_score(hyps, [list(references)]).score
                found.append(Timed(name, form, n, len(sources), seconds, bleu, chrf))
    return found


def size_on_disk(checkpoints: Sequence[Path]) -> tuple[int, int]:
    """(bytes of the weights files, parameters stored in them) of ``checkpoints``."""
    size = params = 0
    for ckpt in checkpoints:
        path = Path(ckpt) / WEIGHTS
        size += path.stat().st_size
        with safe_open(str(path), framework="pt") as weights:
            for key in weights.keys():
                shape = weights.get_slice(key).get_shape()
                params += int(torch.Size(shape).numel())
    return size, params
