"""A vocabulary of two SentencePiece models, one per side, over one table of pieces.

Pretrained OPUS-MT / MarianMT models split a source sentence with one SentencePiece model
(``source.spm``) and a target sentence with another (``target.spm``), and give the model the
pieces' ids in a joint table (Marian's ``vocab.json``). A checkpoint that holds such a model
(``aiayn import``) carries the three files as ``source.spm``, ``target.spm`` and ``pieces.json``
(the table: a JSON list, piece i at index i); ``TwoModelVocab`` answers as ``Vocab`` does, each
side through its own model. The table keeps the project's special ids (pad 0, unk 1, bos 2,
eos 3); a piece that is not in the table is unk, as MarianTokenizer maps it.

A checkpoint with one ``spm.model`` keeps its one model for both sides (``Vocab``); an
imported fairseq model may split its text with Moses and BPE codes instead (``moses-bpe.json``:
``moses_bpe.MosesBpeVocab``). ``load_vocabulary`` and ``copy_vocabulary`` take every kind, by
its file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

import sentencepiece as spm

from ..errors import UserError
from .moses_bpe import BPE_FILES, KIND, LACKS, SETTINGS, MosesBpeVocab
from .vocab import UNK_ID, PieceTable, Side, Vocab, check_table

WORD_MARK = "\u2581"  # SentencePiece's word boundary, "▁"
SOURCE_MODEL, TARGET_MODEL, PIECES = "source.spm", "target.spm", "pieces.json"
SINGLE_MODEL = "spm.model"  # one model for both sides (``Vocab``)
PAIR_FILES = (PIECES, SOURCE_MODEL, TARGET_MODEL)


def sentencepiece_model(path: Path) -> spm.SentencePieceProcessor:
    """The SentencePiece model in ``path``, or a one-line UserError naming ``path``."""
    if not path.is_file():
        raise UserError(f"SentencePiece model {path} does not exist")
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except RuntimeError:  # sentencepiece's only answer to a file it cannot parse
        raise UserError(
            f"{path}: not a SentencePiece model (damaged, or another kind of file)"
        ) from None


def read_pieces(path: Path) -> list[str]:
    """The table of ``pieces.json``: a list of distinct strings, the special ids' first."""
    try:
        pieces = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a JSON list of pieces ({e})") from None
    return check_table(pieces, path)


class TwoModelVocab(PieceTable):
    """``Vocab``'s interface over a source model, a target model and a table of pieces."""

    def __init__(self, path: Path) -> None:
        """``path``: a ``pieces.json`` with ``source.spm`` and ``target.spm`` beside it."""
        self.path = path
        self.pieces = read_pieces(path)
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        self.source_path, self.target_path = (
            path.with_name(SOURCE_MODEL),
            path.with_name(TARGET_MODEL),
        )
        self.models = {
            "source": sentencepiece_model(self.source_path),
            "target": sentencepiece_model(self.target_path),
        }

    @classmethod
    def write(
        cls, directory: Path, source_model: Path, target_model: Path, pieces: list[str]
    ) -> TwoModelVocab:
        """Write the three files into ``directory`` and load them."""
        shutil.copyfile(source_model, directory / SOURCE_MODEL)
        shutil.copyfile(target_model, directory / TARGET_MODEL)
        text = json.dumps(pieces, ensure_ascii=False, indent=0)
        (directory / PIECES).write_text(text + "\n", encoding="utf-8")
        return cls(directory / PIECES)

    def _ids(self, pieces: Iterable[str]) -> list[int]:
        return [self.ids.get(p, UNK_ID) for p in pieces]

    def encode(self, text: str, side: Side = "source") -> list[int]:
        """Subword ids of ``text`` split by ``side``'s model, without bos/eos. A multilingual
        model's target-language code leading a source (``>>es<< text``) is one piece of the
        table, as MarianTokenizer reads it."""
        code = []
        if side == "source" and text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return self._ids(code + self.models[side].encode(text, out_type=str))

    def encode_batch(
        self, texts: list[str], num_threads: int = 2, side: Side = "source"
    ) -> list[list[int]]:
        split = self.models[side].encode(texts, out_type=str, num_threads=num_threads)
        return [self._ids(pieces) for pieces in split]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first eos, joined by the target model. A piece the target
        model lacks (a source-only piece of the joint table) comes out as its own text, and
        its word marks become spaces, as MarianTokenizer's ``convert_tokens_to_string`` does:
        the same ids print the same text in both."""
        pieces = [self.pieces[i] for i in self.content_ids(ids)]
        return self.models["target"].decode_pieces(pieces).replace(WORD_MARK, " ").strip()

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the table and of both models' piece tables (see ``Vocab.fingerprint``)."""
        h = hashlib.sha256()
        h.update(json.dumps(self.pieces, ensure_ascii=False).encode())
        for side in ("source", "target"):
            model = self.models[side]
            for i in range(model.get_piece_size()):
                h.update(f"{side}\t{i}\t{model.id_to_piece(i)}\t{model.get_score(i)}\n".encode())
        return h.hexdigest()


AnyVocab = Vocab | TwoModelVocab | MosesBpeVocab


def vocabulary_file(directory: Path) -> Path | None:
    """The file that names a directory's vocabulary (``spm.model``, ``pieces.json`` or
    ``moses-bpe.json``), if any."""
    for name in (SINGLE_MODEL, PIECES, SETTINGS):
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    return None


def text_limits(directory: str | os.PathLike) -> tuple[str, dict[str, str]]:
    """What the vocabulary of checkpoint ``directory`` cannot do, known without loading it:
    its kind and, by ``decode.capabilities.Feature``, the reason (none for SentencePiece)."""
    found = vocabulary_file(Path(directory))
    if found is not None and found.name == SETTINGS:
        return KIND, LACKS
    return "SentencePiece", {}


def resolve_vocabulary(path: str | os.PathLike) -> Path:
    """``path``, or the vocabulary file of ``path`` when it is a directory (a checkpoint)."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = vocabulary_file(path)
    if found is None:
        raise UserError(f"{path} holds no vocabulary ({SINGLE_MODEL}, {PIECES} or {SETTINGS})")
    return found


def load_vocabulary(path: str | os.PathLike) -> AnyVocab:
    """The vocabulary of ``path``: a SentencePiece model, a ``pieces.json`` (two models), a
    ``moses-bpe.json`` (Moses and BPE codes), or a directory holding one (a checkpoint, a
    prepared dataset)."""
    path = resolve_vocabulary(path)
    if path.name == SETTINGS:
        return MosesBpeVocab(path)
    return TwoModelVocab(path) if path.name == PIECES else Vocab.load(path)


def vocabulary_files(path: Path) -> list[Path]:
    """The files that make up the vocabulary whose file is ``path``."""
    names = {PIECES: PAIR_FILES, SETTINGS: BPE_FILES}.get(path.name)
    return [path] if names is None else [path.with_name(name) for name in names]


def copy_vocabulary(path: Path, directory: Path) -> Path:
    """Copy the vocabulary whose file is ``path`` into ``directory``; its file there. One
    SentencePiece model is named ``spm.model`` whatever its name was."""
    if Path(path).name in (PIECES, SETTINGS):
        for kept in vocabulary_files(Path(path)):
            shutil.copyfile(kept, directory / kept.name)
        return directory / Path(path).name
    shutil.copyfile(path, directory / SINGLE_MODEL)
    return directory / SINGLE_MODEL
