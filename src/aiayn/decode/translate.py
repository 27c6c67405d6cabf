"""Translate a list of sentences: tokenise, batch by length, search, restore input order; and
a whole corpus, a window of lines at a time.

    from aiayn.decode import DecodeConfig, SearchRequest, translate, translate_corpus
    outputs = translate(model, lines, tokenizer, SearchRequest(DecodeConfig.preset("translation")))
    for window in translate_corpus(model, iter_lines("corpus.en"), tokenizer):
        ...  # each window's outputs, in input order, as soon as the window is done

``tokenizer`` is anything with ``encode_source(str) -> list[int]`` and ``decode(list[int]) ->
str``. Sentences are sorted by length so that a batch wastes little on padding, and batched
by the request's one policy (``aiayn.decode.request.Batching``). Empty lines give empty outputs
without touching the model; over-long inputs are truncated to the model's positions with a
warning. ``translate_corpus`` sorts within windows of ``window`` lines, so that its memory is
bounded by the window, not by the corpus; a stream's windows grow (``stream_windows``), so that
its first line is answered after one sentence's search.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import islice, repeat
from typing import Any, Protocol, TypeVar

import torch

from ..data.collate import pad_rows
from ..data.vocab import cut_source
from ..errors import UserError, UserTypeError
from ..runtime.workers import run_batches
from .beam import Hypothesis, beam_search
from .request import SearchRequest
from .sample import sample
from .shortlist import check_shortlist, shortlisted_search

WINDOW = 100_000  # lines sorted and written together: what bounds a corpus's memory

OnTruncate = Callable[[int, int, int], None]  # (index, tokens, cap)


class Tokenizer(Protocol):
    def encode_source(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class Progress(Protocol):
    """What ``decode_ids`` reports finished sentences to (a tqdm bar)."""

    def update(self, n: int) -> Any: ...


def length_batches(
    lengths: Sequence[int], batch_size: int | None, max_tokens: int | None
) -> Iterator[list[int]]:
    """Indices grouped into batches of similar length, longest first (so that a batch too
    large for memory fails at once). A batch has <= batch_size sentences and
    <= max_tokens padded tokens (a single longer sentence still forms its own batch)."""
    if batch_size is None and max_tokens is None:
        raise ValueError("give batch_size, max_tokens or both")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for i in order:
        width = lengths[batch[0]] if batch else lengths[i]  # the first is the longest
        full = (batch_size is not None and len(batch) >= batch_size) or (
            max_tokens is not None and (len(batch) + 1) * width > max_tokens
        )
        if batch and full:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def decode_ids(
    model: Any,
    sources: Sequence[Sequence[int]],
    request: SearchRequest = SearchRequest(),
    *,
    progress: bool | Progress = False,
    on_truncate: OnTruncate | None = None,
) -> list[list[Hypothesis]]:
    """Token-id sources -> n-best hypotheses per source, in input order, as ``request`` asks.

    Empty sources get no hypotheses (``[]``). Sources longer than ``request.max_src_len``
    (default: the model's positions) are truncated, keeping a final eos, with a warning; or,
    given ``on_truncate``, each is reported to it as (index, tokens, cap) instead, so that a
    caller reading a file in chunks can name the line in the file. Output lengths are capped
    at the model's positions as well. Every beam size, 1 included, is ``beam_search``: with
    k = 1 it may continue past an eos that a longer hypothesis beats under the length penalty,
    which greedy search would not (they agree when alpha = 0).

    ``progress``: True for a bar of its own, or a bar (``update``) that the caller shares
    between calls; empty sources count as done at once. Workers (``request.batching``) decode
    the batches side by side in CPU processes (``aiayn.runtime.workers``; the same outputs).
    """
    if request.shortlist is not None:
        check_shortlist(model, request.constraints, request.sampling)
    cap = positions(model, request.max_src_len)
    device = torch.device(request.device) if request.device else model_device(model)
    workers = request.batching.workers
    if workers > 1 and device.type != "cpu":
        raise ValueError(f"workers are CPU processes: give workers=1 on {device}")
    sources = fit_sources(sources, cap, request.ids.eos_id, on_truncate)
    results: list[list[Hypothesis]] = [[] for _ in sources]
    nonempty = [i for i, s in enumerate(sources) if s]
    lengths = [len(sources[i]) for i in nonempty]
    batching = request.batching
    batches = list(length_batches(lengths, batching.batch_size, batching.tokens(request.rows)))
    bar = progress_bar(len(sources), progress)
    if bar is not None:
        bar.update(len(sources) - len(nonempty))

    def decode_batch(b: int) -> list[list[Hypothesis]]:
        members = [nonempty[j] for j in batches[b]]
        return _search(model, [sources[i] for i in members], members, request, cap, device)

    for b, hyps in run_batches(decode_batch, len(batches), workers=workers):
        for j, h in zip(batches[b], hyps):
            results[nonempty[j]] = h
        if bar is not None:
            bar.update(len(batches[b]))
    if progress is True:
        bar.close()
    return results


def _search(
    model: Any,
    batch: list[list[int]],
    members: list[int],
    request: SearchRequest,
    cap: int | None,
    device: torch.device,
) -> list[list[Hypothesis]]:
    """One batch (sources ``members`` of the call) searched as ``request`` asks."""
    ids = request.ids
    src = pad_rows(batch, [], [], ids.pad_id).to(device)  # (b, longest)
    search: dict[str, Any] = dict(
        min_len=request.min_len,
        max_len_cap=cap,
        constraint=request.constraints_of(members),
        pad_id=ids.pad_id,
        bos_id=ids.bos_id,
        eos_id=ids.eos_id,
    )
    if request.shortlist is not None:
        return shortlisted_search(model, src, request.decode, request.shortlist, **search)
    if request.sampling is None:
        return beam_search(model, src, request.decode, **search)
    indices = request.indices(members)
    return sample(model, src, request.decode, request.sampling, indices=indices, **search)


def check_sentences(lines: Any, what: str = "sentences", *, stream: bool = False) -> None:
    """A one-line ``UserTypeError`` (a ``TypeError``) unless ``lines`` is a list (a sequence) of str: a str alone
    would otherwise be translated character by character, and None deep in the tokenizer.
    ``stream``: any iterable will do (its lines are checked as they are read, by the list
    each window makes), but one str or bytes."""
    if isinstance(lines, (str, bytes)):
        raise UserTypeError(
            f"{what} must be a list of str, not one {type(lines).__name__}: give [text] for "
            "one sentence"
        )
    if stream:
        if not isinstance(lines, Iterable):
            raise UserTypeError(f"{what} must be an iterable of str, not {type(lines).__name__}")
        return
    if not isinstance(lines, Sequence):
        raise UserTypeError(f"{what} must be a list of str, not {type(lines).__name__}")
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise UserTypeError(f"{what}[{i}] is {type(line).__name__}, not str")
        if not line.isascii():  # the tokenizer would fail on a lone surrogate, deep inside
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(
                    f"{what}[{i}] is not Unicode text: it holds a lone surrogate"
                ) from None


def translate(
    model: Any,
    lines: Sequence[str],
    tokenizer: Tokenizer,
    request: SearchRequest = SearchRequest(),
    *,
    progress: bool | Progress = False,
    on_truncate: OnTruncate | None = None,
) -> list[str]:
    """Sentences -> best translations, in input order; empty (blank) lines give "".

    Sources are read as ``tokenizer.encode_source`` makes them (subwords + eos), with the
    tokenizer's special ids; ``progress`` and ``on_truncate`` are ``decode_ids``'s.
    """
    check_sentences(lines, "lines")
    sources = [tokenizer.encode_source(line) for line in lines]
    with eval_mode(model):
        nbest = decode_ids(
            model, sources, request.with_ids(tokenizer), progress=progress, on_truncate=on_truncate
        )
    return [tokenizer.decode(h[0].tokens) if h else "" for h in nbest]


Out = TypeVar("Out")  # what a window's outputs are: lines, n-best lists


class WindowOutputs(Protocol[Out]):
    """What ``translate_corpus`` turns a window into (``translate``'s signature): an output
    for each of ``texts`` (a line to print, or an n-best list), the corpus's lines
    ``request.first_index``, + 1, ..."""

    def __call__(
        self,
        model: Any,
        texts: list[str],
        tokenizer: Any,
        request: SearchRequest,
        /,
        *,
        progress: bool | Progress,
        on_truncate: OnTruncate | None,
    ) -> list[Out]: ...


@dataclass(frozen=True)
class Window:
    """A window of a corpus: its lines ``texts``, the first one's number in the corpus (from
    0), the bar its sentences count on (``False``: none) and ``on_truncate`` for its lines,
    given indices in the corpus."""

    texts: list[str]
    first: int
    progress: bool | Progress
    on_truncate: OnTruncate | None


def corpus_windows(
    lines: Iterable[str],
    *,
    window: int | Iterable[int] = WINDOW,
    progress: bool = False,
    total: int | None = None,
    on_truncate: OnTruncate | None = None,
) -> Iterator[Window]:
    """A corpus read ``window`` lines at a time (or windows of the sizes ``window`` gives:
    ``stream_windows``), as ``translate_corpus`` (and ``aiayn.Translator.windows``) decode
    it: one progress bar for all (shown when ``progress``; ``total``: the corpus's lines, for
    the ETA), closed at the end."""
    sizes = repeat(_size(window)) if isinstance(window, int) else iter(window)
    check_sentences(lines, "lines", stream=True)
    bar = progress_bar(total, progress, desc="translating")
    lines, first = iter(lines), 0
    try:
        while texts := list(islice(lines, _size(next(sizes)))):
            report = None if on_truncate is None else _shifted(on_truncate, first)
            yield Window(texts, first, False if bar is None else bar, report)
            first += len(texts)
    finally:
        if bar is not None:
            bar.close()


def stream_windows(most: int = WINDOW) -> Iterator[int]:
    """The window sizes of a stream: 1, 2, 4, ... up to ``most``, then ``most`` on. The first
    line is answered after its own search alone; each window is about as long as all before it
    together, so a stream of n lines takes about log2(n) windows more than the whole call, and
    its later windows batch as well as the whole call's. A window is sorted and batched as the
    whole call is, but in other batches: the texts are the same, the scores equal to the last
    bits of float rounding (``aiayn.decode.sample`` says why)."""
    if most < 1:
        raise ValueError(f"most must be at least 1, got {most}")
    size = 1
    while True:
        yield min(size, most)
        size *= 2


def translate_corpus(
    model: Any,
    lines: Iterable[str],
    tokenizer: Tokenizer,
    request: SearchRequest = SearchRequest(),
    *,
    window: int | Iterable[int] = WINDOW,
    progress: bool = False,
    total: int | None = None,
    on_truncate: OnTruncate | None = None,
    outputs: WindowOutputs[Any] = translate,
) -> Iterator[list[Any]]:
    """The outputs of a corpus, one window at a time: ``window`` lines are read, sorted by
    length and batched within the window, and their outputs yielded in input order once the
    window is done. Memory is bounded by the window, whatever the corpus's size. ``window``
    may also be the sizes of the windows in turn (``stream_windows``: a stream's).

    ``outputs``: what a window becomes (default ``translate``: the best line of each), called
    with the request whose ``first_index`` is the window's first line in the corpus (from 0),
    a shared ``progress`` bar (shown when ``progress``; ``total``: the corpus's lines, for the
    ETA) and ``on_truncate``, which gets indices in the corpus, not in the window.
    """
    read = corpus_windows(
        lines, window=window, progress=progress, total=total, on_truncate=on_truncate
    )
    for part in read:
        yield outputs(
            model,
            part.texts,
            tokenizer,
            replace(request, first_index=part.first),
            progress=part.progress,
            on_truncate=part.on_truncate,
        )


def _size(window: int) -> int:
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    return window


def _shifted(on_truncate: OnTruncate, first: int) -> OnTruncate:
    """``on_truncate`` for a window whose first line is the corpus's line ``first``."""
    return lambda index, tokens, cap: on_truncate(first + index, tokens, cap)


@contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """Dropout off for the block (decoding, a measurement mid-training); a model that was
    training goes back to training after. Duck-typed, so scripted fake models pass through."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def positions(model: Any, max_src_len: int | None = None) -> int | None:
    """The longest source (and output) the model takes: ``max_src_len``, else the model's
    ``max_positions`` (an ensemble's), else ``cfg.max_len``."""
    if max_src_len is not None:
        return max_src_len
    if getattr(model, "max_positions", None) is not None:
        return model.max_positions
    return getattr(getattr(model, "cfg", None), "max_len", None)


def fit_sources(
    sources: Sequence[Sequence[int]],
    cap: int | None,
    eos_id: int,
    on_truncate: Callable[[int, int, int], None] | None = None,
) -> list[list[int]]:
    """Sources as lists, those longer than ``cap`` cut to it keeping a final eos: the one
    truncation rule. Each cut is reported to ``on_truncate`` as (index, tokens, cap), or else
    in one warning."""
    fitted = [list(s) for s in sources]
    if cap is None:
        return fitted
    too_long = [i for i, s in enumerate(fitted) if len(s) > cap]
    if on_truncate is not None:
        for i in too_long:
            on_truncate(i, len(fitted[i]), cap)
    elif too_long:
        warnings.warn(
            f"{len(too_long)} source(s) longer than {cap} tokens truncated "
            f"(first: line {too_long[0] + 1}, {len(fitted[too_long[0]])} tokens)",
            stacklevel=3,
        )
    for i in too_long:
        fitted[i] = cut_source(fitted[i], cap, eos_id)
    return fitted


def model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")


def progress_bar(total: int | None, progress: bool | Progress, desc: str = "decoding"):
    """A new tqdm bar on stderr (``progress`` True), the caller's bar, or None."""
    if progress is False or progress is None:
        return None
    if progress is not True:
        return progress
    from tqdm import tqdm

    return tqdm(total=total, unit="sent", desc=desc, smoothing=0.1)
