"""``aiayn.Translator``: a trained checkpoint loaded once, translating from Python exactly as
``aiayn translate`` does, because the command is built on it.

    from aiayn import Translator

    with Translator("runs/demo/averaged") as translator:
        best = translator.translate(["In the beginning God created the heaven and the earth."])
        print(best[0].text, best[0].score)

One front door, one vocabulary: the keywords of ``Translator(...)`` (how a checkpoint loads)
and of ``Translator.request(...)`` (how to search) are the command line's options, which it
passes through whole (``--top-k`` is ``top_k``; ``capabilities.option_name``), as sacrebleu's
command line passes its options into ``BLEU(**kwargs)``. Every check of a decoding option
lives here, once: ``translate``, ``evaluate``, ``score`` and ``serve`` build one Translator and
ask it for their ``SearchRequest``, so Python users get every check the command line has, and
what an engine cannot do is refused here (loading options at construction, search options in
``request``), named as the caller's user typed it (``capabilities.Spelling``).

The device, precision and workers are resolved as ``--device``, ``--precision`` and
``--workers`` are (``auto``: one worker process per CPU thread, bf16 where it is native and
measured faster). The model loads on first use, so that every option is checked before a
checkpoint is read or exported. A checkpoint is a checkpoint directory, an averaged one, a
run's ``checkpoints/latest`` or ``checkpoints/best`` pointer, or a list of them (an ensemble).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import META, follow_pointer, recorded_language, search_defaults
from .data import Vocab
from .data.corpora import LANG_CODE
from .data.pieces import text_limits
from .data.vocab import TaggedSources, target_languages
from .decode import (
    DecodeConfig,
    Output,
    SampleConfig,
    Score,
    SearchRequest,
    load_models,
    score_ids,
    text_constraint,
    translate_corpus,
)
from .decode import options as checks
from .decode.capabilities import PYTHON, Feature, Spelling, check_supported, check_text
from .decode.constraints import with_phrases
from .decode.engine import Engine, TorchEngine
from .decode.translate import (
    WINDOW,
    OnTruncate,
    Window,
    check_sentences,
    corpus_windows,
    eval_mode,
    stream_windows,
)
from .errors import UserError, UserTypeError
from .evaluate import Evaluation
from .runtime.hardware import resolve_device
from .runtime.policy import Precision, choose_precision
from .runtime.workers import resolve_workers
from .text.glossary import Glossary, Term, load_glossary

if TYPE_CHECKING:  # applications built on the library: imported when opened
    from .export.engine import CTranslate2Engine
    from .export.onnx_engine import OnnxEngine

ENGINES = ("torch", "ctranslate2", "onnxruntime")

Checkpoints = str | os.PathLike | Sequence[str | os.PathLike]
# A glossary: a file, {source: target}, [[source, target], ...], or one already loaded
GlossaryGiven = str | os.PathLike | dict[str, str] | Sequence[Sequence[str]] | Glossary | None
# A window's best lines from our search or the engine's (``--split``, ``--markup``)
Around = Callable[[Any], Any]


@dataclass(frozen=True)
class Candidate:
    """One hypothesis: its text, the GNMT score the search ranks by (``log_prob / lp(|Y|)``),
    log P(Y|X) (eos included when it ended with one), |Y|, its pieces (eos left out), and on
    request log P of every token (eos included) and its word alignment (Pharaoh "i-j" pairs);
    ``cut``: the length limit stopped it before it chose eos (``aiayn score --no-eos``
    rescores such an output)."""

    text: str
    score: float
    log_prob: float
    length: int
    tokens: tuple[str, ...]
    token_log_probs: tuple[float, ...] | None = None
    alignment: str | None = None
    cut: bool = False


@dataclass(frozen=True)
class Translation:
    """One source sentence's hypotheses, best first (``nbest``: one unless more were asked
    for; none for a blank sentence, whose ``text`` is "" and ``score`` None); ``glossary``:
    with a glossary, the (source, target) terms that occur in the sentence, each of which
    the outputs hold (None without one)."""

    source: str
    nbest: tuple[Candidate, ...]
    glossary: tuple[tuple[str, str], ...] | None = None

    @property
    def best(self) -> Candidate | None:
        return self.nbest[0] if self.nbest else None

    @property
    def text(self) -> str:
        return self.nbest[0].text if self.nbest else ""

    @property
    def score(self) -> float | None:
        return self.nbest[0].score if self.nbest else None

    @property
    def log_prob(self) -> float | None:
        return self.nbest[0].log_prob if self.nbest else None

    @property
    def tokens(self) -> tuple[str, ...]:
        return self.nbest[0].tokens if self.nbest else ()

    @property
    def alignment(self) -> str | None:
        return self.nbest[0].alignment if self.nbest else None

    @property
    def cut(self) -> bool:
        return self.nbest[0].cut if self.nbest else False


@dataclass(frozen=True)
class Piece:
    """A piece of a streamed document (``Translator.stream_document``): sentence ``sentence``
    (from 0) of line ``line``, its ``translation``, and ``text``, what it adds to the line's
    translation (the source's spaces around it kept). A line with no sentence (a blank one) is
    one piece of its own text, with ``sentence`` and ``translation`` None."""

    line: int
    sentence: int | None
    text: str
    translation: Translation | None


class Translator:
    """A checkpoint (or an ensemble of them) for decoding, with its vocabulary.

    ``device``: cpu, cuda, cuda:N or auto; ``precision``: auto, fp32 or bf16; ``workers``: CPU
    processes decoding batches side by side, or auto; ``engine``: torch (our search) or
    ctranslate2 (the checkpoint exported beside it, ``aiayn.export.engine``); ``quantize``:
    None or "int8". Each is resolved as the command line resolves its option of that name,
    with the same one-line errors, and what the engine cannot do is refused here, before
    anything loads; the model (or the engine) loads on first use. ``spelling``: how refusals
    name the options (Python's keywords; the command line and the server pass theirs). Use it
    as a context manager, or ``close`` it.
    """

    def __init__(
        self,
        checkpoint: Checkpoints,
        *,
        device: str = "cpu",
        precision: str = "auto",
        workers: int | str = "auto",
        engine: str = "torch",
        quantize: str | None = None,
        spelling: Spelling = PYTHON,
    ) -> None:
        self.checkpoints = [follow_pointer(p) for p in _checkpoints(checkpoint)]
        self.device = resolve_device(_text(device, "device"))
        self.workers = resolve_workers(workers, self.device)
        self.spelling, self.engine_name = spelling, engine
        self.supports = engine_supports(engine)
        self._refuse_loading(quantize, precision)
        self.precision: Precision = choose_precision(precision, self.device, quantize, engine)
        self.quantize = quantize
        self._model: Any = None
        self._engine: Engine | None = None
        self._vocab: Any = None
        self._closed = False

    def _refuse_loading(self, quantize: str | None, precision: str) -> None:
        """The one refusal of the loading options the engine cannot honour, named as the
        command line's options with their values (as their other errors name them)."""
        asked: dict[Feature, str] = {}
        if len(self.checkpoints) > 1:
            asked["ensemble"] = f"{len(self.checkpoints)} --checkpoint"
        if quantize is not None:
            asked["quantize"] = f"--quantize {quantize}"
        if precision not in ("auto", "fp32"):
            asked["precision"] = f"--precision {precision}"
        check_supported(asked, self.engine_name, self.supports, instead="--engine torch")

    @property
    def engine(self) -> Engine:
        """What decodes (``decode.engine.Engine``), loaded on first use."""
        self._check_open()
        if self._engine is None:
            self._open()
        assert self._engine is not None
        return self._engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def vocab(self) -> Any:
        """The checkpoint's vocabulary (``Vocab``; the engine's for another engine)."""
        if self._vocab is None:
            self._check_open()
            self._open()
        return self._vocab

    @vocab.setter
    def vocab(self, vocab: Any) -> None:
        self._vocab = vocab

    def _open(self) -> None:
        if self.engine_name == "torch":
            if self._model is None:
                self._model, self._vocab = self._load()
            self._engine = TorchEngine(self._model)  # the one model: ``model`` is its
        else:
            opened = _open_engine(self.engine_name, self.checkpoints[0], self.device, self.workers)
            self._engine, self._vocab = opened, opened.vocab  # the checkpoint's spm.model

    def _load(self) -> tuple[Any, Vocab]:
        return load_models(self.checkpoints, self.device, self.quantize, self.precision.name)

    @property
    def model(self) -> Any:
        """Our model (an ``Ensemble`` for several checkpoints), ready for decoding; with another
        engine it is loaded on first use (perplexity, alignments, forced decoding)."""
        self._check_open()
        if self._model is None and self.engine_name == "torch":
            self._open()
        elif self._model is None:
            self._refuse_export_alone()
            self._model, vocab = self._load()
            self._vocab = self._vocab or vocab
        return self._model

    def _refuse_export_alone(self) -> None:
        """One line where another engine was given its export, not a checkpoint, and what is
        asked needs our model (the server, alignments, token scores, perplexity)."""
        given = self.checkpoints[0]
        if self.engine_name != "torch" and not (Path(given) / META).is_file():
            raise UserError(
                f"{given}: an export, not a checkpoint (no {META}): what is asked reads our "
                f"model; give the checkpoint it was made from (engine {self.engine_name} "
                "decodes its export, made beside it)"
            )

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise UserError("this Translator is closed")

    def close(self) -> None:
        """Let go of the model and the engine (its threads and replicas); decoding after is an
        error. The worker processes are forked per call and gone when it returns."""
        self._engine, self._model, self._closed = None, None, True

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------
    # The search, as data: the one builder of a SearchRequest

    def request(
        self,
        *,
        preset: str = "translation",
        beam: int | None = None,
        alpha: float | None = None,
        nbest: int | None = None,
        rules: str = "paper",
        no_repeat_ngram_size: int | None = None,
        repetition_penalty: float | None = None,
        sample: SampleConfig | bool | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        shortlist: str | os.PathLike | None = None,
        shortlist_frequent: int | None = None,
        shortlist_best: int | None = None,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        prefixes: bool | str | None = None,
        constraints: bool | str | None = None,
        glossary: GlossaryGiven = None,
        target_lang: str | None = None,
    ) -> SearchRequest:
        """The ``SearchRequest`` of these options (the command line's, ``--top-k`` as
        ``top_k``; ``rules`` is ``--search-rules``, ``preset`` ``--decode-preset``), the others
        as the preset has them; the batches go to this Translator's workers. ``sample``: True
        (with ``top_k``, ``top_p``, ``temperature``, ``seed``), or a ``SampleConfig``, draws
        instead of the beam search (``nbest`` samples per source). ``prefixes`` and
        ``constraints``: True (or the file the command line reads them from) when the
        sentences will come with them (``translate``'s), so that a shortlist, or an engine
        without them, is refused here; ``glossary`` and ``target_lang``: ``glossary``'s and
        ``target_languages``'. Every option is checked here, and what the engine cannot do
        refused, before the shortlist or the glossary is read or anything loads."""
        say = self.spelling.name
        drawing = {"top_k": top_k, "top_p": top_p, "temperature": temperature, "seed": seed}
        drawn = checks.sampling(say, sample, beam, nbest, rules, drawing)
        own = search_defaults(self.checkpoints[0])  # an import's own settings, per rules
        config = DecodeConfig.choose(
            preset,
            own=own,
            phrases=glossary is not None or bool(constraints),
            beam=beam,
            alpha=alpha,
            nbest=nbest,
            rules=rules,
            no_repeat_ngram_size=no_repeat_ngram_size,
            repetition_penalty=repetition_penalty,
        )
        sizes = checks.shortlist_sizes(say, shortlist, drawn, shortlist_frequent, shortlist_best)
        per_sentence = checks.per_sentence(say, shortlist, prefixes, constraints, glossary)
        batching = checks.batching(say, batch_size, max_tokens, self.workers)
        request = SearchRequest(config, sampling=drawn, batching=batching)
        given: dict[Feature, Any] = {"shortlist": shortlist, "seed": seed, "glossary": glossary}
        asked = request.features() | per_sentence | {f for f, v in given.items() if v is not None}
        self.check(asked, values={"search_rules": rules})
        request = self._texts(request, glossary, target_lang)
        if shortlist is None:
            return request
        from .decode.shortlist import load_shortlist

        return replace(request, shortlist=load_shortlist(shortlist, self.vocab, **sizes))

    def _texts(
        self, request: SearchRequest, glossary: GlossaryGiven, target_lang: str | None
    ) -> SearchRequest:
        """``request`` with the glossary's terms spelled and the target language checked."""
        languages = () if target_lang is None else self.target_languages()
        code = checks.target_lang(self.spelling.name, target_lang, languages, self.checkpoints[0])
        return replace(request, glossary=self.glossary(glossary), target_lang=code)

    def glossary(self, given: GlossaryGiven, spelling: Spelling | None = None) -> Glossary | None:
        """``given`` as a ``Glossary`` whose targets this vocabulary spells: a file
        (``source<TAB>target`` lines), ``{source: target}``, ``[[source, target], ...]`` or a
        ``Glossary``; None for None. A bad line or item, or a target the vocabulary cannot
        spell, is a one-line ``UserError`` naming it."""
        named = (spelling or self.spelling).name("glossary")
        loaded = load_glossary(given, named)
        return None if loaded is None else loaded.spelled(self.vocab)

    def target_languages(self) -> tuple[str, ...]:
        """The languages this model translates into on request (``target_lang``): the codes of
        its vocabulary's ``>>xx<<`` pieces (an OPUS-MT multilingual model's, or those ``aiayn
        prepare`` added for its corpora's ``tag``); () for a model of one target language."""
        return target_languages(self.vocab)

    def check(
        self,
        asked: Iterable[Feature],
        *,
        where: dict[Feature, str] | None = None,
        spelling: Spelling | None = None,
        values: dict[Feature, object] | None = None,
    ) -> None:
        """The one refusal of what this Translator's engine, or its checkpoint's text
        splitting (``data.pieces.text_limits``), cannot do: ``UserError`` in one
        line naming every feature ``asked`` that it lacks as ``spelling`` (default: this
        Translator's) names it (with its value from ``values``, where the spelling says so),
        prefixed by the ``where`` of the first that has one."""
        spelling, values = spelling or self.spelling, values or {}
        named = {f: spelling.feature(f, values.get(f)) for f in asked}
        check_supported(
            named, self.engine_name, self.supports, where=where, instead=spelling.instead
        )
        check_text(named, *text_limits(self.checkpoints[0]), where=where)

    def _request(self, request: SearchRequest | None, options: dict[str, Any]) -> SearchRequest:
        if request is not None and options:
            raise UserTypeError(f"give a request or options ({', '.join(options)}), not both")
        return request if request is not None else self.request(**options)

    # ------------------------------------------------------------------------------------
    # Translating

    def translate(
        self,
        sentences: Sequence[str],
        request: SearchRequest | None = None,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str] | str] | None = None,
        token_scores: bool = False,
        alignments: bool | int = False,
        progress: bool = False,
        **options: Any,
    ) -> list[Translation]:
        """A ``Translation`` of each sentence, in input order, exactly as ``aiayn translate``
        prints them (the same windows, batches and search). ``request`` or ``options``
        (``request``'s keywords) say how to search; ``prefixes`` (the fixed start of each
        output, "" for none) and ``constraints`` (words or phrases each output must contain)
        go one per sentence; ``token_scores`` adds log P of every token; ``alignments`` (True:
        the last decoder layer, or a layer's number) adds word alignments. With a
        ``glossary`` (``request``'s keyword), each ``Translation`` names the terms applied."""
        asked = _Asked(prefixes, constraints, token_scores, alignments, progress)
        return list(self._translations(sentences, request, asked, None, options))

    def stream(
        self,
        sentences: Sequence[str],
        request: SearchRequest | None = None,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str] | str] | None = None,
        token_scores: bool = False,
        alignments: bool | int = False,
        window: int = WINDOW,
        **options: Any,
    ) -> Iterator[Translation]:
        """``translate``'s translations one at a time, in input order, each as soon as it and
        all before it are done: the sentences are searched in windows of 1, 2, 4, ... (at most
        ``window``; ``decode.translate.stream_windows``), so the first comes after its own
        search alone. Each window is searched as ``translate`` searches, in other batches: the
        texts are ``translate``'s, the scores equal to the last bits of float rounding. Every
        option is checked, and what the engine cannot do refused, here, before the first."""
        asked = _Asked(prefixes, constraints, token_scores, alignments)
        sizes = stream_windows(self._window(window))
        return self._translations(sentences, request, asked, sizes, options)

    def _translations(
        self,
        sentences: Sequence[str],
        request: SearchRequest | None,
        asked: _Asked,
        window: int | Iterator[int] | None,
        options: dict[str, Any],
    ) -> Iterator[Translation]:
        """The translations of ``translate`` and ``stream``, every option checked first."""
        check_sentences(sentences)
        per_sentence = {"prefixes": asked.prefixes, "constraints": asked.constraints}
        if request is None:  # a shortlist, or an engine, that cannot take them is refused first
            options.update({name: value is not None for name, value in per_sentence.items()})
        search = self._request(request, options)
        for name, given in per_sentence.items():
            if given is not None:
                checks.check_per_sentence(given, name, len(sentences))
        windows = self.windows(
            sentences,
            search,
            prefixes=asked.prefixes,
            constraints=asked.constraints,
            token_scores=asked.token_scores,
            alignment_layer=checks.alignment_layer(asked.alignments),
            window=window,
            progress=asked.progress,
        )
        found = (outputs for window in windows for outputs in window)
        terms = search.glossary.matches if search.glossary is not None else None
        return (
            Translation(
                source,
                tuple(self._candidate(o) for o in outputs),
                None if terms is None else tuple(t.pair() for t in terms(source)),
            )
            for source, outputs in zip(sentences, found)
        )

    def stream_document(
        self,
        lines: Sequence[str],
        request: SearchRequest | None = None,
        *,
        lang: str | None = None,
        window: int = WINDOW,
        **options: Any,
    ) -> Iterator[Piece]:
        """``aiayn translate --split``, streamed: each line split into sentences (Moses' rules
        for ``lang``, default the source language the checkpoint's data records, else English;
        a sentence longer than the training data's longest cut as ``--split`` cuts it), the
        sentences translated by ``stream``, and each given back as a ``Piece`` as soon as it
        and all before it are done. The pieces of line i, joined, are what ``--split`` prints
        for it."""
        from .checkpoint import read_meta
        from .text.document import split_line, trained_limit

        check_sentences(lines, "lines")
        first = self.checkpoints[0]
        lang = lang or recorded_language(first, "src") or "en"
        limit = trained_limit(read_meta(first))
        count = lambda s: len(self.vocab.encode_source(s))  # noqa: E731
        spans = [
            split_line(text, lang, count, limit, where=f"lines[{i}]")[0]
            for i, text in enumerate(lines)
        ]
        sentences = [text[a:b] for text, line in zip(lines, spans) for a, b in line]
        return _pieces(lines, spans, self.stream(sentences, request, window=window, **options))

    def windows(
        self,
        lines: Iterable[str],
        request: SearchRequest,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str] | str] | None = None,
        where: Callable[[int], str] | None = None,
        token_scores: bool = False,
        alignment_layer: int | None = None,
        window: int | Iterator[int] | None = None,
        progress: bool = False,
        total: int | None = None,
        on_truncate: OnTruncate | None = None,
    ) -> Iterator[list[list[Output]]]:
        """The n-best ``Output`` lists of ``lines``, a window of ``window`` lines at a time
        (default ``WINDOW``; sorted by length within it, given back in input order; or the
        windows' sizes in turn: ``stream_windows``).
        ``prefixes`` and ``constraints``: line i's fixed start ("" for none) and its phrases
        (a list, or one str: one phrase), indexed by the line's number from 0; ``where(i)``
        names line i in their errors (default "sentence i"). Each window's request is refused
        here (``check``) if the engine cannot do it."""
        check_sentences(lines, "lines", stream=True)
        self._check_open()
        outputs: dict[Feature, bool] = {
            "token_scores": token_scores,
            "alignments": alignment_layer is not None,
        }
        self.check([f for f, given in outputs.items() if given])
        sizes = window if isinstance(window, Iterator) else self._window(window)
        corpus = corpus_windows(
            lines,
            window=sizes,
            progress=progress,
            total=total,
            on_truncate=on_truncate,
        )
        per_line = _PerLine(prefixes, constraints, where or _sentence)
        return self._windows(corpus, request, per_line, token_scores, alignment_layer)

    def _windows(
        self,
        corpus: Iterator[Window],
        request: SearchRequest,
        per_line: _PerLine,
        token_scores: bool,
        alignment_layer: int | None,
    ) -> Iterator[list[list[Output]]]:
        """Each window decoded by the engine, with its lines' prefixes and phrases."""
        vocab = self.sources_vocab(request)
        for part in corpus:
            search = replace(request, first_index=part.first)
            if per_line.given:
                built = per_line.constraints(self.vocab, part.first, len(part.texts))
                search = replace(search, constraints=built)
                self.check(search.features(), where=search.where())
            terms = None
            if search.glossary is not None:  # refused at ``request`` where the engine lacks it
                terms = [search.glossary.matches(text) for text in part.texts]
                origin = search.glossary.origin
                where = [f"{origin}: sentence {part.first + i}" for i in range(len(terms))]
                search = with_terms(search, terms, where, vocab)
            found = self.engine.nbest(
                part.texts,
                vocab,
                search,
                token_scores=token_scores,
                alignment_layer=alignment_layer,
                progress=part.progress,
                on_truncate=part.on_truncate,
            )
            if terms is None:
                yield found
            else:
                yield [
                    [replace(o, terms=tuple(t.pair() for t in mine)) for o in outputs]
                    for outputs, mine in zip(found, terms, strict=True)
                ]

    def best_lines(
        self,
        lines: Iterable[str],
        request: SearchRequest,
        around: Around,
        *,
        window: int | None = None,
        progress: bool = False,
        total: int | None = None,
        on_truncate: OnTruncate | None = None,
    ) -> Iterator[list[str]]:
        """The best translation of each of ``lines``, a window at a time, through ``around``
        (``text.document.SplitOutputs``: --split; ``text.marked.MarkupOutputs``: --markup),
        which wraps the engine's best lines (``Engine.best_lines``) on its ``decoder``."""
        self._check_open()
        if request.glossary is not None:
            raise UserError(
                f"{self.spelling.name('glossary')} constrains whole sentences: not with a line's "
                "sentences split or its markup taken out (give one sentence a line instead)"
            )
        window, engine = self._window(window), self.engine
        return translate_corpus(
            engine.decoder,
            lines,
            self.sources_vocab(request),
            request,
            window=window,
            progress=progress,
            total=total,
            on_truncate=on_truncate,
            outputs=around(engine.best_lines),
        )

    def _window(self, window: int | None) -> int:
        """The lines a window holds: ``window`` (default ``WINDOW``), at least 1."""
        if window is None:
            return WINDOW
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise UserError(f"{self.spelling.name('window')} must be at least 1, got {window!r}")
        return window

    def sources_vocab(self, request: SearchRequest) -> Any:
        """The vocabulary the sources of ``request`` are read with: with its ``target_lang``,
        each starts with that language's token (``data.vocab.TaggedSources``)."""
        if request.target_lang is None:
            return self.vocab
        return TaggedSources(self.vocab, request.target_lang)

    def _candidate(self, output: Output) -> Candidate:
        pieces = tuple(self.vocab.id_to_piece(t) for t in output.ids or [])
        token_log_probs = None if output.tokens is None else tuple(lp for _, lp in output.tokens)
        return Candidate(
            output.text,
            output.score,
            output.log_prob,
            output.length,
            pieces,
            token_log_probs,
            output.alignment,
            output.cut,
        )

    def translate_file(
        self,
        source: str | os.PathLike,
        output: str | os.PathLike,
        request: SearchRequest | None = None,
        **options: Any,
    ) -> int:
        """Translate the file ``source`` (.gz allowed) into the file ``output``, one line per
        line, as ``aiayn translate --input SOURCE > OUTPUT`` does; ``output`` is written to a
        temporary name and renamed, and is never one of the inputs. A line not valid UTF-8 has
        an empty output line and is named in a ``UserError`` at the end; a line longer than
        the model's positions is truncated with a warning. Returns the lines."""
        from .checkpoint import checkpoint_files
        from .files import (
            LenientLines,
            atomic_file,
            check_not_input,
            check_output_file,
            open_binary,
            split_lines,
        )

        search = self._request(request, options)
        check_output_file(output)
        inputs = [source, *(f for c in self.checkpoints for f in checkpoint_files(c))]
        check_not_input(output, inputs, option="output")
        lines = LenientLines(str(source))
        truncated = partial(_warn_truncated, str(source))
        with open_binary(source) as raw, atomic_file(output) as tmp:
            with open(tmp, "w", encoding="utf-8", newline="\n") as sink:
                texts = lines.texts(split_lines(raw))
                for nbest in self.windows(texts, search, on_truncate=truncated):
                    sink.write("".join(_best(outputs) + "\n" for outputs in nbest))
            lines.check()  # before the rename: no output with lines missing
        return lines.count

    def target_language(self) -> str | None:
        """The target language the checkpoint's training data recorded (``aiayn prepare``
        records it in the dataset's meta.json and training copies that into every
        checkpoint), or None."""
        self._refuse_export_alone()  # evaluate: its perplexity is our model's
        return recorded_language(self.checkpoints[0], "tgt")

    def evaluate(
        self,
        sources: Sequence[str],
        references: Sequence[str],
        request: SearchRequest | None = None,
        *,
        hyp_path: str | os.PathLike | None = None,
        lang: str | None = None,
        progress: bool = False,
    ) -> Evaluation:
        """``aiayn evaluate``: ``sources`` translated as ``translate`` does (``request``
        default: ``request()``) and scored against ``references``: SacreBLEU with its
        signature, the paper's BLEU (Moses-tokenised in ``lang``, default the target language
        the checkpoint's data records, else German, the paper's), chrF and TER with intervals,
        and our model's perplexity of the references; the hypotheses are written to
        ``hyp_path`` when given."""
        from .evaluate import scored
        from .files import write_lines_atomic

        check_sentences(sources, "sources")
        check_sentences(references, "references")
        if len(sources) != len(references):
            raise UserError(f"{len(sources)} sources but {len(references)} references")
        if not sources:
            raise UserError("no sources to evaluate: give at least one sentence")
        search = self.request() if request is None else request
        start = time.perf_counter()
        windows = self.windows(sources, search, progress=progress, total=len(sources))
        hyps = [_best(outputs) for window in windows for outputs in window]
        decode_s = time.perf_counter() - start
        engine = self.engine.name if self.engine is not None else "torch"
        lang = _bleu_language(lang, self.target_language(), self.spelling.name("lang"))
        vocab = self.sources_vocab(search)  # the sources as the model read them, for perplexity
        result = scored(
            self.model, vocab, sources, references, hyps, decode_s, lang=lang, engine=engine
        )
        if hyp_path is not None:
            write_lines_atomic(hyp_path, result.hypotheses)
        return result

    # ------------------------------------------------------------------------------------
    # Forced decoding

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        *,
        alpha: float | None = None,
        name: str = "targets",
        eos: bool = True,
    ) -> list[Score | None]:
        """log P(target | source) of each pair, eos included unless ``eos`` is False (an output
        the length limit cut, ``Output.cut``: it chose none), as ``aiayn score`` prints them
        (``Score``: log_prob, length, score = log_prob / lp(|Y|) with the preset's alpha unless
        given, ppl, token_log_probs); None for an empty source. ``name``: what errors call
        the targets."""
        check_sentences(sources, "sources")
        check_sentences(targets, "targets")
        vocab, model = self.vocab, self.model
        config, end = DecodeConfig.choose(alpha=alpha), [vocab.eos_id] if eos else []
        with eval_mode(model):
            return score_ids(
                model,
                [vocab.encode_source(s) for s in sources],
                [vocab.encode_target(t) + end for t in targets],
                alpha=config.alpha,
                name=name,
            )


