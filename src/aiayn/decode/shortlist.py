"""A vocabulary shortlist for decoding (opt-in, never the default): each sentence's output
layer covers only the ``frequent`` most frequent target pieces, the ``best`` likeliest
translations of each of its source pieces (IBM Model 1, ``aiayn.data.lexical``) and the
specials, as Marian's ``--shortlist`` and CTranslate2's vocabulary map do.

Marian and CTranslate2 take the union over a batch, so a sentence's output depends on its
batch-mates; here every sentence has its own list (one batched matmul over the rows of each),
so its output is the same in any batch. The output projection, its softmax and the top-k over
the whole vocabulary are a share of every decode step that shrinks with the list (measured in
docs/decoding.md). The search is the paper's over the smaller vocabulary, its softmax normalised over the
list, so outputs change where the best one needs a piece outside it and where the scores'
shift reorders hypotheses: the speed and BLEU are measured in docs/decoding.md.

The file (``aiayn shortlist``) is JSON, in pieces rather than ids so that it reads and diffs:
``frequent`` (target pieces, most frequent first) and ``lexical`` (source piece -> [[target
piece, t(target | source)], ...], best first), with the vocabulary's fingerprint.

    shortlist = load_shortlist("work/bible/shortlist.json", vocab, frequent=100, best=10)
    decode_ids(model, sources, config, shortlist=shortlist)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.lexical import FORMAT
from ..errors import UserError
from .beam import Hypothesis, beam_search
from .cache import decode_state, new_cache
from .config import DecodeConfig

FREQUENT, BEST = 100, 10  # Marian's first 100; best measured on the demo (docs/decoding.md)


@dataclass(frozen=True)
class Shortlist:
    """Which target ids a sentence may output: the ``frequent`` ids, its source ids' ``lexical``
    ids (both already cut to the sizes asked for) and ``always`` (pad, unk, bos, eos), first."""

    frequent: tuple[int, ...]
    lexical: dict[int, tuple[int, ...]]
    always: tuple[int, ...]
    origin: dict[str, Any] = field(default_factory=dict)  # file and sizes, for reports

    def ids(self, source: Sequence[int]) -> list[int]:
        """One sentence's list: ``always`` in order, then the rest sorted."""
        found = set(self.frequent)
        for s in source:
            found.update(self.lexical.get(s, ()))
        return list(self.always) + sorted(found - set(self.always))

    def table(self, sources: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
        """A batch's lists as (n, C) ids, padded with ``always[0]``, and (n, C) bool: which
        entries are real. Entry j of every row is ``always[j]`` for j < len(always)."""
        lists = [self.ids(source) for source in sources]
        width = max(map(len, lists))
        table = torch.full((len(lists), width), self.always[0], dtype=torch.long)
        real = torch.zeros(len(lists), width, dtype=torch.bool)
        for i, ids in enumerate(lists):
            table[i, : len(ids)] = torch.tensor(ids)
            real[i, : len(ids)] = True
        return table, real


def load_shortlist(
    path: str | os.PathLike, vocab: Any, *, frequent: int = FREQUENT, best: int = BEST
) -> Shortlist:
    """A shortlist file for ``vocab`` (the checkpoint's), cut to ``frequent`` and ``best``;
    ``UserError`` naming the file for another vocabulary or a file that is not one."""
    path = Path(path)
    if frequent < 0 or best < 0:
        raise UserError(f"shortlist sizes must be at least 0, got frequent={frequent}, best={best}")
    if frequent == best == 0:
        raise UserError(
            "shortlist sizes frequent=0 and best=0 leave only the special pieces: every output "
            "would be empty; give either at least 1"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a shortlist (aiayn shortlist writes them): {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f'{path}: not a shortlist (no "format": "{FORMAT}")')
    if data.get("vocab_fingerprint") != vocab.fingerprint:
        raise UserError(
            f"{path}: built for another vocabulary (fingerprint "
            f"{str(data.get('vocab_fingerprint'))[:12]}, the checkpoint's is "
            f"{vocab.fingerprint[:12]}); rebuild it from the checkpoint's dataset"
        )

    def id_of(piece: str) -> int:
        i = vocab.piece_to_id(piece)
        if i == vocab.unk_id and piece != vocab.id_to_piece(vocab.unk_id):
            raise UserError(f"{path}: piece {piece!r} is not in the vocabulary")
        return i

    try:
        return Shortlist(
            frequent=tuple(id_of(p) for p in data["frequent"][:frequent]),
            lexical={
                id_of(s): tuple(id_of(t) for t, _ in targets[:best])
                for s, targets in data["lexical"].items()
            },
            always=(vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id),
            origin={"file": str(path), "frequent": frequent, "best": best},
        )
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{path}: not a shortlist's frequent/lexical lists: {e!r}") from None


class Shortlisted:
    """A ``Transformer``'s decoding interface (``encode``, ``src_mask``, ``new_cache``,
    ``decode_step``) where each sentence has its own vocabulary: token j of sentence i is the
    model's ``table[i, j]``.

    The output layer of sentence i is the tied embedding's rows ``table[i]`` (section 3.4: the
    pre-softmax projection shares the embedding matrix), applied to the model's decoder output
    (``decode.cache.decode_state``) of its beams by one batched matmul whose bias gives padding entries logit
    -inf, so the softmax is over the list. A sentence's outputs thus never depend on the other
    sentences of its batch.
    """

    def __init__(self, model: Any, table: Tensor, real: Tensor) -> None:
        self.model = model
        weight = model.tgt_embed.tokens.weight  # (V, d_model)
        table, real = table.to(weight.device), real.to(weight.device)
        bias = torch.zeros(real.shape, dtype=weight.dtype, device=weight.device)
        bias.masked_fill_(~real, float("-inf"))  # padding entries are never chosen
        output_bias = getattr(model.generator, "bias", None)
        if callable(output_bias):  # int8's quantized Linear gives its bias by a method
            output_bias = output_bias()
        if output_bias is not None:
            bias += output_bias.to(weight.dtype)[table]  # the model's own (``output_bias``)
        self.start = _Lists(table, weight[table], bias[:, None, :])  # (n, C), (n, C, d), (n, 1, C)

    def encode(self, src: Tensor) -> Tensor:
        return self.model.encode(src)

    def src_mask(self, src: Tensor) -> Tensor:
        return self.model.src_mask(src)

    def new_cache(
        self, memory: Tensor, src_mask: Tensor, max_len: int | None = None
    ) -> _ShortlistCache:
        return _ShortlistCache(new_cache(self.model, memory, src_mask, max_len=max_len), self.start)

    @torch.no_grad()
    def decode_step(self, tgt_in: Tensor, cache: _ShortlistCache) -> Tensor:
        """tgt_in (n*b, m) entries of the sentences' lists -> logits (n*b, C) over them."""
        lists = cache.lists
        n = lists.ids.size(0)
        b = tgt_in.size(0) // n  # beams per sentence: rows are sentence-major
        ids = lists.ids.repeat_interleave(b, dim=0).gather(1, tgt_in)  # (n*b, m) model ids
        h = decode_state(self.model, ids, cache.inner).view(n, b, -1)  # (n, b, d_model)
        return torch.baddbmm(lists.bias, h, lists.weight.transpose(1, 2)).view(n * b, -1)


@dataclass
class _Lists:
    """The lists of the sentences still decoding: ids (n, C), weight (n, C, d), bias (n, 1, C)
    (0, or -inf for padding)."""

    ids: Tensor
    weight: Tensor
    bias: Tensor

    def keep(self, sentences: Tensor) -> _Lists:
        return _Lists(*(t.index_select(0, sentences) for t in (self.ids, self.weight, self.bias)))


@dataclass
class _ShortlistCache:
    """The model's cache and the live sentences' lists, which leave with their sentences."""

    inner: Any
    lists: _Lists

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.inner.select(rows, sentences=sentences)
        if sentences is not None:
            self.lists = self.lists.keep(sentences)


def check_shortlist(model: Any, constraint: Any, sampling: Any) -> None:
    """Refuse what a shortlist cannot serve: it restricts one model's beam search."""
    if getattr(model, "tgt_embed", None) is None:
        raise UserError(
            f"a shortlist restricts one model's output layer (given: {type(model).__name__})"
        )
    if sampling is not None:
        raise UserError("a shortlist restricts the beam search; sampling draws from every piece")
    per_source = constraint if isinstance(constraint, Sequence) else [constraint]
    if any(c is not None for c in per_source):
        raise UserError("a shortlist and constraints cannot be combined (they name model ids)")


def shortlisted_search(
    model: Any, src: Tensor, config: DecodeConfig, shortlist: Shortlist, **search: Any
) -> list[list[Hypothesis]]:
    """``beam_search(model, src, config, **search)`` with each sentence's shortlist; hypotheses
    come back in the model's ids."""
    table, real = shortlist.table(src.tolist())  # pad and eos are specials: in no lexical entry
    for name in ("pad_id", "bos_id", "eos_id"):  # the specials come first in every list
        search[name] = shortlist.always.index(search[name])
    found = beam_search(Shortlisted(model, table, real), src, config, **search)
    to_model = table.tolist()  # sentence i's entry j -> the model's id
    return [
        [
            Hypothesis([to_model[i][j] for j in h.tokens], h.score, h.log_prob, h.length)
            for h in hyps
        ]
        for i, hyps in enumerate(found)
    ]
