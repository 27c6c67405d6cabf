"""The paper's search, run by a CTranslate2 translator: what ``--engine ctranslate2`` decodes
with (``export.engine``), on a model that ``export.ctranslate2`` exported.

CTranslate2 ranks finished hypotheses by ``log P / |Y|^alpha``, not by the paper's GNMT
penalty, stops a sentence by its own rule, and takes one output limit per call. So
``search_pieces`` asks it for every hypothesis it finishes, turns their scores back into log P,
re-ranks them by ours, and searches again, at their own limit, the few sentences that a shared
batch limit let run longer than ours would: its outputs are ours (``scripts/export_agreement.py``
measures the share, docs/decoding.md). Sources and outputs are SentencePiece pieces.

    found = search_pieces(ctranslate2.Translator(OUT), [sp.encode("In the beginning", out_type=str)])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..decode import DecodeConfig, gnmt_length_penalty
from .common import ExportError

# CTranslate2 stops a sentence once beam x patience outputs have finished, ours once no live
# prefix can win: this many lets it run until it finds ours on a trained model (docs/decoding.md).
PATIENCE = 4.0


@dataclass(frozen=True)
class PieceHypothesis:
    """One output of ``search_pieces``: pieces without eos, the GNMT score, log P, and |Y|
    (eos counted when the output ended with one)."""

    pieces: list[str]
    score: float
    log_prob: float
    length: int


def translate_pieces(
    translator: Any,
    sources: Sequence[Sequence[str]],
    config: DecodeConfig = DecodeConfig(),
    **options: Any,
) -> list[list[str]]:
    """Our beam search, run by CTranslate2: sources as pieces (no eos) -> best outputs as pieces.

    ``options``: those of ``search_pieces``. ``config.nbest`` > 1 is refused, since the best
    output alone comes back (``search_pieces`` returns the n-best lists).
    """
    if config.nbest != 1:
        raise ExportError(
            f"translate_pieces returns the best output of each source: nbest={config.nbest} "
            "cannot be honoured; give nbest=1"
        )
    return [
        hyps[0].pieces if hyps else []
        for hyps in search_pieces(translator, sources, config, **options)
    ]


def search_pieces(
    translator: Any,
    sources: Sequence[Sequence[str]],
    config: DecodeConfig = DecodeConfig(),
    *,
    max_len_cap: int | None = None,
    patience: float = PATIENCE,
    max_batch_size: int = 64,
    eos_piece: str = "</s>",
    never: Sequence[str] = ("<pad>", "<s>"),
    prefixes: Sequence[Sequence[str] | None] | None = None,
    sampling: Any = None,
    on_done: Callable[[int], Any] | None = None,
) -> list[list[PieceHypothesis]]:
    """Our beam search (or sampling), run by CTranslate2: sources as pieces (no eos) -> the
    ``config.nbest`` best outputs of each, by the paper's ranking; ``[]`` for an empty source.

    Each source gets our output limit ``max_len_a * (len + 1) + max_len_b`` (+1: eos), but
    CTranslate2 takes one per call: sources sorted by limit are searched in batches of
    ``max_batch_size`` at the batch's largest limit (``_search_batches``), and the few whose
    search reached their own limit are searched again at it (``_search_again``).
    ``patience``: CTranslate2 stops a sentence once ``beam * patience`` hypotheses have
    finished (keeping those its own ranking puts first), where our search stops only when no
    live one can win; ``PATIENCE`` lets it go on long enough to find ours on a trained model
    (measured, not proven: a model with many near-tied short outputs may need more). Pieces
    in ``never`` (pad and bos) are never generated, as in our search. ``prefixes``: per source,
    the pieces its outputs start with (``target_prefix``), or None. ``sampling`` (a
    ``SampleConfig``): draw ``samples`` outputs with CTranslate2's sampler instead of searching
    (its ``seed`` is not used: CTranslate2 seeds its sampler once per process and thread).
    ``on_done(n)``: n more sources are done (a progress bar's ``update``).
    """
    search = _Search(
        translator,
        sources,
        prefixes,
        options=_search_options(config, sampling, patience)
        | dict(max_batch_size=max_batch_size, suppress_sequences=[[piece] for piece in never]),
        alpha=config.alpha,
        eos_piece=eos_piece,
        keep=config.nbest if sampling is None else sampling.samples,
    )
    limits = config.max_len(torch.tensor([len(s) + 1 for s in sources]), max_len_cap).tolist()
    # An empty line gives an empty output without the model, as in decode_ids.
    nonempty = sorted((i for i, s in enumerate(sources) if s), key=lambda i: limits[i])
    outputs: list[list[PieceHypothesis]] = [[] for _ in sources]
    batches = _batches(nonempty, limits, max_batch_size, exact=sampling is not None)
    again = _search_batches(search, batches, limits, outputs, on_done)
    _search_again(search, again, limits, outputs, on_done)
    return outputs


@dataclass(frozen=True)
class _Search:
    """What every batch of one ``search_pieces`` call shares."""

    translator: Any
    sources: Sequence[Sequence[str]]
    prefixes: Sequence[Sequence[str] | None] | None
    options: dict[str, Any]  # translate_batch's search options (``_search_options``'s and more)
    alpha: float
    eos_piece: str
    keep: int  # outputs per source: nbest, or samples

    def submit(self, members: list[int], limit: int) -> list[Any]:
        """The batch's search, queued (``asynchronous``): with ``inter_threads`` > 1 the
        translator's replicas search queued batches side by side."""
        return self.translator.translate_batch(
            [list(self.sources[i]) for i in members],
            target_prefix=None
            if self.prefixes is None
            else [_list(self.prefixes[i]) for i in members],
            max_decoding_length=limit,
            min_decoding_length=0,
            max_input_length=0,
            return_scores=True,
            return_end_token=True,
            asynchronous=True,
            **self.options,
        )

    def collect(self, members: list[int], pending: list[Any]) -> list[list[PieceHypothesis]]:
        """A queued batch's hypotheses, in ``members``' order, with our scores."""
        found = []
        for i, result in zip(members, (p.result() for p in pending)):
            theirs = self.options["length_penalty"]
            hyps = _hypotheses(result.hypotheses, result.scores, theirs, self.alpha, self.eos_piece)
            prefix = self.prefixes[i] if self.prefixes is not None else None
            if prefix:
                hyps = _rescored(self.translator, self.sources[i], prefix, hyps, self.alpha)
            found.append(hyps)
        return found


def _search_batches(
    search: _Search,
    batches: list[list[int]],
    limits: list[int],
    outputs: list[list[PieceHypothesis]],
    on_done: Callable[[int], Any] | None,
) -> list[int]:
    """Every batch searched at its largest limit, all queued at once and read in order; fills
    ``outputs`` and returns the sentences to search again at their own, smaller limit."""
    queued = []
    for members in batches:
        limit = max(limits[i] for i in members)
        queued.append((members, limit, search.submit(members, limit)))
    again: list[int] = []
    for members, limit, pending in queued:
        for i, hyps in zip(members, search.collect(members, pending)):
            # The longest hypothesis kept finished in the step the search stopped (fewer are
            # dropped than finish in that step): before its own limit, the batch's changed nothing.
            if limits[i] < limit and max(h.length for h in hyps) >= limits[i]:
                again.append(i)
            else:
                outputs[i] = _best_first(hyps)[: search.keep]
        if on_done is not None:
            on_done(sum(1 for i in members if outputs[i]))
    return again


def _search_again(
    search: _Search,
    again: list[int],
    limits: list[int],
    outputs: list[list[PieceHypothesis]],
    on_done: Callable[[int], Any] | None,
) -> None:
    """The sentences ``_search_batches`` left, searched at their own limit (one call per
    limit), filling their ``outputs``."""
    size = search.options["max_batch_size"]
    queued = [
        (members, search.submit(members, limits[members[0]]))
        for members in _batches(again, limits, size, exact=True)
    ]
    for members, pending in queued:
        for i, hyps in zip(members, search.collect(members, pending)):
            outputs[i] = _best_first(hyps)[: search.keep]
        if on_done is not None:
            on_done(len(members))


def _batches(members: list[int], limits: list[int], size: int, *, exact: bool) -> list[list[int]]:
    """``members`` (sorted by limit) in batches of ``size`` (0: all in one), each to be searched
    at its largest limit; ``exact``: one batch per limit (CTranslate2 splits it by ``size``)."""
    if exact:
        groups: dict[int, list[int]] = defaultdict(list)
        for i in members:
            groups[limits[i]].append(i)
        return list(groups.values())
    size = size or len(members)
    return [members[j : j + size] for j in range(0, len(members), size)]


def _search_options(config: DecodeConfig, sampling: Any, patience: float) -> dict[str, Any]:
    """CTranslate2's options for the paper's beam search, or for sampling (beam 1, log P
    unnormalised: length_penalty 0)."""
    if sampling is None:
        return dict(
            beam_size=config.beam,
            patience=patience,
            num_hypotheses=round(config.beam * patience),  # all it finishes, for our ranking
            length_penalty=config.alpha,
        )
    return dict(
        beam_size=1,
        num_hypotheses=sampling.samples,
        length_penalty=0.0,
        sampling_topk=sampling.top_k,
        sampling_topp=sampling.top_p,
        sampling_temperature=sampling.temperature,
    )


def _list(prefix: Sequence[str] | None) -> list[str] | None:
    return None if prefix is None else list(prefix)


def _hypotheses(
    hypotheses: list[list[str]], scores: list[float], theirs: float, alpha: float, eos_piece: str
) -> list[PieceHypothesis]:
    """CTranslate2's hypotheses with our scores, each's final eos removed; its ``scores`` are
    log P / |Y|^theirs, ours log P / lp(|Y|)."""
    found = []
    for hyp, score in zip(hypotheses, scores):
        n = len(hyp)
        log_prob = score * n**theirs
        ended = bool(hyp) and hyp[-1] == eos_piece
        pieces = hyp[:-1] if ended else list(hyp)
        found.append(PieceHypothesis(pieces, log_prob / gnmt_length_penalty(n, alpha), log_prob, n))
    return found


def _rescored(
    translator: Any,
    source: Sequence[str],
    prefix: Sequence[str],
    found: list[PieceHypothesis],
    alpha: float,
) -> list[PieceHypothesis]:
    """Hypotheses that start with ``prefix``, with its log P added: CTranslate2's scores sum
    the generated tokens only (still normalised by the whole length), ours count every token.
    ``score_batch`` appends eos to the prefix; that last log-probability is left out."""
    log_probs = translator.score_batch([list(source)], [list(prefix)])[0].log_probs[:-1]
    before = sum(log_probs)
    return [
        PieceHypothesis(
            h.pieces,
            (h.log_prob + before) / gnmt_length_penalty(h.length, alpha),
            h.log_prob + before,
            h.length,
        )
        for h in found
    ]


def _best_first(found: list[PieceHypothesis]) -> list[PieceHypothesis]:
    """By the GNMT score, best first, as ours ranks beams and samples; ties keep CTranslate2's
    order (``sorted`` is stable)."""
    return sorted(found, key=lambda h: -h.score)