def engine_supports(engine: str) -> frozenset[Feature]:
    """What ``engine`` declares it can do (``capabilities.Feature``), known before it opens, so
    that what it cannot do is refused before a checkpoint loads or exports."""
    if engine not in ENGINES:
        raise UserError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    if engine == "torch":
        return TorchEngine.supports
    if engine == "onnxruntime":
        from .export.onnx_engine import SUPPORTS  # torch's, not onnxruntime's, import

        return SUPPORTS
    from .export.engine import CTranslate2Engine  # torch's, not ctranslate2's, import

    return CTranslate2Engine.supports


def _bleu_language(lang: str | None, recorded: str | None, named: str) -> str:
    """The language the paper's BLEU tokenises in: ``lang`` (a language code), else the
    checkpoint's recorded target language, else German (the paper's). A code other than the
    recorded one is used, with a warning: scores in two languages do not compare."""
    if lang is None:
        return recorded or "de"
    if not (isinstance(lang, str) and LANG_CODE.fullmatch(lang)):
        raise UserError(
            f"{named} {lang!r}: not a language code (ISO 639: two or three lower-case letters, "
            "then an optional region: en, de, pt-BR)"
        )
    if recorded is not None and lang != recorded:
        warnings.warn(
            f"{named} {lang}, but the checkpoint translates into {recorded}: the paper BLEU "
            f"tokenises as {lang}",
            stacklevel=3,
        )
    return lang


