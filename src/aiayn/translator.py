"""``aiayn.Translator``: a trained checkpoint loaded once, translating from Python exactly as
``aiayn translate`` does, because the command is built on it.

    from aiayn import Translator

    with Translator("runs/demo/averaged") as translator:
        best = translator.translate(["In the beginning God created the heaven and the earth."])
        print(best[0].text, best[0].score)

The device, precision, workers and engine are resolved as the command line resolves its
``--device``, ``--precision``, ``--workers`` and ``--engine`` (``auto`` included: one worker
process per CPU thread, bf16 where it is native and measured faster), and the search options
(``request``) are the command's options by their Python names, so that ``translate``,
``evaluate``, ``score`` and ``serve`` build one Translator and one ``SearchRequest`` and call
it: the Python object and the commands cannot drift. A checkpoint is a checkpoint directory,
an averaged one, a run's ``checkpoints/latest`` or ``checkpoints/best`` pointer, or a list of
them (an ensemble).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TextIO

from .checkpoint import follow_pointer, recorded_language
from .data import Vocab
from .decode import (
    Batching,
    DecodeConfig,
    Output,
    SampleConfig,
    Score,
    SearchRequest,
    load_models,
    nbest_outputs,
    score_ids,
    text_constraint,
    translate_corpus,
)
from .decode.capabilities import Feature, check_supported
from .decode.engine import Engine, TorchEngine

if TYPE_CHECKING:
    from .export.engine import CTranslate2Engine
    from .export.onnx_engine import OnnxEngine
from .decode.translate import WINDOW, OnTruncate, Progress, check_sentences, eval_mode
from .decode.workers import resolve_workers
from .errors import UserError
from .evaluate import Evaluation
from .hardware import resolve_device
from .policy import Precision, choose_precision

ENGINES = ("torch", "ctranslate2", "onnxruntime")

Checkpoints = str | os.PathLike | Sequence[str | os.PathLike]
# A window's request (its constraints) from the request numbering its first line, and its size
PerWindow = Callable[[SearchRequest, int], SearchRequest]


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
    for; none for a blank sentence, whose ``text`` is "" and ``score`` None)."""

    source: str
    nbest: tuple[Candidate, ...]

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


