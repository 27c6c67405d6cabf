"""N-best lists as the commands print them: text, scores and, on request, the log-probability
of every token, in two formats.

    sentence-id ||| text ||| score ||| log-prob       (Moses/fairseq n-best lines)
    {"id": 0, "hypotheses": [{"text": ..., "score": ..., "log_prob": ..., "length": ...}]}

``sentence-id`` counts input lines from 0; ``score`` is the GNMT score the search ranks by,
``log_prob / lp(|Y|)``, and ``log-prob`` is log P(Y|X) (eos included when the output has one:
an output the length limit stopped has none, and its JSON hypothesis says ``"cut": true``).
An empty input line has no hypotheses: no n-best line, and ``"hypotheses": []``. Token
log-probabilities come from forced decoding of each output (``score``), the search's own
numbers recomputed, so they sum to its log-prob. With word alignments (``align``) an n-best
line gets a fifth field, `` ||| 0-0 1-2 ...``, and a JSON hypothesis an ``"alignment"``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .align import output_alignment
from .beam import Hypothesis
from .request import SearchRequest
from .score import score_ids
from .translate import (
    OnTruncate,
    Progress,
    Tokenizer,
    check_sentences,
    decode_ids,
    eval_mode,
    fit_sources,
    positions,
)


@dataclass
class Output:
    """One hypothesis for printing; ``tokens``: (piece, log P) per output token, eos included."""

    text: str
    score: float
    log_prob: float
    length: int
    tokens: list[tuple[str, float]] | None = None
    alignment: str | None = None  # Pharaoh pairs "i-j ..." (``align``)
    ids: list[int] | None = None  # the output's token ids, eos left out (not printed)
    cut: bool = False  # stopped by the length limit, without eos: its log-prob has none
    terms: tuple[tuple[str, str], ...] | None = None  # the glossary's (source, target) applied

    @classmethod
    def of(cls, hyp: Hypothesis, text: str, **extra: Any) -> Output:
        cut = is_cut(hyp)
        return cls(text, hyp.score, hyp.log_prob, hyp.length, cut=cut, ids=hyp.tokens, **extra)

    def moses(self, sentence_id: int) -> str:
        line = f"{sentence_id} ||| {self.text} ||| {self.score:.6f} ||| {self.log_prob:.6f}"
        return line if self.alignment is None else f"{line} ||| {self.alignment}"

    def record(self) -> dict[str, Any]:
        fields = {"text": self.text, "score": self.score, "log_prob": self.log_prob}
        fields["length"] = self.length
        if self.tokens is not None:
            fields["tokens"] = [[piece, lp] for piece, lp in self.tokens]
        if self.alignment is not None:
            fields["alignment"] = self.alignment
        if self.cut:
            fields["cut"] = True
        return fields


def is_cut(hyp: Hypothesis) -> bool:
    """Whether the length limit stopped ``hyp``: no eos was chosen (its length counts every
    token), so its log-prob has none."""
    return hyp.length == len(hyp.tokens)


def jsonl_line(sentence_id: int, outputs: Sequence[Output]) -> str:
    """One input line's hypotheses as a JSON line."""
    record: dict[str, Any] = {"id": sentence_id}
    if outputs and outputs[0].terms is not None:  # the source's, so the line's
        record["glossary"] = [list(pair) for pair in outputs[0].terms]
    record["hypotheses"] = [o.record() for o in outputs]
    return json.dumps(record, ensure_ascii=False)


def output_ids(hyp: Hypothesis, eos_id: int) -> list[int]:
    """The ids the model produced for ``hyp``: its tokens, and eos when it ended with one."""
    return hyp.tokens + [eos_id] * (hyp.length - len(hyp.tokens))


def nbest_outputs(
    model: Any,
    lines: Sequence[str],
    tokenizer: Tokenizer,
    request: SearchRequest = SearchRequest(),
    *,
    token_scores: bool = False,
    alignment_layer: int | None = None,
    progress: bool | Progress = False,
    on_truncate: OnTruncate | None = None,
) -> list[list[Output]]:
    """Sentences -> their n-best ``Output`` lists, in input order (``[]`` for a blank line).

    ``alignment_layer``: word alignments from that decoder layer's attention (``align``; a
    Transformer or an Ensemble of them); None: none. ``token_scores`` and alignments need
    ``tokenizer.id_to_piece``. ``progress`` and ``on_truncate`` are ``decode_ids``'s.
    """
    check_sentences(lines, "lines")
    request = request.with_ids(tokenizer)
    cap = positions(model, request.max_src_len)  # cut once: forced decoding reads them too
    sources = fit_sources(
        [tokenizer.encode_source(s) for s in lines], cap, request.ids.eos_id, on_truncate
    )
    with eval_mode(model):
        nbest = decode_ids(model, sources, request, progress=progress)
        tokens = _token_log_probs(model, sources, nbest, tokenizer, request) if token_scores else {}

    def output(i: int, j: int, h: Hypothesis) -> Output:
        alignment = None
        if alignment_layer is not None:
            alignment = output_alignment(model, sources[i], h.tokens, tokenizer, alignment_layer)
        return Output.of(
            h, tokenizer.decode(h.tokens), tokens=tokens.get((i, j)), alignment=alignment
        )

    return [[output(i, j, h) for j, h in enumerate(hyps)] for i, hyps in enumerate(nbest)]


def _token_log_probs(
    model: Any,
    sources: Sequence[Sequence[int]],
    nbest: Sequence[Sequence[Hypothesis]],
    tokenizer: Any,
    request: SearchRequest,
) -> dict[tuple[int, int], list[tuple[str, float]]]:
    """(sentence, rank) -> (piece, log P) per token of that hypothesis, by forced decoding."""
    keys = [(i, j) for i, hyps in enumerate(nbest) for j in range(len(hyps))]
    targets = [output_ids(nbest[i][j], request.ids.eos_id) for i, j in keys]
    scores = score_ids(
        model,
        [sources[i] for i, _ in keys],
        targets,
        alpha=request.decode.alpha,
        batching=request.batching,
        ids=request.ids,
    )
    return {
        key: [(tokenizer.id_to_piece(t), lp) for t, lp in zip(target, score.token_log_probs)]
        for key, target, score in zip(keys, targets, scores)
        if score is not None
    }
