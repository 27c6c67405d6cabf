"""BLEU at every checkpoint: beam search on the first N pairs of the valid split, scored as
``aiayn evaluate`` scores a test set (SacreBLEU and the paper's tokenised BLEU).

The binarised dataset holds ids, not text: the sources are decoded from the ids it holds
(subwords + eos, as the model reads them), and the references are its target ids spelled
back with the vocabulary, so the score is against the text as the vocabulary normalises it
(SentencePiece's NFKC; a piece unknown to it is lost). No raw-text file is needed, and the
score moves as the test score does, but it is no substitute for ``aiayn evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..data import TokenDataset
from ..data.pieces import AnyVocab
from ..decode import DecodeConfig, SearchRequest, decode_ids

# The request's default batching is evaluate's: the same batches decode to the same
# hypotheses, so the score logged here is the one `aiayn evaluate` gives the same weights.
from ..decode.translate import eval_mode
from ..metrics import paper_bleu, sacre_bleu
from ..model import Transformer


@dataclass(frozen=True)
class BleuSample:
    sources: list[list[int]]  # subword ids + eos, as the model reads them
    references: list[str]

    @classmethod
    def first(cls, data: TokenDataset, vocab: AnyVocab, n: int) -> BleuSample:
        """The first ``n`` pairs of ``data`` (all of them when it has fewer)."""
        indices = range(min(n, len(data)))
        return cls(
            sources=[[*map(int, data.src(i)), vocab.eos_id] for i in indices],
            references=[vocab.decode(data.tgt(i)) for i in indices],
        )


@torch.no_grad()
def valid_bleu(
    model: Transformer, vocab: AnyVocab, sample: BleuSample, decode: DecodeConfig, *, lang: str
) -> dict[str, Any]:
    """SacreBLEU (``valid_bleu``, with its signature) and the paper's BLEU of the model's
    translations of ``sample``; in eval mode (no dropout: deterministic), mode restored."""
    with eval_mode(model):
        nbest = decode_ids(model, sample.sources, SearchRequest(decode))
    hyps = [vocab.decode(h[0].tokens) if h else "" for h in nbest]
    refs = [sample.references]
    score, signature = sacre_bleu(hyps, refs)
    return {
        "valid_bleu": score,
        "valid_paper_bleu": paper_bleu(hyps, refs, lang=lang),
        "valid_bleu_signature": signature,
    }