def _open_engine(
    engine: str, checkpoint: Any, device: str, workers: int
) -> CTranslate2Engine | OnnxEngine:
    """Another engine on ``checkpoint``, exported beside it on first use: CTranslate2's, or
    ONNX Runtime's (which also opens an ONNX export's directory given instead)."""
    import torch

    from .export.engine import CTranslate2Engine

    if engine == "onnxruntime":
        from .export.onnx_engine import OnnxEngine, onnx_directory

        if str(device) != "cpu":
            raise UserError(f"--engine onnxruntime decodes on the CPU, not --device {device}")
        return OnnxEngine.open(onnx_directory(checkpoint), threads=torch.get_num_threads())

    return CTranslate2Engine.open(
        checkpoint, device=device, threads=torch.get_num_threads(), workers=workers
    )


def _checkpoints(checkpoint: Any) -> list[str | os.PathLike]:
    """The checkpoints given: one path or a list of them, each a str or a path."""
    given = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else checkpoint
    if isinstance(given, (bytes, bytearray)) or not isinstance(given, Sequence):
        raise UserTypeError(
            f"checkpoint must be a path (str or os.PathLike) or a list of them, not "
            f"{type(checkpoint).__name__}"
        )
    if not given:
        raise UserError("give a checkpoint (or several: an ensemble)")
    for i, path in enumerate(given):
        if not isinstance(path, (str, os.PathLike)):
            raise UserTypeError(f"checkpoint[{i}] must be a path, not {type(path).__name__}")
        _text(os.fspath(path), "checkpoint")
    return list(given)


