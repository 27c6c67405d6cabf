"""The server's one adapter: an ``aiayn.Translator`` (loaded as ``aiayn translate`` loads it)
answering the app's jobs with JSON. The Translator is the front door: it makes the search
request of every job (``Translator.request``: its batching, its workers) and refuses what its
engine cannot do (``Translator.check``, named by the request's fields); the adapter only turns
a request's sentences into ids and the hypotheses into answers.

Everything here runs on the batcher's worker thread (``decode``) or touches no model state
(``encode``, ``info``), so the model is only ever used by one thread at a time. The engine
searches (or samples, with prefixes and lexical constraints made by ``text_constraint``),
``output_alignment`` aligns words as ``aiayn translate --alignments`` does, and
``Transformer.attention_weights`` (the path behind the demo's attention pictures) gives the
encoder-decoder attention of the best hypothesis: with another engine (``aiayn serve --engine
ctranslate2``) attention and alignments still come from our model, forced on the engine's
outputs, which are the same network's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..checkpoint import META, read_meta
from ..data.vocab import TaggedSources
from ..decode import (
    DecodeConfig,
    Hypothesis,
    OutputConstraint,
    SampleConfig,
    SearchRequest,
    text_constraint,
)
from ..decode import options as checks
from ..decode.align import output_alignment
from ..decode.capabilities import SERVER, Feature
from ..decode.constraints import with_phrases
from ..decode.nbest import is_cut
from ..errors import UserError
from ..runtime.flops import count_parameters
from ..text.glossary import Glossary
from ..translator import GlossaryGiven, Translator

ENC_DEC = "encoder-decoder attention"
PRECISION_NAMES = {torch.bfloat16: "bf16"}  # what /info calls the weights' dtype (else fp32)


@dataclass(frozen=True)
class TranslateJob:
    """One request: source ids per sentence (``[]`` for a blank one), how to decode them
    (searched, or sampled with ``sampling``; a constraint per sentence or None), whether to
    return the attention of each best hypothesis, and the layer that aligns words (None: no
    alignments); ``first``: the place of its first sentence in its request (a streamed
    request's parts), by which the sentences are seeded."""

    sources: list[list[int]]
    config: DecodeConfig
    attention: bool = False
    sampling: SampleConfig | None = None
    constraints: list[OutputConstraint | None] | None = None
    alignment_layer: int | None = None
    terms: list[tuple[tuple[str, str], ...]] | None = None  # a glossary's, per sentence
    first: int = 0

    def part(self, start: int, end: int) -> TranslateJob:
        """Sentences [start, end) of this job, as a job of their own (a stream's window)."""
        constraints = None if self.constraints is None else self.constraints[start:end]
        return replace(
            self,
            sources=self.sources[start:end],
            constraints=constraints,
            terms=None if self.terms is None else self.terms[start:end],
            first=self.first + start,
        )

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sources)

    @property
    def key(self) -> Hashable:
        """Jobs of one key can share a decode call (constraints are per sentence)."""
        return self.config, self.sampling