class Translator:
    """A checkpoint (or an ensemble of them) loaded once for decoding, with its vocabulary.

    ``device``: cpu, cuda, cuda:N or auto; ``precision``: auto, fp32 or bf16; ``workers``: CPU
    processes decoding batches side by side, or auto; ``engine``: torch (our search) or
    ctranslate2 (the checkpoint exported beside it, ``aiayn.export.engine``); ``quantize``:
    None or "int8". Each is resolved as the command line resolves its option of that name,
    with the same one-line errors. Use it as a context manager, or ``close`` it.
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
    ) -> None:
        given = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
        if not given:
            raise UserError("give a checkpoint (or several: an ensemble)")
        self.checkpoints = [follow_pointer(p) for p in given]
        self.device = resolve_device(device)
        self.workers = resolve_workers(workers, self.device)
        check_supported(
            loading_features(len(self.checkpoints), quantize, precision),
            engine,
            engine_supports(engine),
            instead="--engine torch",
        )
        self.precision: Precision = choose_precision(precision, self.device, quantize, engine)
        self.quantize = quantize
        self._model: Any = None
        if engine == "torch":
            self._model, self.vocab = self._load()
            self.engine: Engine | None = TorchEngine(self._model)
        else:
            opened = _open_engine(engine, self.checkpoints[0], self.device, self.workers)
            self.engine, self.vocab = opened, opened.vocab  # the checkpoint's spm.model

    def _load(self) -> tuple[Any, Vocab]:
        return load_models(self.checkpoints, self.device, self.quantize, self.precision.name)

    @property
    def model(self) -> Any:
        """Our model (an ``Ensemble`` for several checkpoints), ready for decoding; with another
        engine it is loaded on first use (perplexity, alignments, forced decoding)."""
        if self._model is None:
            self._check_open()
            self._model, _ = self._load()
        return self._model

    def _check_open(self) -> None:
        if self.engine is None:
            raise UserError("this Translator is closed")

    def close(self) -> None:
        """Let go of the model and the engine (its threads and replicas); decoding after is an
        error. The worker processes are forked per call and gone when it returns."""
        self.engine, self._model = None, None

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------
    # The search, as data

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
        shortlist: str | os.PathLike | None = None,
        batch_size: int | None = None,
        max_tokens: int | None = None,
    ) -> SearchRequest:
        """The ``SearchRequest`` of these options, named as the command line's (``--beam``,
        ``--alpha``, ``--nbest``, ``--search-rules``, ``--no-repeat-ngram-size``,
        ``--repetition-penalty``, ``--shortlist``, ``--batch-size``, ``--max-tokens``), the
        others as the preset has them; the batches go to this
        Translator's workers. ``sample``: True, or a ``SampleConfig``, draws instead of the beam
        search (``nbest`` samples per source)."""
        drawn = _sampling(sample, beam, nbest, rules)
        guards = {"no_repeat_ngram_size": no_repeat_ngram_size}
        guards["repetition_penalty"] = repetition_penalty
        config = DecodeConfig.choose(
            preset, beam=beam, alpha=alpha, nbest=nbest, rules=rules, **guards
        )
        sizes = {"batch_size": batch_size, "max_tokens": max_tokens}
        batching = Batching(
            **{k: v for k, v in sizes.items() if v is not None}, workers=self.workers
        )
        listed = None
        if shortlist is not None:
            from .decode.shortlist import load_shortlist

            listed = load_shortlist(shortlist, self.vocab)
        return SearchRequest(config, sampling=drawn, shortlist=listed, batching=batching)

    def _request(self, request: SearchRequest | None, options: dict[str, Any]) -> SearchRequest:
        if request is not None and options:
            raise TypeError(f"give a request or options ({', '.join(options)}), not both")
        return request if request is not None else self.request(**options)

    # ------------------------------------------------------------------------------------
    # Translating

    def translate(
        self,
        sentences: Sequence[str],
        request: SearchRequest | None = None,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
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
        the last decoder layer, or a layer's number) adds word alignments."""
        check_sentences(sentences)
        search = self._request(request, options)
        per_window = None
        if prefixes is not None or constraints is not None:
            built = self.constraints(sentences, prefixes, constraints)
            per_window = partial(_window_constraints, built)
        windows = self.windows(
            sentences,
            search,
            token_scores=token_scores,
            alignment_layer=_alignment_layer(alignments),
            per_window=per_window,
            progress=progress,
        )
        found = [outputs for window in windows for outputs in window]
        return [
            Translation(source, tuple(self._candidate(o) for o in outputs))
            for source, outputs in zip(sentences, found)
        ]

    def windows(
        self,
        lines: Iterable[str],
        request: SearchRequest,
        *,
        token_scores: bool = False,
        alignment_layer: int | None = None,
        per_window: PerWindow | None = None,
        window: int = WINDOW,
        progress: bool = False,
        total: int | None = None,
        on_truncate: OnTruncate | None = None,
    ) -> Iterator[list[list[Output]]]:
        """The n-best ``Output`` lists of ``lines``, a window of ``window`` lines at a time
        (``translate_corpus``: sorted by length within it, given back in input order).
        ``per_window``: the request of a window of n lines (its constraints), given the
        request whose ``first_index`` is the window's first line."""
        check_sentences(lines, "lines", stream=True)
        self._check_open()
        outputs = partial(
            self._outputs,
            token_scores=token_scores,
            alignment_layer=alignment_layer,
            per_window=per_window,
        )
        return translate_corpus(
            self,
            lines,
            self.vocab,
            request,
            window=window,
            progress=progress,
            total=total,
            on_truncate=on_truncate,
            outputs=outputs,
        )

    def best_lines(
        self, lines: Iterable[str], request: SearchRequest, stream: TextStream
    ) -> Iterator[list[str]]:
        """The best translation of each of ``lines``, a window at a time, through
        ``stream.around`` (``text.document.SplitOutputs``: --split; ``text.marked.MarkupOutputs``:
        --markup), which wraps our search (``decode.translate``) or the engine's."""
        from .decode import translate
        from .decode.engine import translate_with

        self._check_open()
        if isinstance(self.engine, TorchEngine):
            decoder, inner = self.model, translate
        else:
            decoder, inner = self.engine, translate_with
        return translate_corpus(
            decoder,
            lines,
            self.vocab,
            request,
            window=stream.window,
            progress=stream.progress,
            total=stream.total,
            on_truncate=stream.say_truncated,
            outputs=stream.around(inner),
        )

    def _outputs(
        self,
        _: Any,
        texts: list[str],
        vocab: Vocab,
        request: SearchRequest,
        *,
        token_scores: bool,
        alignment_layer: int | None,
        per_window: PerWindow | None,
        progress: bool | Progress,
        on_truncate: OnTruncate | None,
    ) -> list[list[Output]]:
        """One window's n-best lists (``translate_corpus``'s ``outputs``): our model's, with
        token scores and alignments on request, or another engine's."""
        if per_window is not None:
            request = per_window(request, len(texts))
        if isinstance(self.engine, TorchEngine):
            return nbest_outputs(
                self.model,
                texts,
                vocab,
                request,
                token_scores=token_scores,
                alignment_layer=alignment_layer,
                progress=progress,
                on_truncate=on_truncate,
            )
        outputs: dict[Feature, bool] = {
            "token_scores": token_scores,
            "alignments": alignment_layer is not None,
        }
        check_supported(
            [f for f, given in outputs.items() if given],
            self.engine.name,
            self.engine.supports,
            instead="engine='torch'",
        )
        request = request.with_ids(vocab)
        nbest = self.engine.decode_ids(
            [vocab.encode_source(text) for text in texts],
            request,
            progress=progress,
            on_truncate=on_truncate,
        )
        return [[Output.of(h, vocab.decode(h.tokens)) for h in hyps] for hyps in nbest]

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

    def constraints(
        self,
        sentences: Sequence[str],
        prefixes: Sequence[str] | None,
        constraints: Sequence[Sequence[str]] | None,
    ) -> tuple[Any, ...]:
        """Each sentence's prefix and phrases as a constraint (``text_constraint``; None for
        neither), or a one-line ``UserError`` naming the sentence (from 0)."""
        for name, given in (("prefixes", prefixes), ("constraints", constraints)):
            if given is not None:
                if len(given) != len(sentences):
                    raise UserError(
                        f"{len(given)} {name} for {len(sentences)} sentences: give one each"
                    )
        return tuple(
            text_constraint(
                self.vocab,
                prefixes[i] if prefixes is not None else "",
                _phrases(constraints[i]) if constraints is not None else [],
                where=f"sentence {i}",
            )
            for i in range(len(sentences))
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
        temporary name and renamed, and is never one of the inputs. Returns the lines."""
        from .checkpoint import checkpoint_files
        from .files import atomic_file, check_not_input, check_output_file, open_binary

        search = self._request(request, options)
        check_output_file(output)
        inputs = [source, *(f for c in self.checkpoints for f in checkpoint_files(c))]
        check_not_input(output, inputs, option="output")
        with open_binary(source) as raw, atomic_file(output) as tmp:
            with open(tmp, "w", encoding="utf-8", newline="\n") as sink:
                return translate_stream(TextStream(raw, sink, name=str(source)), self, search)

    def target_language(self) -> str | None:
        """The target language the checkpoint's training data recorded (``aiayn prepare``
        records it in the dataset's meta.json and training copies that into every
        checkpoint), or None."""
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
        search = self.request() if request is None else request
        start = time.perf_counter()
        windows = self.windows(sources, search, progress=progress, total=len(sources))
        hyps = [_best(outputs) for window in windows for outputs in window]
        decode_s = time.perf_counter() - start
        engine = self.engine.name if self.engine is not None else "torch"
        lang = lang or self.target_language() or "de"
        result = scored(
            self.model, self.vocab, sources, references, hyps, decode_s, lang=lang, engine=engine
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


def loading_features(checkpoints: int, quantize: str | None, precision: str) -> dict[Feature, str]:
    """What the loading options ask of an engine, named as the command line's options."""
    asked: dict[Feature, str] = {}
    if checkpoints > 1:
        asked["ensemble"] = f"{checkpoints} --checkpoint"
    if quantize is not None:
        asked["quantize"] = f"--quantize {quantize}"
    if precision not in ("auto", "fp32"):
        asked["precision"] = f"--precision {precision}"
    return asked