def _text(value: Any, name: str) -> Any:
    """``value`` when it is a str that UTF-8 can encode (no lone surrogate), else a one-line
    ``UserError`` naming ``name``."""
    if not isinstance(value, str):
        raise UserTypeError(f"{name} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{name} {value!r} is not Unicode text (a lone surrogate)") from None
    return value


@dataclass(frozen=True)
class _PerLine:
    """Each line's prefix and phrases (``windows``' ``prefixes`` and ``constraints``), indexed
    by the line's number in the corpus, and how an error names line i (``where``)."""

    prefixes: Sequence[str] | None
    phrases: Sequence[Sequence[str] | str] | None
    where: Callable[[int], str]

    @property
    def given(self) -> bool:
        return self.prefixes is not None or self.phrases is not None

    def constraints(self, vocab: Any, first: int, n: int) -> tuple[Any, ...]:
        """Lines ``first`` .. ``first + n - 1``'s constraints (``text_constraint``; None for
        neither), or a one-line ``UserError`` naming the line."""
        return tuple(
            text_constraint(
                vocab,
                "" if self.prefixes is None else _item(self.prefixes, i, "prefixes"),
                []
                if self.phrases is None
                else checks.phrases(_item(self.phrases, i, "constraints"), i),
                where=self.where(i),
            )
            for i in range(first, first + n)
        )


