"""The searches' constraint protocol (``Constraint``: which tokens may follow a prefix, applied
to a step's log-probabilities by ``constrain``), and target prefixes and lexical constraints as
one, for beam search and sampling.

``OutputConstraint(prefix, phrases)`` makes an output start with the token ids ``prefix`` and
contain every phrase of ``phrases`` (each a run of token ids) somewhere. Two parts:

What is allowed (beam search and sampling), which guarantees the phrases:

* while the prefix is not out, the next prefix token is the only one allowed;
* eos is forbidden until every phrase has appeared;
* a token is allowed only if what the unmet phrases still need afterwards fits in the tokens
  left before the length limit. "Need" is the unmet phrases' total length minus the longest
  start of one of them that the output now ends with, an upper bound on the tokens still
  required (it gives no credit for two phrases overlapping), so the forced tokens come a
  little early rather than too late. Following the phrase in progress (or starting the first
  one) lowers the need by one token a step, so some token is always allowed and every output,
  finished by eos or cut at the length limit, holds all the phrases.

Where the phrases go (beam search): dynamic beam allocation (Post & Vilar 2018, as fairseq's
``LexicallyConstrainedBeamSearch`` and Sockeye do; ``beam.expand_banked``). Besides the 2k
best candidates, each live prefix offers its best token and its tokens that place a
constraint token next (``advancing``); a candidate's bank is the number of constraint tokens
it has placed (``placed``: met phrases' lengths plus the phrase in progress), and the banks
take turns for the beam's places, the fullest first. So a prefix that has just placed a phrase
the model finds unlikely is kept beside the likelier ones that have not, and the phrase goes
where the model can best follow it rather than only where the length budget forces it. A
search without phrases (a prefix alone, or no constraint) keeps the plain k best.

Phrases match as token ids: a phrase encoded alone must appear with that segmentation (for
SentencePiece, whole words).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from ..data.vocab import EOS_ID, UNK_ID
from ..errors import UserError

NEG_INF = float("-inf")

# --- The protocol ----------------------------------------------------------------------------


class Constraint(Protocol):
    """Which tokens may follow a prefix (e.g. ``aiayn.parsing.constraint.TreeConstraint``,
    ``aiayn.decode.constraints``).

    States are opaque and immutable (beams that share a prefix share its state); tokens outside
    ``allowed`` get log-probability -inf, so eos must be allowed for an output to finish.
    ``allowed`` may answer None (every token) or ``AllBut(ids)`` (every token but those), so
    that a constraint need not list the whole vocabulary.
    """

    def start(self, source: Sequence[int], max_len: int) -> Any: ...  # the empty output's state
    def allowed(self, state: Any) -> Iterable[int] | None: ...
    def advance(self, state: Any, token: int) -> Any: ...


def constraint_states(
    constraint: Constraint | Sequence[Constraint | None] | None,
    src: Tensor,
    max_lens: Tensor,
    pad_id: int,
) -> list[tuple[Constraint, Any]] | None:
    """Per row of src (B, S): (its constraint, the empty output's state), or None without any.
    ``constraint`` is one for every row, or one (or None: unconstrained) per row."""
    if constraint is None:
        return None
    per_row = list(constraint) if isinstance(constraint, Sequence) else [constraint] * len(src)
    if all(c is None for c in per_row):
        return None
    return [
        (c, c.start([i for i in row if i != pad_id], limit))
        for c, row, limit in zip(map(_or_free, per_row), src.tolist(), max_lens.tolist())
    ]


class Unconstrained:
    """Every token may follow (the rows of a batch that have no constraint)."""

    def start(self, source: Sequence[int], max_len: int) -> None:
        return None

    def allowed(self, state: None) -> None:
        return None

    def advance(self, state: None, token: int) -> None:
        return None


def _or_free(constraint: Constraint | None) -> Constraint:
    return Unconstrained() if constraint is None else constraint


class AllBut(frozenset):
    """``Constraint.allowed``'s answer "every token but these" (e.g. no eos yet)."""


def constrain(lprobs: Tensor, allowed: Sequence[Iterable[int] | None]) -> Tensor:
    """(rows, V) log-probabilities with every token outside ``allowed[row]`` set to -inf;
    ``None`` allows every token, ``AllBut(ids)`` every token but ``ids``.

    The (rows, V) mask is made on lprobs' device from the ids alone (``_on_device``): one
    built on the host would be copied to the device, and wait for it, at every step."""
    listed: list[int] = []  # rows given as lists
    on: tuple[list[int], list[int]] = ([], [])  # (rows, cols) allowed
    off: tuple[list[int], list[int]] = ([], [])  # (rows, cols) refused
    for row, ids in enumerate(allowed):
        if ids is None:
            continue
        cols = list(ids)
        if not isinstance(ids, AllBut):
            listed.append(row)
        target = off if isinstance(ids, AllBut) else on
        target[0].extend([row] * len(cols))
        target[1].extend(cols)
    listed_rows, on_rows, on_cols, off_rows, off_cols = _on_device(
        [listed, *on, *off], lprobs.device
    )
    keep = torch.ones(lprobs.shape, dtype=torch.bool, device=lprobs.device)
    keep[listed_rows] = False
    keep[on_rows, on_cols] = True
    keep[off_rows, off_cols] = False
    return lprobs.masked_fill(~keep, NEG_INF)


def _on_device(lists: list[list[int]], device: torch.device) -> list[Tensor]:
    """The lists as long tensors on ``device``, in one copy that does not wait for the device
    (from pinned memory on CUDA)."""
    flat = [i for ids in lists for i in ids]
    host = torch.tensor(flat, dtype=torch.long, pin_memory=device.type == "cuda")
    return list(host.to(device, non_blocking=True).split([len(ids) for ids in lists]))


def advance_states(
    states: list[tuple[Constraint, Any]] | None, rows: Tensor, tokens: Tensor
) -> list[tuple[Constraint, Any]] | None:
    """Each kept prefix's constraint state after its new token: row r of the old prefixes,
    advanced by its token (rows (n*k,), tokens (n, k))."""
    if states is None:
        return None
    pairs = zip(rows.tolist(), tokens.view(-1).tolist())
    return [(states[r][0], states[r][0].advance(states[r][1], token)) for r, token in pairs]


def has_phrases(states: list[tuple[Constraint, Any]] | None) -> bool:
    """Whether some row must hold lexical phrases: beam search then allocates its beam to
    banks (``beam.expand_banked``)."""
    return states is not None and any(
        isinstance(c, OutputConstraint) and c.phrases for c, _ in states
    )


def placed(constraint: Constraint, state: Any) -> int:
    """Constraint tokens a row has placed (0 for a constraint without phrases)."""
    return constraint.placed(state) if isinstance(constraint, OutputConstraint) else 0


def advancing(constraint: Constraint, state: Any) -> list[int]:
    """The tokens that would place a row's next constraint token (none without phrases)."""
    return constraint.advancing(state) if isinstance(constraint, OutputConstraint) else []


# --- Target prefixes and lexical constraints -----------------------------------------------


class OutputState(NamedTuple):
    t: int  # tokens out so far
    met: frozenset[int]  # indices of the phrases that have appeared
    tail: tuple[int, ...]  # the last (longest phrase - 1) tokens
    max_len: int  # this output's limit on |Y|
    closed: bool = False  # the last token ended a phrase: the word must end there too


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
        glue: frozenset[int] = frozenset(),
    ) -> None:
        self.prefix = tuple(prefix)
        self.phrases = [tuple(p) for p in phrases if p]
        self.where, self.eos_id, self.glue = where, eos_id, glue
        self.window = max((len(p) for p in self.phrases), default=1) - 1

    def start(self, source: Sequence[int], max_len: int) -> OutputState:
        need = len(self.prefix) + sum(map(len, self.phrases))
        if need > max_len:
            raise UserError(
                f"{self.where}: the prefix and phrases take {need} tokens, more than the "
                f"{max_len} this output may have"
            )
        return OutputState(0, frozenset(), (), max_len)

    def allowed(self, state: OutputState) -> Iterable[int] | None:
        if state.t < len(self.prefix):
            return [self.prefix[state.t]]
        unmet = [i for i in range(len(self.phrases)) if i not in state.met]
        glued = self.glue if state.closed else frozenset()  # a phrase is whole words
        if not unmet:
            return AllBut(glued) if glued else None
        left = state.max_len - state.t - 1  # tokens left after this one
        if sum(len(self.phrases[i]) for i in unmet) <= left:
            return AllBut({self.eos_id} | glued)  # any token keeps the need within budget
        candidates = {tok for i in unmet for tok in self.phrases[i]}
        fits = sorted(tok for tok in candidates if self._need(self.advance(state, tok)) <= left)
        return [tok for tok in fits if tok not in glued] or fits

    def advance(self, state: OutputState, token: int) -> OutputState:
        seen = state.tail + (token,)
        ended = {i for i, p in enumerate(self.phrases) if seen[-len(p) :] == p}
        tail = seen[-self.window :] if self.window else ()
        return OutputState(state.t + 1, state.met | ended, tail, state.max_len, bool(ended))

    def placed(self, state: OutputState) -> int:
        """Constraint tokens placed (the bank of dynamic beam allocation): the met phrases'
        lengths plus the longest start of an unmet one that the output ends with."""
        unmet = [p for i, p in enumerate(self.phrases) if i not in state.met]
        met = sum(len(p) for i, p in enumerate(self.phrases) if i in state.met)
        return met + max((_progress(p, state.tail) for p in unmet), default=0)

    def advancing(self, state: OutputState) -> list[int]:
        """The tokens that would place a constraint token next: each unmet phrase's token
        after every start of it that the output ends with (its first token, always)."""
        if state.t < len(self.prefix):
            return []
        unmet = [p for i, p in enumerate(self.phrases) if i not in state.met]
        return sorted({p[k] for p in unmet for k in _starts(p, state.tail)})

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
    glue = word_glue(tokenizer) if encoded else frozenset()
    return OutputConstraint(prefix_ids, encoded, where=where, eos_id=eos_id, glue=glue)