class Adapter:
    """An ``aiayn.Translator`` answering ``TranslateJob``s with JSON-ready dicts; ``glossary``:
    the server's (``aiayn serve --glossary``), which every request's own terms extend."""

    def __init__(self, translator: Translator, glossary: GlossaryGiven = None) -> None:
        self.translator = translator
        # the engine first: a damaged export is named before our model is looked for
        self.engine, self.vocab, self.model = translator.engine, translator.vocab, translator.model
        if len(self.vocab) != self.model.cfg.vocab_size:
            raise UserError(
                f"vocabulary {self.vocab.path} has {len(self.vocab)} pieces, the model "
                f"{self.model.cfg.vocab_size}"
            )
        self.checkpoint = translator.checkpoints[0]
        self.meta = read_meta(self.checkpoint) if (self.checkpoint / META).is_file() else {}
        self.quantized = translator.quantize
        if glossary is not None:
            translator.check({"glossary"})  # an engine without lexical constraints: at start
        self.glossary = translator.glossary(glossary)

    @property
    def max_source_tokens(self) -> int:
        return self.model.cfg.max_len

    def encode(self, lines: list[str], target_lang: str | None = None) -> list[list[int]]:
        """The sources' ids, each led by ``target_lang``'s token when given (checked against
        the model's languages: ``UserError`` naming them)."""
        vocab = self.vocab
        if target_lang is not None:
            languages = self.translator.target_languages()
            checks.target_lang(SERVER.name, target_lang, languages, "the model")
            vocab = TaggedSources(self.vocab, target_lang)
        return [vocab.encode_source(line) for line in lines]

    def constraints(
        self,
        sources: list[list[int]],
        config: DecodeConfig,
        prefixes: Sequence[str] | None,
        phrases: Sequence[Sequence[str]] | None,
    ) -> list[OutputConstraint | None] | None:
        """Each sentence's prefix and phrases as a constraint (None without any), or
        ``UserError`` naming a sentence whose constraint does not fit its output's length."""
        if prefixes is None and phrases is None:
            return None
        prefixes = prefixes or [""] * len(sources)
        phrases = phrases or [[]] * len(sources)
        built = [
            text_constraint(self.vocab, prefix, words, where=f"text[{i}]")
            for i, (prefix, words) in enumerate(zip(prefixes, phrases))
        ]
        return self._fitting(built, sources, config)

    def _fitting(
        self, built: list[Any], sources: list[list[int]], config: DecodeConfig
    ) -> list[Any] | None:
        """``built``, or ``UserError`` naming a sentence whose constraint does not fit its
        output's length; None when no sentence has one."""
        lengths = torch.tensor([len(s) for s in sources])
        limits = config.max_len(lengths, self.max_source_tokens).tolist()
        for constraint, source, limit in zip(built, sources, limits):
            if constraint is not None and source:  # a blank line is not decoded
                constraint.start(source, limit)
        return built if any(c is not None for c in built) else None

    def glossary_of(self, given: Any) -> Glossary | None:
        """A request's glossary (its ``glossary`` field) over the server's, whose target for a
        source both give it replaces; the server's alone when the request gives none."""
        own = self.translator.glossary(given, SERVER)
        if own is None or self.glossary is None:
            return own or self.glossary
        return self.glossary.merged(own)

    def with_glossary(
        self, job: TranslateJob, texts: list[str], glossary: Glossary | None
    ) -> TranslateJob:
        """``job`` whose sentences' constraints also hold the targets of the terms that occur
        in them (``text.glossary``'s rules), and which names those terms in its answers."""
        if glossary is None:
            return job
        found = [glossary.matches(text) for text in texts]
        built = [
            with_phrases(c, [t.ids for t in mine], where=f"text[{i}]", vocab=self.vocab)
            for i, (c, mine) in enumerate(zip(job.constraints or [None] * len(texts), found))
        ]
        terms = [tuple(t.pair() for t in mine) for mine in found]
        constraints = self._fitting(built, job.sources, job.config)
        return replace(job, constraints=constraints, terms=terms)

    def alignment_layer(self, layer: int | None) -> int:
        """The decoder layer a request aligns with (None: the last), or ``UserError``."""
        layer, n = -1 if layer is None else layer, self.model.cfg.N_dec
        if not -n <= layer < n:
            raise UserError(
                f"alignment_layer {layer}: the model has {n} decoder layer(s) (0..{n - 1}, or "
                "-1 for the last)"
            )
        return layer

    def decode(self, jobs: list[TranslateJob]) -> list[list[dict[str, Any]]]:
        """Jobs that share one key (``DecodeConfig`` and ``SampleConfig``) -> per job, per
        sentence, its translation.

        All sentences of all jobs go to one ``decode_ids`` call, which sorts them by length
        into batches; the answers are split back per job in input order. A sentence samples
        by its place in its own request, so the random numbers of its samples do not depend on
        the other jobs (their probabilities may, in the last bits: ``aiayn.decode.sample``).
        """
        sources = [s for job in jobs for s in job.sources]
        nbest = self.engine.decode_ids(sources, self.search_request(jobs))
        answers, start = [], 0
        for job in jobs:
            mine = nbest[start : start + len(job.sources)]
            answers.append([self._answer(i, hyps, job) for i, hyps in enumerate(mine)])
            start += len(job.sources)
        return answers

    def search_request(self, jobs: list[TranslateJob]) -> SearchRequest:
        """The one ``SearchRequest`` of jobs that share one key, their sentences in turn: the
        Translator's request (its batching and workers) with the jobs' settings."""
        if any(job.key != jobs[0].key for job in jobs):
            raise ValueError("jobs decoded together must share one DecodeConfig and sampling")
        return replace(
            self.translator.request(),
            decode=jobs[0].config,
            constraints=tuple(
                c for job in jobs for c in job.constraints or [None] * len(job.sources)
            ),
            sampling=jobs[0].sampling,
            first_index=tuple(job.first + i for job in jobs for i in range(len(job.sources))),
        ).with_ids(self.vocab)

    def check_supported(
        self, job: TranslateJob, *, seed: bool = False, glossary: bool = False
    ) -> None:
        """``UserError`` naming, by the request's fields, all that ``job`` asks which the engine
        cannot do (``seed``: the request gave one; ``glossary``: it gave terms, before they
        join the job's constraints): the Translator's one refusal."""
        request = self.search_request([job])
        asked: set[Feature] = request.features() | ({"seed"} if seed else set())
        asked |= {"glossary"} if glossary else set()
        first = request.first_lexical()
        self.translator.check(
            asked,
            where={} if first is None else {"lexical_constraints": f"constraints[{first}]"},
            spelling=SERVER,
        )

    def _answer(self, i: int, hyps: list[Hypothesis], job: TranslateJob) -> dict[str, Any]:
        """Sentence ``i`` of ``job``'s answer, from its hypotheses ``hyps``."""
        source, best = job.sources[i], hyps[0] if hyps else None
        answer: dict[str, Any] = {
            "text": self.vocab.decode(best.tokens) if best else "",
            "score": best.score if best else None,
            "nbest": [
                {"text": self.vocab.decode(h.tokens), "score": h.score, "log_prob": h.log_prob}
                | ({"cut": True} if is_cut(h) else {})
                for h in hyps
            ],
        }
        if best is not None and is_cut(best):  # as the command's JSON lines mark it
            answer["cut"] = True
        if job.terms is not None:  # as the command's JSON lines name them
            answer["glossary"] = [list(pair) for pair in job.terms[i]]
        if job.attention:
            answer["attention"] = self.attention(source, best) if best else None
        if job.alignment_layer is not None:
            for item, h in zip(answer["nbest"], hyps):
                item["alignment"] = output_alignment(
                    self.model, source, h.tokens, self.vocab, job.alignment_layer
                )
            answer["alignment"] = answer["nbest"][0]["alignment"] if hyps else None
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
        """What ``GET /info`` reports: model config, vocabulary, checkpoint, parameters, the
        languages it translates into on request, the server's glossary."""
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
            "engine": self.engine.name,
            "precision": PRECISION_NAMES.get(next(self.model.parameters()).dtype, "fp32"),
            "target_langs": list(self.translator.target_languages()),  # its >>xx<< tokens
            "glossary": None if self.glossary is None else self.glossary.origin,
        }