def _open_engine(
    engine: str, checkpoint: Path, device: str, workers: int
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


def _sampling(
    sample: SampleConfig | bool | None, beam: int | None, nbest: int | None, rules: str
) -> SampleConfig | None:
    """The draw ``sample`` asks for (``nbest`` samples per source), or None: beam search."""
    if not sample:
        return None
    if beam is not None:
        raise UserError("beam has no effect when sampling (nbest N: N samples per source)")
    if rules != "paper":
        raise UserError(f"search rules {rules} are a beam search's; sampling draws")
    if sample is True:
        return SampleConfig(samples=nbest or 1)
    if nbest is not None:
        return replace(sample, samples=nbest)
    return sample


def _alignment_layer(alignments: bool | int) -> int | None:
    if alignments is False or alignments is None:
        return None
    return -1 if alignments is True else int(alignments)


def _phrases(given: Sequence[str] | str) -> list[str]:
    """A sentence's phrases: a list, or one str (one phrase, not its characters)."""
    return [given] if isinstance(given, str) else list(given)


# ----------------------------------------------------------------------------------------
# A stream of lines, as ``aiayn translate`` reads stdin or a file


class LineFormat(Protocol):
    """What a window's n-best lists are printed as (``aiayn translate``'s ``Outputs``)."""

    token_scores: bool
    alignment_layer: int | None

    def constrained(self, request: SearchRequest, vocab: Any, n: int) -> SearchRequest: ...
    def format(self, nbest: list[list[Output]], first: int) -> list[str]: ...
    def finish(self, count: int) -> None: ...


@dataclass
class TextStream:
    """Lines in (bytes, split by ``aiayn.files``' rule), their outputs out (one line each,
    flushed a window at a time). ``name``: what messages call the input; ``prompt``: "> "
    before each line is read; ``window``: lines sorted and written together; ``progress`` a
    bar on stderr (``total``: the lines, for its ETA); ``command``: whose warnings these are."""

    source: IO[bytes]
    sink: TextIO
    name: str = "<stdin>"
    prompt: bool = False
    window: int = WINDOW
    progress: bool = False
    total: int | None = None
    command: str = "translate"
    around: Callable[[Any], Any] | None = None  # --split, --markup: wraps the best lines

    def say_truncated(self, index: int, tokens: int, cap: int) -> None:
        """``on_truncate`` of ``translate_corpus``: ``index`` counts the input's lines from 0."""
        print(
            f"aiayn {self.command}: warning: {self.name}: line {index + 1}: {tokens} tokens, "
            f"more than the model's {cap} positions: truncated",
            file=sys.stderr,
        )


def translate_stream(
    stream: TextStream,
    translator: Translator,
    request: SearchRequest,
    output: LineFormat | None = None,
) -> int:
    """Translate every line of ``stream`` to its sink, one line per line, order kept; returns
    the number of lines. Memory stays flat however long the input (``Translator.windows``).

    A line that is not valid UTF-8 gets an empty output line (so outputs stay aligned with
    inputs) and the rest is translated; then ``UserError`` names those lines. A line longer
    than the model's positions is truncated and named on stderr by its line in the input.
    ``output``: what to print besides the best line (default: the best line only).
    """
    from .files import split_lines

    lines = _Lines(stream.name)
    raw = split_lines(stream.source)
    texts = lines.texts(_prompted(raw, stream.sink) if stream.prompt else raw)
    if stream.around is not None:  # the best lines, split and joined or marked up
        for best in translator.best_lines(texts, request, stream):
            stream.sink.write("".join(line + "\n" for line in best))
            stream.sink.flush()
        lines.check()
        return lines.count
    per_window = None
    if output is not None:
        per_window = partial(_output_constraints, output, translator.vocab)
    windows = translator.windows(
        texts,
        request,
        token_scores=output.token_scores if output else False,
        alignment_layer=output.alignment_layer if output else None,
        per_window=per_window,
        window=stream.window,
        progress=stream.progress,
        total=stream.total,
        on_truncate=stream.say_truncated,
    )
    first = 0
    for nbest in windows:
        printed = output.format(nbest, first) if output else [_best(o) for o in nbest]
        stream.sink.write("".join(line + "\n" for line in printed))
        stream.sink.flush()
        first += len(nbest)
    if output is not None:
        output.finish(lines.count)
    lines.check()
    return lines.count


def _output_constraints(
    output: LineFormat, vocab: Any, request: SearchRequest, n: int
) -> SearchRequest:
    """A window's request with its lines' prefixes and phrases, as ``output`` reads them."""
    return output.constrained(request, vocab, n)


def _window_constraints(built: tuple[Any, ...], request: SearchRequest, n: int) -> SearchRequest:
    """A window's request with its sentences' constraints out of all of them (``built``)."""
    first = request.first_index
    assert isinstance(first, int)  # translate_corpus numbers a window by its first line
    return replace(request, constraints=built[first : first + n])


def _best(outputs: list[Output]) -> str:
    return outputs[0].text if outputs else ""


@dataclass
class _Lines:
    """The texts of a stream's lines; one not valid UTF-8 becomes "" and is remembered, so
    that its output line keeps the others aligned and the end can name it."""

    name: str
    count: int = 0
    bad: int = 0
    first_bad: list[int] = field(default_factory=list)  # the first 10: memory stays flat

    def texts(self, raw: Iterable[bytes]) -> Iterator[str]:
        from .files import decode_line

        for line in raw:
            self.count += 1
            try:
                yield decode_line(line, self.name, self.count)
            except UserError:
                self.bad += 1
                if len(self.first_bad) < 10:
                    self.first_bad.append(self.count)
                yield ""  # an empty line translates to an empty line

    def check(self) -> None:
        if self.bad:
            shown = ", ".join(map(str, self.first_bad)) + (", ..." if self.bad > 10 else "")
            raise UserError(
                f"{self.name}: {self.bad} line(s) not valid UTF-8 (line {shown}): their outputs "
                f"are empty lines; the other {self.count - self.bad} were translated"
            )


def _prompted(raw: Iterator[bytes], sink: TextIO) -> Iterator[bytes]:
    """``raw``'s lines, "> " written to ``sink`` before each is read (and before the end)."""
    while True:
        sink.write("> ")
        sink.flush()
        line = next(raw, None)
        if line is None:
            return
        yield line
