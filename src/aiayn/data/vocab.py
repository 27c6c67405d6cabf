"""A shared source/target BPE vocabulary (paper section 5.1: "a shared source-target
vocabulary of about 37000 tokens"), wrapping SentencePiece.

The special ids are fixed (pad=0, unk=1, bos=2, eos=3) because the model's padding mask and
the decoders' start/stop logic rely on them; a model file with other ids is rejected.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import sentencepiece as spm

from ..errors import UserError
from .corpora import LANGUAGE_TOKEN, language_token
from .readers import iter_lines

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SAMPLE_SEED = 1  # sentencepiece's sampling of input_sentence_size sentences: one per text
# the trainer options every vocabulary shares: BPE, the fixed special ids, a shuffled sample
_FIXED_OPTIONS: dict[str, Any] = dict(
    model_type="bpe",
    pad_id=PAD_ID,
    unk_id=UNK_ID,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    shuffle_input_sentence=True,
    max_sentence_length=1 << 14,
    minloglevel=2,
)


def _trainer_error(message: str, vocab_size: int) -> UserError | None:
    """A one-line ``UserError`` for sentencepiece's complaints about the vocabulary size, which
    arrive as an internal check with C++ file names; ``None`` for anything else."""
    if m := re.search(
        r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message
    ):
        return UserError(
            f"vocab size {vocab_size} is too large: this training text yields at most "
            f"{m[1]} pieces; ask for {m[1]} or fewer, or give more text"
        )
    if m := re.search(r"smaller than required_chars\. \d+ vs (\d+)", message):
        return UserError(
            f"vocab size {vocab_size} is too small: the training text's characters and "
            f"the special pieces need at least {m[1]}"
        )
    if "!sentences_.empty()" in message:
        return UserError("no training sentences: every line of the training text is empty")
    return None


def _sentences(texts_or_files: Iterable[str | os.PathLike]) -> Iterator[str]:
    # A path object stands for the lines of that file; a str is a sentence.
    for item in texts_or_files:
        if isinstance(item, os.PathLike):
            yield from (line for line in iter_lines(item) if line.strip())
        else:
            yield item


class Vocab:
    """A SentencePiece BPE model with the project's fixed special ids."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path) -> None:
        expected = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
        found = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if found != expected:
            raise UserError(
                f"{path}: special ids (pad, unk, bos, eos) are {found}, need {expected}"
            )
        self.sp = processor
        self.path = path

    @classmethod
    def train(
        cls,
        texts_or_files: Iterable[str | os.PathLike],
        out_prefix: str | os.PathLike,
        vocab_size: int,
        num_threads: int = 2,
        input_sentence_size: int = 2_000_000,
        character_coverage: float = 1.0,
        byte_fallback: bool = False,
        user_defined_symbols: Sequence[str] = (),
    ) -> Vocab:
        """Train a BPE model on training text only and write ``{out_prefix}.model``/``.vocab``.

        ``texts_or_files`` mixes sentences (``str``) and files (``Path``: one sentence a line).
        Pass both languages so that the vocabulary is shared. At most
        ``input_sentence_size`` sentences are sampled, which bounds training time on WMT.
        Same text, same ``.model`` bytes: the sample is seeded, and the model comes from memory
        (a ``model_prefix``, a temporary directory's name, would be recorded in the file).
        """
        if vocab_size < 1:
            raise UserError(f"vocab size must be a positive number of pieces, got {vocab_size}")
        prefix = Path(out_prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        failures: list[BaseException] = []

        def sentences() -> Iterator[str]:
            # sentencepiece turns an exception raised here into a RuntimeError holding only
            # the text; keep the original (a UserError naming the file and line) to re-raise.
            try:
                yield from _sentences(texts_or_files)
            except BaseException as e:  # a signal's exception too (cli.stopping)
                failures.append(e)
                raise

        model = io.BytesIO()
        spm.set_random_generator_seed(SAMPLE_SEED)
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=sentences(),
                model_writer=model,
                vocab_size=vocab_size,
                character_coverage=character_coverage,
                byte_fallback=byte_fallback,
                num_threads=num_threads,
                input_sentence_size=input_sentence_size,
                user_defined_symbols=list(user_defined_symbols),
                **_FIXED_OPTIONS,
            )
        except RuntimeError as e:
            if failures:
                raise failures[0] from None
            error = _trainer_error(str(e), vocab_size)
            if error is None:
                raise
            raise error from None
        path = prefix.with_name(prefix.name + ".model")
        path.write_bytes(model.getvalue())
        vocab = cls.load(path)
        vocab.write_listing(prefix.with_name(prefix.name + ".vocab"))
        return vocab

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocab:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"vocabulary model {path} does not exist")
        try:
            processor = spm.SentencePieceProcessor(model_file=str(path))
        except RuntimeError:  # sentencepiece's only answer to a file it cannot parse
            raise UserError(
                f"{path}: not a SentencePiece model (damaged, or another kind of file)"
            ) from None
        return cls(processor, path)

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Subword ids of ``text``, without bos/eos (those are added when batching)."""
        return self.sp.encode(text, out_type=int)

    def encode_source(self, text: str, max_len: int | None = None) -> list[int]:
        """A source sentence as the model reads it, in the training data's form: its subwords
        and eos. A blank line gives ``[]`` (nothing to read). Over ``max_len`` ids the subwords
        are cut and the eos kept, the one truncation rule (``decode_ids`` applies it to id
        sources too, with a warning; pass no ``max_len`` where that warning is wanted)."""
        if not text.strip():
            return []
        return cut_source(self.encode(text) + [self.eos_id], max_len, self.eos_id)

    def encode_target(self, text: str, max_len: int | None = None) -> list[int]:
        """A target sentence's subwords as the decoder is trained on them, at most
        ``max_len - 1``, so that its input (bos + them) and its output (them + eos) both fit the
        model's positions."""
        ids = self.encode(text)
        return ids if max_len is None else ids[: max_len - 1]

    def encode_batch(
        self, texts: list[str], num_threads: int = 2, side: str = "source"
    ) -> list[list[int]]:
        """Subword ids of each text; one model splits both sides, so ``side`` changes nothing
        here (``pieces.TwoModelVocab`` has one model per side)."""
        return self.sp.encode(texts, out_type=int, num_threads=num_threads)

    def write_listing(self, path: str | os.PathLike) -> None:
        """``piece<TAB>score`` per id, the ``.vocab`` file SentencePiece writes beside a model."""
        with open(path, "w", encoding="utf-8") as f:
            for i in range(len(self)):
                f.write(f"{self.sp.id_to_piece(i)}\t{self.sp.get_score(i):g}\n")

    def id_to_piece(self, i: int) -> str:
        """The subword string of id ``i`` (for attention-map axes)."""
        return self.sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        """The id of subword string ``piece`` (engines that answer in pieces)."""
        return self.sp.piece_to_id(piece)

    @staticmethod
    def content_ids(ids: Iterable[int]) -> list[int]:
        """``ids`` up to the first eos, without pad and bos: what a decoded output says."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                kept.append(i)
        return kept

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first eos, ignoring pad and bos."""
        return self.sp.decode(self.content_ids(ids))

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the id -> (piece, score) table.

        Hashing the table rather than the .model file means two byte-different files that
        give every piece the same id (e.g. trained in different directories) still match.
        """
        h = hashlib.sha256()
        for i in range(len(self)):
            h.update(f"{i}\t{self.sp.id_to_piece(i)}\t{self.sp.get_score(i)}\n".encode())
        return h.hexdigest()


def check_table(pieces: object, path: Path) -> list[str]:
    """``pieces`` as a table of ids (piece i at index i, the special ids' first), or a one-line
    UserError naming ``path``, the file that held it: imports keep their own tables."""
    if not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces):
        raise UserError(f"{path}: expected a JSON list of piece strings")
    if len(set(pieces)) != len(pieces):
        raise UserError(f"{path}: a piece appears twice; each id needs its own piece")
    if len(pieces) <= EOS_ID:
        raise UserError(f"{path}: {len(pieces)} pieces, fewer than the 4 special ids")
    return pieces


def cut_source(ids: list[int], cap: int | None, eos_id: int) -> list[int]:
    """``ids`` cut to ``cap`` ids, a final eos kept: the one truncation rule of sources, for
    text (``Vocab.encode_source``) and ids (``decode.translate.fit_sources``) alike."""
    if cap is None or len(ids) <= cap:
        return ids
    return ids[: cap - 1] + [eos_id] if ids[-1] == eos_id else ids[:cap]


def target_languages(vocab: Any) -> tuple[str, ...]:
    """The codes of the vocabulary's target-language tokens (pieces ``>>xx<<``), in id order:
    the languages a multilingual model translates into; () for a model of one language."""
    pieces = (vocab.id_to_piece(i) for i in range(len(vocab)))
    return tuple(m.group(1) for piece in pieces if (m := LANGUAGE_TOKEN.fullmatch(piece)))


Side = Literal["source", "target"]


class PieceTable:
    """What a vocabulary whose pieces are a table of its own (``pieces``, piece i at id i, and
    ``ids``, their inverse: an imported model's) answers alike whatever splits its text; a
    subclass gives ``encode(text, side)``, ``encode_batch`` and ``decode``."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    pieces: list[str]
    ids: dict[str, int]

    def encode(self, text: str, side: Side = "source") -> list[int]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.pieces)

    def encode_source(self, text: str, max_len: int | None = None) -> list[int]:
        """As ``Vocab.encode_source``: split as the source is, eos appended, cut to fit."""
        if not text.strip():
            return []
        return cut_source(self.encode(text) + [EOS_ID], max_len, EOS_ID)

    def encode_target(self, text: str, max_len: int | None = None) -> list[int]:
        """As ``Vocab.encode_target``: split as the target is."""
        ids = self.encode(text, "target")
        return ids if max_len is None else ids[: max_len - 1]

    def write_listing(self, path: str | os.PathLike) -> None:
        """``piece<TAB>0`` per id: the table has no scores of its own."""
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f"{piece}\t0\n" for piece in self.pieces)

    def id_to_piece(self, i: int) -> str:
        return self.pieces[int(i)]

    def piece_to_id(self, piece: str) -> int:
        return self.ids.get(piece, UNK_ID)

    content_ids = staticmethod(Vocab.content_ids)


class TaggedSources:
    """``vocab`` whose sources start with target language ``code``'s token (``>>fr<< text``,
    as a multilingual model was trained to read them); everything else is ``vocab``'s."""

    def __init__(self, vocab: Any, code: str) -> None:
        self.vocab, self.tag = vocab, language_token(code)

    def encode_source(self, text: str, max_len: int | None = None) -> list[int]:
        tagged = f"{self.tag} {text}" if text.strip() else text  # a blank line stays blank
        return self.vocab.encode_source(tagged, max_len)

    def __len__(self) -> int:
        return len(self.vocab)

    def __getattr__(self, name: str) -> Any:
        if name == "vocab":  # not set yet (unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.vocab, name)
