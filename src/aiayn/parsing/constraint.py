"""Constrained decoding for parsing: only well-formed linearised trees over the source words.

An option beside the paper's unconstrained search (which ``delinearize`` repairs afterwards).
Beam search asks, for each live prefix, which tokens may follow (``decode.constraints.Constraint``);
this one allows exactly the prefixes of a tree with one root, matching bracket labels, no empty
constituent, and one leaf per source word (``XX``, a POS tag, with ``--leaves index`` the
word's own marker, with ``--leaves words`` the word itself, copied piece by piece):

* an opening bracket: as the very first token, or inside the root while words remain, the
  output can still be finished within its maximum length (``room``) and, if bounded, fewer
  than ``max_open_run`` brackets have been opened in a row;
* a leaf token: inside the root while words remain;
* the closing bracket of the innermost open constituent (its label only), unless that
  constituent is still empty, and the root only once every word has its ``XX``;
* eos: once the root is closed.

Why write it: a small model that has not learnt to count words (the 30-minute CPU parser)
emits trees with too few leaves, which repair can only hang off the root; counting is what the
search can do for it exactly. Vinyals, Kaiser et al. (2015) report that their model rarely
produced malformed trees and do not constrain; this module lets one measure the difference.
The source's word count is read from its pieces (one word-boundary piece per word).
Torch-free, like the rest of ``aiayn.parsing`` but its ``pipeline``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import NamedTuple

from ..errors import UserError
from .linearize import LEAF


class TreeState(NamedTuple):
    """A prefix: labels of the open constituents (innermost last), leaves so far, whether the
    innermost constituent is still empty, whether the root has been opened, words to cover,
    and how many more tokens (eos included) the output may have. With word leaves
    (``copy_words``) also the source words as piece-id tuples, the pieces still needed from
    each word on (``need[k]``: words k.. in full), and how many pieces of the current word are
    out (0: none in progress). ``run``: opening brackets in a row at the end of the prefix."""

    stack: tuple[str, ...]
    leaves: int
    empty: bool
    started: bool
    words: int
    room: int
    source: tuple[tuple[int, ...], ...] = ()
    need: tuple[int, ...] = ()
    piece: int = 0
    run: int = 0


class TreeConstraint:
    """Allowed next tokens for linearised trees, over a vocabulary given as id -> piece."""

    def __init__(
        self,
        pieces: Sequence[str],
        eos_id: int,
        boundary: str = "\u2581",
        leaf_tokens: Sequence[str] = (LEAF,),
        indexed: bool = False,
        copy_words: bool = False,
        max_open_run: int | None = None,
    ) -> None:
        """``pieces[i]`` is vocabulary entry i; bracket tokens are the pieces ``▁(NP``,
        ``▁)NP``, and the leaf tokens ``▁XX`` (or the tags ``▁NN``, ``▁DT``...), as
        ``aiayn.parsing.pipeline`` declares them; word-initial pieces start with ``boundary``.

        ``indexed`` (``--leaves index``): ``leaf_tokens`` are the word markers ``<1>``,
        ``<2>``... in order; the i-th leaf must be the i-th marker, and the source's words are
        its markers (each word there has two word-initial pieces, marker and word).
        ``copy_words`` (``--leaves words``): the i-th leaf must be the i-th source word, piece
        by piece as the source spells it; ``leaf_tokens`` are not used.
        ``max_open_run``: at most this many opening brackets in a row. Without it a model that
        would rather skip the next word than copy it nests ``(X (X (X ...`` until the length
        limit forces the word out."""
        self.eos_id = eos_id
        self.indexed = indexed
        self.copy_words = copy_words
        self.max_open_run = max_open_run
        self.open_label: dict[int, str] = {}
        self.close_id: dict[str, int] = {}
        self.word_start: set[int] = set()
        leaf_id: dict[str, int] = {}
        for i, piece in enumerate(pieces):
            if piece.startswith(boundary):
                self.word_start.add(i)
            token = piece[len(boundary) :] if piece.startswith(boundary) else None
            if token is not None and token in leaf_tokens:
                leaf_id[token] = i
            elif token and len(token) > 1 and token[0] == "(":
                self.open_label[i] = token[1:]
            elif token and len(token) > 1 and token[0] == ")":
                self.close_id[token[1:]] = i
        self.leaf_ids = [leaf_id[t] for t in leaf_tokens if t in leaf_id]
        if not (self.leaf_ids or copy_words) or not self.open_label:
            raise UserError(
                f"the vocabulary has no leaf pieces ({boundary}{LEAF} or tags) or no "
                "opening-bracket pieces: not a parsing vocabulary"
            )
        self.leaf_set = frozenset(self.leaf_ids)
        # A constituent that could never be closed is never opened.
        self.opens = tuple(i for i, label in self.open_label.items() if label in self.close_id)

    def start(self, source: Sequence[int], max_len: int) -> TreeState:
        """The empty prefix for a source given as token ids (pad and eos excluded or not) and
        an output of at most ``max_len`` tokens, eos included."""
        if self.copy_words:
            spelled: list[list[int]] = []
            for i in source:
                if i == self.eos_id:
                    break
                if i in self.word_start or not spelled:
                    spelled.append([])
                spelled[-1].append(i)
            words = tuple(tuple(w) for w in spelled)
            need = tuple(accumulate((len(w) for w in reversed(words)), initial=0))[::-1]
            return TreeState((), 0, False, False, len(words), max_len, words, need)
        counted = self.leaf_set if self.indexed else self.word_start
        n_words = sum(1 for i in source if i in counted)
        return TreeState((), 0, False, False, n_words, max_len)

    def allowed(self, state: TreeState) -> Iterable[int]:
        stack, leaves, empty, started, words, room, source, need, piece, run = state
        if piece:  # inside a copied word: its next piece only
            return (source[leaves - 1][piece],)
        if not started:
            return self.opens
        if not stack:
            return (self.eos_id,)
        ids: list[int] = []
        if leaves < words:
            # After an opening bracket: the leaf tokens still missing, a closing bracket for
            # every open constituent and the eos must fit. Without this an untrained model
            # nests brackets until the length limit cuts the tree off.
            missing = need[leaves] if self.copy_words else words - leaves
            if room - 1 >= missing + (len(stack) + 1) + 1 and (
                self.max_open_run is None or run < self.max_open_run
            ):
                ids += self.opens
            if self.copy_words:
                ids.append(source[leaves][0])
            elif not self.indexed:
                ids += self.leaf_ids
            elif leaves < len(self.leaf_ids):
                ids.append(self.leaf_ids[leaves])
        if not empty and (len(stack) > 1 or leaves == words):
            ids.append(self.close_id[stack[-1]])
        return ids

    def advance(self, state: TreeState, token: int) -> TreeState:
        """The prefix extended by ``token`` (tokens ``allowed`` would refuse leave it as is:
        beam search only feeds them to beams that are already impossible)."""
        stack, leaves, empty, started, words, room, source, need, piece, run = state
        if piece:
            if token != source[leaves - 1][piece]:
                return state
            piece = 0 if piece + 1 == len(source[leaves - 1]) else piece + 1
            return state._replace(room=room - 1, piece=piece)
        if token in self.open_label:
            return state._replace(
                stack=stack + (self.open_label[token],),
                empty=True,
                started=True,
                room=room - 1,
                run=run + 1,
            )
        if (
            stack
            and leaves < words
            and (token == source[leaves][0] if self.copy_words else token in self.leaf_set)
        ):
            piece = 1 if self.copy_words and len(source[leaves]) > 1 else 0
            return state._replace(leaves=leaves + 1, empty=False, room=room - 1, piece=piece, run=0)
        if stack and token == self.close_id.get(stack[-1]):
            return state._replace(stack=stack[:-1], empty=False, room=room - 1, run=0)
        return state
