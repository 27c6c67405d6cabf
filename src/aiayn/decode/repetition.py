"""Repetition guards (not in the paper): what a small or under-trained model needs when it
loops ("...mentmentment..."), with the definitions of transformers' ``generate``.

``no_repeat_ngram_size`` n: a token that would complete an n-gram already in the output is
impossible (log-probability -inf). transformers' ``NoRepeatNGramLogitsProcessor``, fairseq's
``--no-repeat-ngram-size`` and CTranslate2's ``no_repeat_ngram_size`` all ban this same set;
CTranslate2 bans on the logits, so the tokens left are renormalised: another beam search.

``repetition_penalty`` p (CTRL, Keskar et al. 2019): the score s of every token already in the
output becomes s * p when s < 0, else s / p. transformers' beam search applies it to the
step's log-probabilities (``log_softmax`` first, then its logits processors), and so does ours:
the penalised log-probabilities are what the hypotheses' scores add up. CTranslate2 applies
the same formula to the logits, before normalising, so its penalty is another search: the
CTranslate2 engine refuses both guards (``capabilities.check_supported``).

Both read each row's output so far, ``prefixes`` (rows, t-1), the tokens after the start token
(which is never an output token, so the n-grams and the penalised set are transformers').
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .config import DecodeConfig

NEG_INF = float("-inf")


def guard_repetition(lprobs: Tensor, prefixes: Tensor, config: DecodeConfig) -> Tensor:
    """(rows, V) log-probabilities of the step after ``prefixes`` (rows, t-1) with repeated
    tokens penalised (``config.repetition_penalty`` != 1) and n-gram repeats banned
    (``config.no_repeat_ngram_size`` > 0)."""
    if not config.guards_repetition:  # a branch per step, no work: the search as it was
        return lprobs
    ngram, penalty = config.no_repeat_ngram_size, config.repetition_penalty
    if penalty != 1.0 and prefixes.size(1):
        lprobs = penalize_repeats(lprobs, prefixes, penalty)
    if ngram and prefixes.size(1) >= ngram:
        lprobs = ban_repeated_ngrams(lprobs, prefixes, ngram)
    return lprobs


def penalize_repeats(lprobs: Tensor, prefixes: Tensor, penalty: float) -> Tensor:
    """transformers' ``RepetitionPenaltyLogitsProcessor`` on (rows, V) scores: each token of
    the row's prefix (rows, t-1) scores s * penalty if s < 0 else s / penalty."""
    seen = prefixes.new_zeros(lprobs.shape, dtype=lprobs.dtype)
    seen.scatter_(1, prefixes, 1.0)  # (rows, V) 1 where the token occurred
    penalised = torch.where(lprobs < 0, lprobs * penalty, lprobs / penalty)
    return torch.where(seen > 0, penalised, lprobs)


def ban_repeated_ngrams(lprobs: Tensor, prefixes: Tensor, n: int) -> Tensor:
    """(rows, V) scores with -inf for every token that would complete an n-gram of the row's
    prefix (rows, L), L >= n: the last tokens of each n-gram whose first n-1 are the prefix's
    last n-1."""
    windows = prefixes.unfold(1, n, 1)  # (rows, L-n+1, n) every n-gram of the prefix
    tail = prefixes[:, prefixes.size(1) - n + 1 :]  # (rows, n-1)
    match = (windows[:, :, :-1] == tail[:, None, :]).all(-1)  # (rows, L-n+1)
    rows, where = match.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return lprobs
    return lprobs.index_put((rows, windows[rows, where, -1]), lprobs.new_tensor(NEG_INF))
