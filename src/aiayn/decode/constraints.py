"""Target prefixes and lexical constraints, as a ``Constraint`` for beam search and sampling.

``OutputConstraint(prefix, phrases)`` makes an output start with the token ids ``prefix`` and
contain every phrase of ``phrases`` (each a run of token ids) somewhere. How:

* while the prefix is not out, the next prefix token is the only one allowed;
* eos is forbidden until every phrase has appeared;
* a token is allowed only if what the unmet phrases still need afterwards fits in the tokens
  left before the length limit. "Need" is the unmet phrases' total length minus the longest
  start of one of them that the output now ends with, an upper bound on the tokens still
  required (it gives no credit for two phrases overlapping), so the forced tokens come a
  little early rather than too late. Following the phrase in progress (or starting the first
  one) lowers the need by one token a step, so some token is always allowed and every output,
  finished by eos or cut at the length limit, holds all the phrases.

The limit of so simple a scheme: hypotheses that have met their constraints and those that
have not compete in one beam (grid or dynamic beam allocation would give each count of met
constraints its own share), and a phrase the model finds unlikely is only placed when the
length budget runs out, often at the end of a long output. Phrases match as token ids: a
phrase encoded alone must appear with that segmentation (for SentencePiece, whole words).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..data.vocab import EOS_ID, UNK_ID
from ..errors import UserError
from .beam import AllBut


class OutputState(NamedTuple):
    t: int  # tokens out so far
    met: frozenset[int]  # indices of the phrases that have appeared
    tail: tuple[int, ...]  # the last (longest phrase - 1) tokens
    max_len: int  # this output's limit on |Y|


class OutputConstraint:
    """Start with ``prefix``, contain every one of ``phrases``; ``where`` names them in errors
    (e.g. "--constraints c.txt: line 3")."""

    def __init__(
        self,
        prefix: Sequence[int] = (),
        phrases: Sequence[Sequence[int]] = (),
        *,
        where: str = "constraint",
        eos_id: int = EOS_ID,
    ) -> None:
        self.prefix = tuple(prefix)
        self.phrases = [tuple(p) for p in phrases if p]
        self.where, self.eos_id = where, eos_id
        self.window = max((len(p) for p in self.phrases), default=1) - 1

    def start(self, source: Sequence[int], max_len: int) -> OutputState:
        need = len(self.prefix) + sum(map(len, self.phrases))
        if need > max_len:
            raise UserError(
                f"{self.where}: the prefix and phrases take {need} tokens, more than the "
                f"{max_len} this output may have"
            )
        return OutputState(0, frozenset(), (), max_len)

    def allowed(self, state: OutputState) -> Sequence[int] | None:
        if state.t < len(self.prefix):
            return [self.prefix[state.t]]
        unmet = [i for i in range(len(self.phrases)) if i not in state.met]
        if not unmet:
            return None
        left = state.max_len - state.t - 1  # tokens left after this one
        if sum(len(self.phrases[i]) for i in unmet) <= left:
            return AllBut({self.eos_id})  # any token keeps the need within budget
        candidates = {tok for i in unmet for tok in self.phrases[i]}
        return sorted(tok for tok in candidates if self._need(self.advance(state, tok)) <= left)

    def advance(self, state: OutputState, token: int) -> OutputState:
        seen = state.tail + (token,)
        met = state.met | {i for i, p in enumerate(self.phrases) if seen[-len(p) :] == p}
        tail = seen[-self.window :] if self.window else ()
        return OutputState(state.t + 1, frozenset(met), tail, state.max_len)

    def _need(self, state: OutputState) -> int:
        """Tokens the unmet phrases still need at most (no credit for overlaps between them)."""
        unmet = [p for i, p in enumerate(self.phrases) if i not in state.met]
        started = [_progress(p, state.tail) for p in unmet]
        return sum(map(len, unmet)) - max(started, default=0)


def text_constraint(
    tokenizer: Any, prefix: str = "", phrases: Sequence[str] = (), *, where: str
) -> OutputConstraint | None:
    """A prefix and phrases given as text, encoded by ``tokenizer`` (blank ones are none), as
    ``translate --prefix/--constraints`` and ``serve`` take them; None when there is neither."""
    given = [p for p in phrases if p.strip()]
    if not prefix.strip() and not given:
        return None
    encoded = [_spelled(tokenizer, p, "phrase", where) for p in given]
    prefix_ids = _spelled(tokenizer, prefix, "prefix", where)
    eos_id = getattr(tokenizer, "eos_id", EOS_ID)
    return OutputConstraint(prefix_ids, encoded, where=where, eos_id=eos_id)


def _spelled(tokenizer: Any, text: str, what: str, where: str) -> list[int]:
    """``text``'s ids, or ``UserError`` when the vocabulary cannot spell it: the unknown piece
    would stand in for it, and any output holding that piece would "meet" the constraint."""
    # output text: the target side's model where a vocabulary has two (``data.pieces``)
    encode = getattr(tokenizer, "encode_target", tokenizer.encode)
    ids = encode(text)
    unk_id = getattr(tokenizer, "unk_id", UNK_ID)
    if unk_id not in ids:
        return ids
    unknown = "".join(dict.fromkeys(c for c in text if unk_id in encode(c)))
    raise UserError(
        f"{where}: the {what} {text!r} has characters the vocabulary cannot spell "
        f"({unknown!r}; they encode to the unknown piece): leave them out"
    )


def _progress(phrase: tuple[int, ...], tail: tuple[int, ...]) -> int:
    """The longest k < len(phrase) such that ``tail`` ends with the phrase's first k tokens."""
    for k in range(min(len(phrase) - 1, len(tail)), 0, -1):
        if tail[-k:] == phrase[:k]:
            return k
    return 0
