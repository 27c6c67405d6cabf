"""Export to CTranslate2, built with its converter API (``ctranslate2.specs``) from our weights.

CTranslate2's ``TransformerSpec`` is the layout of OpenNMT's Transformer, which is ours: a fused
Q/K/V projection for self-attention, a fused K/V projection for encoder-decoder attention,
post-LN (or pre-LN with a final norm on each stack), scaled embeddings and a tied output layer.
The positional table is stored explicitly, so ours (or the learned one of Table 3 row E) is
used as it is. The SentencePiece model is copied beside ``model.bin`` as ``spm.model``; sources
are given as pieces and CTranslate2 appends eos itself, as our data pipeline does.

    import ctranslate2, sentencepiece as spm
    sp, tr = spm.SentencePieceProcessor(model_file=f"{OUT}/spm.model"), ctranslate2.Translator(OUT)
    print(sp.decode(tr.translate_batch([sp.encode("In the beginning", out_type=str)])[0].hypotheses[0]))

CTranslate2 ranks finished hypotheses by ``log P / |Y|^alpha``, not by the paper's GNMT
penalty; ``translate_pieces`` re-ranks its n-best list with ours and applies our length limits,
which reproduces our beam search (see ``scripts/export_agreement.py`` for the measured share).
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..decode import DecodeConfig, gnmt_length_penalty
from ..model import Transformer
from .common import (
    ExportError,
    check_vocab_size,
    export_dir,
    refuse_decoding_form,
    refuse_unsupported,
    require,
)

TARGET = "CTranslate2"
VOCAB_FILE = "spm.model"
# CTranslate2 stops a sentence once beam x patience outputs have finished, ours once no live
# prefix can win: 1 stops too soon on 1.1% of the demo's test verses, 3 on none (docs/decoding.md).
PATIENCE = 4.0


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()


def _linear(spec: Any, linear: torch.nn.Linear) -> None:
    spec.weight = _array(linear.weight)
    spec.bias = _array(linear.bias)


def _norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _positions(embed: torch.nn.Module) -> np.ndarray:
    """The (max_len, d_model) table an ``Embedding`` adds: learned (Table 3 row E) or sinusoidal."""
    return _array(embed.learned.weight if hasattr(embed, "learned") else embed.pe)


def ctranslate2_spec(model: Transformer, vocab: Any) -> Any:
    """A validated ``ctranslate2.specs.TransformerSpec`` holding our weights and vocabulary."""
    require("ctranslate2", TARGET)
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.cfg
    refuse_unsupported(c, TARGET, supported={"norm", "positional"})
    refuse_decoding_form(model)
    check_vocab_size(c, vocab)
    spec = transformer_spec.TransformerSpec.from_config(
        (c.N_enc, c.N_dec), c.h, pre_norm=c.norm == "pre", activation=common_spec.Activation.RELU
    )
    spec.config.layer_norm_epsilon = model.encoder[0].self_attn_norm.eps
    spec.config.add_source_eos = True
    spec.config.decoder_start_token = vocab.id_to_piece(vocab.bos_id)
    for name, i in (
        ("unk_token", vocab.unk_id),
        ("bos_token", vocab.bos_id),
        ("eos_token", vocab.eos_id),
    ):
        setattr(spec.config, name, vocab.id_to_piece(i))
    enc, dec = spec.encoder, spec.decoder
    enc.position_encodings.encodings = _positions(model.src_embed)
    dec.position_encodings.encodings = _positions(model.tgt_embed)
    enc.embeddings[0].weight = _array(model.src_embed.tokens.weight)
    dec.embeddings.weight = _array(model.tgt_embed.tokens.weight)
    dec.projection.weight = _array(model.generator.weight)  # tied: CTranslate2 aliases equal arrays
    if c.norm == "pre":
        _norm(enc.layer_norm, model.enc_norm)
        _norm(dec.layer_norm, model.dec_norm)
    for ours, theirs in zip(model.encoder, enc.layer):
        _linear(theirs.self_attention.linear[0], ours.self_attn.W_QKV)
        _linear(theirs.self_attention.linear[1], ours.self_attn.W_O)
        _norm(theirs.self_attention.layer_norm, ours.self_attn_norm)
        _linear(theirs.ffn.linear_0, ours.feed_forward.W_1)
        _linear(theirs.ffn.linear_1, ours.feed_forward.W_2)
        _norm(theirs.ffn.layer_norm, ours.ffn_norm)
    for ours, theirs in zip(model.decoder, dec.layer):
        _linear(theirs.self_attention.linear[0], ours.self_attn.W_QKV)
        _linear(theirs.self_attention.linear[1], ours.self_attn.W_O)
        _norm(theirs.self_attention.layer_norm, ours.self_attn_norm)
        _linear(theirs.attention.linear[0], ours.src_attn.W_Q)
        _linear(theirs.attention.linear[1], ours.src_attn.W_KV)
        _linear(theirs.attention.linear[2], ours.src_attn.W_O)
        _norm(theirs.attention.layer_norm, ours.src_attn_norm)
        _linear(theirs.ffn.linear_0, ours.feed_forward.W_1)
        _linear(theirs.ffn.linear_1, ours.feed_forward.W_2)
        _norm(theirs.ffn.layer_norm, ours.ffn_norm)
    pieces = [vocab.id_to_piece(i) for i in range(len(vocab))]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.validate()
    return spec


def export_ctranslate2(
    model: Transformer,
    vocab: Any,
    out: str | os.PathLike,
    quantization: str | None = None,
    source: str | None = None,
    *,
    fingerprint: str | None = None,
) -> Path:
    """Write a CTranslate2 model directory (``model.bin``, vocabulary, and ``spm.model`` when
    ``vocab.path`` names one).

    ``quantization``: CTranslate2's weight type, e.g. "int8" (None keeps float32).
    ``fingerprint``: the source checkpoint's, recorded in the marker (``export.engine``'s cache).
    """
    require("ctranslate2", TARGET)
    from ctranslate2.converters.converter import Converter
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    if quantization is not None and quantization not in ACCEPTED_MODEL_TYPES:
        raise ExportError(
            f"quantization {quantization!r} is not one of CTranslate2's: {', '.join(ACCEPTED_MODEL_TYPES)}"
        )
    spec = ctranslate2_spec(model, vocab)

    class _FromSpec(Converter):  # the converter API, fed with a spec built in memory
        def _load(self) -> Any:
            return spec

    info = {"format": "ctranslate2", "quantization": quantization, "source": source}
    if fingerprint is not None:
        info["fingerprint"] = fingerprint
    with export_dir(out, info) as tmp:
        _FromSpec().convert(str(tmp), quantization=quantization, force=True)
        if vocab.path is not None:  # a vocabulary without a file: made-up pieces (benchmarks)
            shutil.copyfile(vocab.path, tmp / VOCAB_FILE)
    return Path(out)


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

    CTranslate2 searches with ``config.beam`` and returns all its finished hypotheses with
    scores ``log P / |Y|^alpha`` (|Y| counting eos, as ``return_end_token`` keeps it); these are
    turned back into log P and re-ranked by the paper's GNMT penalty. Each source gets our
    output limit ``max_len_a * (len + 1) + max_len_b`` (+1: eos), but CTranslate2 takes one per
    call: sources sorted by length are searched in batches at the batch's largest limit, and
    the few whose search reached their own limit are searched again at it.
    ``patience``: CTranslate2 stops a sentence once ``beam * patience`` hypotheses have
    finished (keeping those its own ranking puts first), where our search stops only when no
    live one can win; ``PATIENCE`` lets it go on long enough to find ours on a trained model
    (measured, not proven: a model with many near-tied short outputs may need more). Pieces
    in ``never`` (pad and bos) are never generated, as in our search. ``prefixes``: per source,
    the pieces its outputs start with (``target_prefix``), or None. ``sampling`` (a
    ``SampleConfig``): draw ``samples`` outputs with CTranslate2's sampler instead of searching
    (its ``seed`` is not used: CTranslate2 seeds its sampler once per process and thread).
    ``on_done(n)``: n more sources are done (a progress bar's ``update``). Every batch is
    queued at once, so that a translator with several replicas (``inter_threads``) searches
    them side by side; results are read in order.
    """
    limits = config.max_len(torch.tensor([len(s) + 1 for s in sources]), max_len_cap).tolist()
    search = _search_options(config, sampling, patience)
    keep = config.nbest if sampling is None else sampling.samples

    def submit(members: list[int], limit: int) -> list[Any]:
        """The batch's search, queued: with ``inter_threads`` > 1 batches run side by side."""
        return translator.translate_batch(
            [list(sources[i]) for i in members],
            target_prefix=None if prefixes is None else [_list(prefixes[i]) for i in members],
            max_decoding_length=limit,
            min_decoding_length=0,
            max_input_length=0,
            return_scores=True,
            return_end_token=True,
            suppress_sequences=[[piece] for piece in never],
            max_batch_size=max_batch_size,
            asynchronous=True,
            **search,
        )

    def collect(members: list[int], pending: list[Any]) -> list[list[PieceHypothesis]]:
        found = []
        for i, result in zip(members, (p.result() for p in pending)):
            hyps = _hypotheses(
                result.hypotheses, result.scores, search["length_penalty"], config.alpha, eos_piece
            )
            if prefixes is not None and prefixes[i]:
                hyps = _rescored(translator, sources[i], prefixes[i], hyps, config.alpha)
            found.append(hyps)
        return found

    # An empty line gives an empty output without the model, as in decode_ids.
    nonempty = sorted((i for i, s in enumerate(sources) if s), key=lambda i: limits[i])
    outputs: list[list[PieceHypothesis]] = [[] for _ in sources]
    again: list[int] = []  # sentences whose search reached their own limit: searched again at it
    queued = []
    for members in _batches(nonempty, limits, max_batch_size, exact=sampling is not None):
        limit = max(limits[i] for i in members)
        queued.append((members, limit, submit(members, limit)))
    for members, limit, pending in queued:
        for i, hyps in zip(members, collect(members, pending)):
            # The longest hypothesis kept finished in the step the search stopped (fewer are
            # dropped than finish in that step): before its own limit, the batch's changed nothing.
            if limits[i] < limit and max(h.length for h in hyps) >= limits[i]:
                again.append(i)
            else:
                outputs[i] = _best_first(hyps)[:keep]
        if on_done is not None:
            on_done(sum(1 for i in members if outputs[i]))
    searched_again = [
        (members, submit(members, limits[members[0]]))
        for members in _batches(again, limits, max_batch_size, exact=True)
    ]
    for members, pending in searched_again:
        for i, hyps in zip(members, collect(members, pending)):
            outputs[i] = _best_first(hyps)[:keep]
        if on_done is not None:
            on_done(len(members))
    return outputs


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