def with_terms(
    request: SearchRequest, terms: Sequence[Sequence[Term]], where: Sequence[str], vocab: Any
) -> SearchRequest:
    """``request`` for ``len(terms)`` sources whose constraints also hold the targets of their
    ``terms`` (a glossary's matches, spelled by ``vocab``); ``where`` names each source in
    errors."""
    given = request.constraints_of(range(len(terms)))
    per_source = given if isinstance(given, list) else [given] * len(terms)
    merged = tuple(
        with_phrases(c, [t.ids for t in mine], where=name, vocab=vocab)
        for c, mine, name in zip(per_source, terms, where)
    )
    return replace(request, constraints=merged)


def _item(given: Sequence[Any], i: int, name: str) -> Any:
    """Line i's item of ``given`` (which may name its own shortage: a file's lines), or a
    one-line ``UserError`` when it has fewer."""
    try:
        return given[i]
    except IndexError:
        raise UserError(f"{len(given)} {name} for {i + 1} lines or more: give one each") from None


def _sentence(i: int) -> str:
    return f"sentence {i}"


def _best(outputs: list[Output]) -> str:
    return outputs[0].text if outputs else ""


def _warn_truncated(name: str, index: int, tokens: int, cap: int) -> None:
    """``on_truncate`` of ``translate_file``: a Python warning naming the line (from 1)."""
    warnings.warn(
        f"{name}: line {index + 1}: {tokens} tokens, more than the model's {cap} positions: "
        "truncated",
        stacklevel=2,
    )


@dataclass(frozen=True)
class _Asked:
    """What ``translate`` and ``stream`` are asked beyond the search: per sentence and per
    output."""

    prefixes: Sequence[str] | None
    constraints: Sequence[Sequence[str] | str] | None
    token_scores: bool
    alignments: bool | int
    progress: bool = False


def _pieces(
    lines: Sequence[str], spans: Sequence[Sequence[Any]], translations: Iterator[Translation]
) -> Iterator[Piece]:
    """Each line's pieces in order, a sentence's as soon as ``translations`` gives it, and a
    line without sentences as soon as the sentences before it are done."""
    from .text.document import around_spans

    for i, (text, line) in enumerate(zip(lines, spans)):
        if not line:
            yield Piece(i, None, text, None)
        pieces = zip(around_spans(text, line), translations)  # the spans first: zip stops there
        for j, ((before, after), translation) in enumerate(pieces):
            yield Piece(i, j, before + translation.text + after, translation)