_GLUE: dict[int, tuple[Any, frozenset[int]]] = {}  # by id(vocab), the vocab kept alive


def word_glue(tokenizer: Any) -> frozenset[int]:
    """The ids of the pieces that continue a word (no "▁" in front, a letter or digit first):
    none may follow a phrase, which is whole words, or "tienda" + "a" would meet "tienda"."""
    if id(tokenizer) not in _GLUE:
        pieces = (tokenizer.id_to_piece(i) for i in range(len(tokenizer)))
        glue = frozenset(i for i, p in enumerate(pieces) if p[:1].isalnum() or p[:1] == "_")
        _GLUE[id(tokenizer)] = (tokenizer, glue)
    return _GLUE[id(tokenizer)][1]


def with_phrases(
    constraint: Constraint | None, phrases: Sequence[Sequence[int]], *, where: str, vocab: Any
) -> Constraint | None:
    """``constraint`` (None, or a prefix and phrases) that must also hold ``phrases`` (a
    glossary's targets in a sentence, spelled by ``vocab``); ``where`` names a new one in
    errors."""
    phrases = [p for p in phrases if p]
    if not phrases:
        return constraint
    glue, eos_id = word_glue(vocab), vocab.eos_id
    if constraint is None:
        return OutputConstraint((), phrases, where=where, eos_id=eos_id, glue=glue)
    if not isinstance(constraint, OutputConstraint):
        raise TypeError(f"phrases add to an OutputConstraint, not {type(constraint).__name__}")
    return OutputConstraint(
        constraint.prefix,
        [*constraint.phrases, *phrases],
        where=constraint.where,
        eos_id=constraint.eos_id,
        glue=glue,
    )


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
    return _starts(phrase, tail)[0]


def _starts(phrase: tuple[int, ...], tail: tuple[int, ...]) -> list[int]:
    """Every k < len(phrase) such that ``tail`` ends with the phrase's first k tokens, longest
    first (0, the empty start, last)."""
    longest = min(len(phrase) - 1, len(tail))
    return [k for k in range(longest, 0, -1) if tail[-k:] == phrase[:k]] + [0]
