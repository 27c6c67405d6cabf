"""The model side of the server: a checkpoint's Transformer and vocabulary, turned into JSON.

Everything here runs on the batcher's worker thread (``decode``) or touches no model state
(``encode``, ``info``), so the model is only ever used by one thread at a time. The library
does the work: ``load_transformer`` reads the checkpoint, ``Vocab.encode_source`` makes the source
ids, ``decode_ids`` searches, and ``Transformer.attention_weights`` (the path behind the demo's
attention pictures) gives the encoder-decoder attention of the best hypothesis.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import load_translator, read_meta
from ..data import Vocab
from ..decode import DecodeConfig, Hypothesis, decode_ids, for_decoding
from ..errors import UserError
from ..model import Transformer, count_parameters

DECODE_MAX_TOKENS = 8000  # padded source tokens per forward pass, as ``aiayn translate``
ENC_DEC = "encoder-decoder attention"


@dataclass(frozen=True)
class TranslateJob:
    """One request: source ids per sentence (``[]`` for a blank one), how to decode them, and
    whether to return the attention of each best hypothesis."""

    sources: list[list[int]]
    config: DecodeConfig
    attention: bool = False

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sources)


class Translator:
    """A Transformer and its vocabulary, answering ``TranslateJob``s with JSON-ready dicts."""

    def __init__(
        self,
        model: Transformer,
        vocab: Vocab,
        checkpoint: str | Path | None = None,
        meta: dict[str, Any] | None = None,
        quantized: str | None = None,
    ) -> None:
        if len(vocab) != model.cfg.vocab_size:
            raise UserError(
                f"vocabulary {vocab.path} has {len(vocab)} pieces, the model {model.cfg.vocab_size}"
            )
        self.model, self.vocab = model.eval(), vocab
        self.checkpoint, self.meta, self.quantized = checkpoint, meta or {}, quantized

    @classmethod
    def load(
        cls, checkpoint: str | Path, device: str = "cpu", quantize: str | None = None
    ) -> Translator:
        """The checkpoint directory's model (``quantize``: None or "int8", as ``aiayn translate
        --quantize``) and its own ``spm.model``."""
        model, vocab = load_translator(checkpoint, device)
        return cls(
            for_decoding(model, quantize),
            vocab,
            checkpoint,
            read_meta(Path(checkpoint)),
            quantized=quantize,
        )

    @property
    def max_source_tokens(self) -> int:
        return self.model.cfg.max_len

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [self.vocab.encode_source(line) for line in lines]

    def decode(self, jobs: list[TranslateJob]) -> list[list[dict[str, Any]]]:
        """Jobs that share one ``DecodeConfig`` -> per job, per sentence, its translation.

        All sentences of all jobs go to one ``decode_ids`` call, which sorts them by length
        into batches; the answers are split back per job in input order.
        """
        config = jobs[0].config
        if any(job.config != config for job in jobs):
            raise ValueError("jobs decoded together must share one DecodeConfig")
        sources = [s for job in jobs for s in job.sources]
        v = self.vocab
        nbest = decode_ids(
            self.model,
            sources,
            config,
            max_tokens=DECODE_MAX_TOKENS,
            pad_id=v.pad_id,
            bos_id=v.bos_id,
            eos_id=v.eos_id,
        )
        answers, start = [], 0
        for job in jobs:
            answers.append(
                [
                    self._answer(src, hyps, job.attention)
                    for src, hyps in zip(job.sources, nbest[start : start + len(job.sources)])
                ]
            )
            start += len(job.sources)
        return answers

    def _answer(self, source: list[int], hyps: list[Hypothesis], attention: bool) -> dict[str, Any]:
        best = hyps[0] if hyps else None
        answer: dict[str, Any] = {
            "text": self.vocab.decode(best.tokens) if best else "",
            "score": best.score if best else None,
            "nbest": [
                {"text": self.vocab.decode(h.tokens), "score": h.score, "log_prob": h.log_prob}
                for h in hyps
            ],
        }
        if attention:
            answer["attention"] = self.attention(source, best) if best else None
        return answer

    def attention(self, source: list[int], hyp: Hypothesis) -> dict[str, Any]:
        """Encoder-decoder attention of one hypothesis, teacher-forced (Figures 3-5).

        ``weights[layer][head][t][s]``: how much output position t (the token in ``target[t]``
        it produced, eos included when the hypothesis ended with one) attended to
        ``source[s]``. Rounded to 4 decimals: the page draws colours, not digits.
        """
        ended = hyp.length > len(hyp.tokens)  # finished with eos rather than at the length limit
        produced = hyp.tokens + [self.vocab.eos_id] if ended else hyp.tokens
        tgt_in = [self.vocab.bos_id] + produced[:-1]  # (T,) the decoder input that produced them
        device = next(self.model.parameters()).device
        weights = self.model.attention_weights(
            torch.tensor([source], device=device), torch.tensor([tgt_in], device=device)
        )[ENC_DEC]  # N_dec x (h, T, S)
        return {
            "source": [self.vocab.id_to_piece(i) for i in source],
            "target": [self.vocab.id_to_piece(i) for i in produced],
            "weights": [layer.float().cpu().round(decimals=4).tolist() for layer in weights],
        }

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` reports: model config, vocabulary, checkpoint, parameters."""
        cfg = self.model.cfg
        return {
            "checkpoint": str(self.checkpoint) if self.checkpoint is not None else None,
            "update": self.meta.get("update"),
            "averaged_from": self.meta.get("averaged_from"),
            "model_config": dataclasses.asdict(cfg),
            "parameters": count_parameters(cfg),
            "vocabulary": {
                "path": str(self.vocab.path),
                "size": len(self.vocab),
                "fingerprint": self.vocab.fingerprint,
            },
            "device": str(next(self.model.parameters()).device),
            "quantized": self.quantized,
        }
