"""Moses tokenization and subword-nmt BPE codes over a table of pieces: how fairseq's WMT
models (the "Scaling NMT" WMT16 EN-DE big model among them) split their text.

fairseq's hub interface, given ``tokenizer='moses', bpe='subword_nmt'``, encodes a sentence
with sacremoses' MosesTokenizer of the source language (its dash splits, ``@-@``, and its HTML
escapes on, unless the checkpoint records ``moses_no_dash_splits`` / ``moses_no_escape``),
then subword-nmt's ``apply_bpe`` with the model's codes (a piece that its word continues ends
in ``@@``), and reads the pieces, split at spaces, in its dictionary; it decodes
by joining the ``@@ `` continuations and MosesDetokenizer of the target language. A checkpoint
that holds such a model (``aiayn import`` of a fairseq directory with ``bpecodes``) carries the
codes as ``bpecodes`` and ``moses-bpe.json`` (the languages, the two Moses settings and the
table: piece i at index i, the project's special ids first); ``MosesBpeVocab`` answers as
``Vocab`` does, and a piece that is not in the table is unk, as fairseq's dictionary reads it.

Its pieces carry no SentencePiece word marks, and its words are Moses' tokens, not the text's
words: what needs either is refused by name (``LACKS``), and aiayn prepares training data with
SentencePiece vocabularies only, so such a model translates, scores and serves but does not
train.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import UserError
from .vocab import UNK_ID, PieceTable, Side, check_table

SETTINGS, CODES = "moses-bpe.json", "bpecodes"
BPE_FILES = (SETTINGS, CODES)
SEPARATOR = "@@"  # subword-nmt's, and fairseq's --bpe-separator default
KIND = "Moses tokens + subword-nmt BPE codes"
# What the pieces cannot do, by ``decode.capabilities.Feature``, with the reason.
LACKS: dict[str, str] = {
    "alignments": "its words are Moses' tokens, not the text's",
    "lexical_constraints": "a phrase's word ends are SentencePiece's marks, which its pieces lack",
    "glossary": "its terms become lexical constraints, whose word ends its pieces lack",
}


def check_codes(path: Path) -> None:
    """A one-line UserError naming ``path`` and its line where it is not subword-nmt's codes
    (``#version`` first, then two symbols a line): ``apply_bpe`` itself would exit."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"BPE codes {path} do not exist") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: invalid UTF-8 at byte {e.start}") from None
    for number, line in enumerate(lines, 1):
        if number == 1 and line.startswith("#version:"):
            continue
        if len(line.strip("\r\n ").split(" ")) != 2:
            raise UserError(
                f"{path}:{number}: expected two symbols a line (subword-nmt's BPE codes; "
                f"fastBPE's, with counts, are not read), got {line[:60]!r}"
            )


def read_settings(path: Path) -> dict[str, Any]:
    """``moses-bpe.json``: the two languages and the table, checked."""
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not JSON ({e})") from None
    if not isinstance(settings, dict):
        raise UserError(f"{path}: expected an object with source_lang, target_lang, pieces")
    for key in ("source_lang", "target_lang"):
        if not isinstance(settings.get(key), str) or not settings[key]:
            raise UserError(f"{path}: {key} must be a language code")
    for key in ("dash_splits", "escape"):
        if not isinstance(settings.get(key), bool):
            raise UserError(f"{path}: {key} must be true or false")
    check_table(settings.get("pieces"), path)
    return settings


@dataclass(frozen=True)
class BpeCodes:
    """What an import splits its text with, besides its table: subword-nmt's ``codes``, the
    Moses languages of its (source, target) sides, and whether Moses splits dashes and escapes
    (fairseq's ``moses_no_dash_splits`` and ``moses_no_escape`` negated)."""

    codes: Path
    langs: tuple[str, str]
    dash_splits: bool = True
    escape: bool = True


class MosesBpeVocab(PieceTable):
    """``Vocab``'s interface over Moses tokenization, subword-nmt codes and a table of pieces."""

    kind, lacks = KIND, LACKS

    def __init__(self, path: Path) -> None:
        """``path``: a ``moses-bpe.json`` with ``bpecodes`` beside it."""
        # imported here: sacremoses takes seconds to import, and most vocabularies are not this
        from sacremoses import MosesDetokenizer, MosesTokenizer
        from subword_nmt.apply_bpe import BPE

        self.path, self.codes_path = path, path.with_name(CODES)
        settings = read_settings(path)
        self.pieces: list[str] = settings["pieces"]
        self.langs = {"source": settings["source_lang"], "target": settings["target_lang"]}
        self.moses = {
            "aggressive_dash_splits": settings["dash_splits"],
            "escape": settings["escape"],
        }
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        check_codes(self.codes_path)
        with open(self.codes_path, encoding="utf-8") as codes:
            self.bpe = BPE(codes, separator=SEPARATOR)
        self.tokenizers = {side: MosesTokenizer(lang) for side, lang in self.langs.items()}
        self.detokenizer = MosesDetokenizer(self.langs["target"])

    @classmethod
    def write(cls, directory: Path, given: BpeCodes, pieces: list[str]) -> MosesBpeVocab:
        """Write the two files into ``directory`` (the codes copied) and load them."""
        shutil.copyfile(given.codes, directory / CODES)
        source, target = given.langs
        settings = {
            "source_lang": source,
            "target_lang": target,
            "dash_splits": given.dash_splits,
            "escape": given.escape,
            "pieces": pieces,
        }
        text = json.dumps(settings, ensure_ascii=False, indent=0)
        (directory / SETTINGS).write_text(text + "\n", encoding="utf-8")
        return cls(directory / SETTINGS)

    def split(self, text: str, side: Side = "source") -> list[str]:
        """The pieces of ``text`` as fairseq's hub interface makes them (module doc)."""
        tokens = self.tokenizers[side].tokenize(text, return_str=True, **self.moses)
        return self.bpe.process_line(tokens).split()

    def encode(self, text: str, side: Side = "source") -> list[int]:
        """Subword ids of ``text`` split as ``side`` is, without bos/eos."""
        return [self.ids.get(p, UNK_ID) for p in self.split(text, side)]

    def encode_batch(
        self, texts: list[str], num_threads: int = 2, side: Side = "source"
    ) -> list[list[int]]:
        """Each text's ids, one after another: sacremoses has no threads of its own."""
        return [self.encode(text, side) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first eos: the ``@@ `` continuations joined, then Moses'
        detokenizer of the target language (its escapes undone)."""
        text = " ".join(self.pieces[i] for i in self.content_ids(ids))
        words = (text + " ").replace(SEPARATOR + " ", "").split()
        return self.detokenizer.detokenize(words)

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the settings, the table and the codes (see ``Vocab.fingerprint``)."""
        h = hashlib.sha256()
        h.update(json.dumps([self.langs, self.moses, self.pieces], ensure_ascii=False).encode())
        h.update(self.codes_path.read_bytes())
        return h.hexdigest()
