"""The user's corpora as ``aiayn prepare`` reads them: what each one is (``Corpus``), where its
languages come from, and its pairs, streamed from whichever format it is in.

Formats: two line-aligned files (``src``/``tgt``), one ``source<TAB>target`` file (``tsv``),
each optionally ``.gz``, and a TMX translation memory (``tmx``), read element by element with
the standard library's ``iterparse`` so that a memory of millions of units needs no more memory
than one. Reading is lenient where ``iter_lines`` is strict: a line that is not UTF-8 is handed
on as ``None`` for the cleaner to count (one bad line in a crawled corpus should cost that
pair, not the run); a Windows CRLF ending and a byte-order mark opening a file are removed.
"""

from __future__ import annotations

import re
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import open_binary, split_lines

BOM = b"\xef\xbb\xbf"
# a file name's last suffix that names a language ("train.de", "news.pt-BR.gz")
_LANG_SUFFIX = re.compile(r"[a-z]{2,3}(?:[-_][A-Za-z]{2,4})?")
# suffixes that look like language codes and are not
LANG_CODE = re.compile(r"[a-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*")  # a language tag, BCP 47's shape
_NOT_LANGS = {"src", "tgt", "txt", "tok", "raw", "out", "ref", "hyp", "tsv", "tmx", "bpe", "xml"}
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
# A target-language token, OPUS-MT's multilingual form (>>fra<<, >>por_Latn<<): the code
# of the language to translate into, put in front of the source.
LANGUAGE_TOKEN = re.compile(r">>([a-z]{2,3}(?:[_-][A-Za-z0-9]{2,8})*)<<")
TAG_BT = "<BT>"  # the source tag of back-translated pairs (Caswell et al., 2019)
MAX_WEIGHT = 100.0  # an epoch's pair list is weight times a corpus: 1e9 took all memory
_KEYS = {"name", "src", "tgt", "tsv", "tmx", "weight", "back_translated", "tag"}

Pair = tuple[str | None, str | None]  # None: that side's line is not UTF-8


@dataclass(frozen=True)
class Corpus:
    """One named corpus: ``files`` (one TSV or TMX file, or the source and target files) in
    ``kind``'s format; ``weight`` scales how often its pairs are sampled each training epoch
    (``batching.weighted_epoch``); a ``back_translated`` corpus's sources are machine
    translations and get ``TAG_BT`` in front; a ``tag``ged corpus's sources get its target
    language's token in front (``>>fr<<``: one model, several target languages, as OPUS-MT's
    multilingual models read them)."""

    name: str
    kind: str  # "pair", "tsv" or "tmx"
    files: tuple[Path, ...]
    weight: float = 1.0
    back_translated: bool = False
    tag: str | None = None

    def source(self, text: str, *, training: bool) -> str:
        """A source of this corpus as the model reads it: its language token, then (in
        training: held-out sources are real text) the back-translation tag."""
        tags = [language_token(self.tag)] if self.tag else []
        tags += [TAG_BT] if training and self.back_translated else []
        return " ".join([*tags, text])

    @classmethod
    def from_dict(cls, spec: dict[str, Any], where: str, default_name: str = "") -> Corpus:
        """A corpus from a data spec entry or a ``--corpus`` option (``where`` names it in
        errors): ``src`` and ``tgt``, or ``tsv``, or ``tmx``; ``name``, ``weight`` and
        ``back_translated`` optional."""
        if not isinstance(spec, dict):
            raise UserError(f"{where}: expected a mapping with src/tgt, tsv or tmx, got {spec!r}")
        unknown = sorted(set(spec) - _KEYS)
        if unknown:
            raise UserError(
                f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(_KEYS))})"
            )
        given = [k for k in ("tsv", "tmx") if k in spec] + (["src/tgt"] if "src" in spec else [])
        if len(given) != 1 or ("src" in spec) != ("tgt" in spec):
            raise UserError(f"{where}: give exactly one of src and tgt, tsv, or tmx")
        kind = {"tsv": "tsv", "tmx": "tmx", "src/tgt": "pair"}[given[0]]
        files = (spec["src"], spec["tgt"]) if kind == "pair" else (spec[kind],)
        try:
            weight = float(spec.get("weight", 1.0))
        except (TypeError, ValueError):
            raise UserError(f"{where}: weight must be a number, got {spec['weight']!r}") from None
        if not 0 < weight <= MAX_WEIGHT:
            raise UserError(
                f"{where}: weight must be a number > 0 and at most {MAX_WEIGHT:g} (an epoch "
                f"holds each pair up to that many times), got {weight}"
            )
        bt = spec.get("back_translated", False)
        if bt not in (True, False, "true", "false", "1", "0", 1, 0):
            raise UserError(f"{where}: back_translated must be true or false, got {bt!r}")
        name = str(spec.get("name", default_name or Path(str(files[0])).name))
        tag = spec.get("tag")
        if tag is not None and not (isinstance(tag, str) and LANG_CODE.fullmatch(tag)):
            raise UserError(
                f"{where}: tag must be the target language's code (en, fr, pt_BR), got {tag!r}"
            )
        paths = tuple(Path(str(f)) for f in files)
        return cls(name, kind, paths, weight, bt in (True, "true", "1", 1), tag)


def language_token(code: str) -> str:
    """The piece that asks for target language ``code`` (``fr`` -> ``>>fr<<``)."""
    return f">>{code}<<"


def parse_corpus_option(text: str, index: int) -> Corpus:
    """``--corpus name=crawl,tsv=crawl.tsv.gz,weight=0.5`` as a ``Corpus``."""
    spec = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--corpus {text}: expected KEY=VALUE items separated by commas")
        spec[key.strip()] = value.strip()
    return Corpus.from_dict(spec, f"--corpus {text}", default_name=f"corpus{index}")


@dataclass
class Languages:
    """The source and target languages, where known (``None``: not known)."""

    src: str | None = None
    tgt: str | None = None
    found_in: dict[str, str] = field(default_factory=dict)  # language -> where it was read

    def __post_init__(self) -> None:
        # recorded, they choose BLEU's tokeniser and --split's rules: "english" or "x/y" would
        # be used silently as no language at all
        for side in ("src", "tgt"):
            lang = getattr(self, side)
            if lang is not None and not (isinstance(lang, str) and LANG_CODE.fullmatch(lang)):
                raise UserError(
                    f"--{side}-lang {lang!r}: not a language code (ISO 639: two or three "
                    "lower-case letters, then an optional region: en, de, pt-BR)"
                )

    def record(self) -> dict[str, str]:
        """What ``meta.json`` records (validation BLEU and evaluate read ``tgt_lang``)."""
        return {k: v for k, v in (("src_lang", self.src), ("tgt_lang", self.tgt)) if v}


def file_language(path: Path) -> str | None:
    """The language a file's last suffix names (``train.de.gz`` -> ``de``), if any."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    suffix = name.rpartition(".")[2] if "." in name else ""
    if _LANG_SUFFIX.fullmatch(suffix) and suffix not in _NOT_LANGS:
        return suffix
    return None


def resolve_languages(given: Languages, corpora: list[Corpus]) -> Languages:
    """The languages ``given`` (``--src-lang``/``--tgt-lang``), else those the pair files'
    suffixes name (but a ``tag``ged corpus's target: several go into one model); a suffix
    that disagrees with another or with what was given is refused, since the same files
    cannot be in two languages."""
    found = Languages(given.src, given.tgt, {})
    for corpus in corpora:
        if corpus.kind != "pair":
            continue
        langs = [file_language(p) for p in corpus.files]
        if None in langs or langs[0] == langs[1]:
            continue
        for side, lang, path in zip(("src", "tgt"), langs, corpus.files):
            known = getattr(found, side)
            if side == "tgt" and corpus.tag:  # a tagged corpus's target is its tag's language
                continue
            if known is None:
                setattr(found, side, lang)
                found.found_in[side] = str(path)
            elif known != lang:
                source = found.found_in.get(side, f"--{side}-lang {known}")
                raise UserError(
                    f"{path}: its suffix says {side} language {lang!r}, but {source} says "
                    f"{known!r}; give --{side}-lang to choose"
                )
    for corpus in corpora:
        if corpus.kind == "tmx" and None in (found.src, found.tgt):
            _tmx_direction(found, corpus)
    return found


def tmx_languages(path: Path) -> tuple[str | None, list[str]]:
    """(the header's ``srclang``, the languages of the first unit) of a TMX file: where its
    languages are read from when none are given; the rest of the file is not read."""
    srclang = None
    with open_binary(path) as f:
        try:
            for _, elem in ET.iterparse(f, events=("end",)):
                if elem.tag == "header":
                    srclang = _primary(elem.get("srclang") or "") or None
                elif elem.tag == "tu":
                    return srclang, list(_segments(elem))
        except ET.ParseError as e:
            line, column = e.position
            raise UserError(
                f"{path}: line {line}, column {column}: not valid TMX ({e.msg})"
            ) from None
    return srclang, []


def _tmx_direction(found: Languages, corpus: Corpus) -> None:
    """Fill in what ``found`` lacks from a TMX file: its header's ``srclang`` is the source,
    the other language of a two-language unit the target."""
    srclang, langs = tmx_languages(corpus.files[0])
    if found.src is None and srclang in langs:
        found.src, found.found_in["src"] = srclang, str(corpus.files[0])
    others = [lang for lang in langs if lang != found.src]
    if found.tgt is None and found.src in langs and len(others) == 1:
        found.tgt, found.found_in["tgt"] = others[0], str(corpus.files[0])


def _primary(lang: str) -> str:
    """The primary subtag of a language tag, lower case: ``en-GB`` -> ``en``."""
    return re.split(r"[-_]", lang.lower())[0]


def iter_corpus(corpus: Corpus, langs: Languages) -> Iterator[Pair]:
    """Every pair of ``corpus`` in order, stripped; a side that is not UTF-8 is ``None``."""
    if corpus.kind == "pair":
        yield from _iter_pair_files(*corpus.files)
    elif corpus.kind == "tsv":
        yield from _iter_tsv(corpus.files[0])
    else:
        yield from iter_tmx(corpus.files[0], langs)


def text_lines(path: Path) -> Iterator[str | None]:
    """The lines of ``path`` (``.gz`` too): CRLF and a leading BOM removed, ``None`` for a line
    that is not UTF-8."""
    with open_binary(path) as f:
        for lineno, raw in enumerate(split_lines(f), start=1):
            if lineno == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                yield None


def _strip(text: str | None) -> str | None:
    return None if text is None else text.strip()


def _iter_pair_files(src_path: Path, tgt_path: Path) -> Iterator[Pair]:
    n = 0
    tgt_lines = text_lines(tgt_path)
    for src in text_lines(src_path):
        try:
            tgt = next(tgt_lines)
        except StopIteration:
            raise UserError(
                f"line counts differ: {tgt_path} ends at line {n}, {src_path} goes on"
            ) from None
        n += 1
        yield _strip(src), _strip(tgt)
    if next(tgt_lines, False) is not False:
        raise UserError(f"line counts differ: {src_path} ends at line {n}, {tgt_path} goes on")


def _iter_tsv(path: Path) -> Iterator[Pair]:
    for lineno, line in enumerate(text_lines(path), start=1):
        if line is None:
            yield None, None
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise UserError(
                f"{path}: line {lineno}: expected 2 tab-separated fields, found {len(fields)}"
            )
        yield fields[0].strip(), fields[1].strip()


def iter_tmx(path: Path, langs: Languages) -> Iterator[Pair]:
    """The (source, target) segments of each translation unit (``<tu>``) of a TMX file, by
    their ``xml:lang`` (its primary subtag, in any case: ``EN-GB`` is ``en``); a unit without
    one of the two languages gives an empty side, and a warning counts those that hold other
    languages instead. Each unit is dropped once read: memory stays flat."""
    if not (langs.src and langs.tgt):
        raise UserError(
            f"{path}: which of the TMX file's languages is the source and which the target? "
            "give --src-lang and --tgt-lang"
        )
    src, tgt, others = _primary(langs.src), _primary(langs.tgt), Counter[str]()
    with open_binary(path) as f:
        parents: list[ET.Element] = []
        try:
            for event, elem in ET.iterparse(f, events=("start", "end")):
                if event == "start":
                    parents.append(elem)
                    continue
                parents.pop()
                if elem.tag != "tu":
                    continue
                segments = _segments(elem)
                if src not in segments or tgt not in segments:
                    others.update(set(segments) - {src, tgt})
                yield segments.get(src, ""), segments.get(tgt, "")
                if parents:
                    parents[-1].remove(elem)  # the unit is done with: keep memory flat
        except ET.ParseError as e:
            line, column = e.position
            raise UserError(
                f"{path}: line {line}, column {column}: not valid TMX ({e.msg})"
            ) from None
    if others:
        found = ", ".join(f"{lang} ({n})" for lang, n in others.most_common(5))
        warnings.warn(
            f"{path}: units without {src} or {tgt} hold other languages: {found}; they are "
            "dropped as empty sides (give --src-lang/--tgt-lang to choose the pair)",
            stacklevel=2,
        )


def _segments(tu: ET.Element) -> dict[str, str]:
    # a segment may span lines in the XML: one sentence is one line of the dataset's text
    found = {}
    for tuv in tu.iter("tuv"):
        lang = tuv.get(_XML_LANG) or tuv.get("lang") or ""
        seg = tuv.find("seg")
        found[_primary(lang)] = " ".join("".join(seg.itertext()).split()) if seg is not None else ""
    return found


def data_spec(data: dict[str, Any], path: Path) -> tuple[dict[str, list[Corpus]], Languages]:
    """The corpora and languages of data spec file ``path`` whose mapping is ``data`` (YAML,
    JSON or TOML, read as a training config is): ``train`` (a list of corpora), optional
    ``valid`` and ``test`` (one corpus each), optional ``src_lang`` and ``tgt_lang``. Relative
    file names are relative to the spec file."""
    unknown = sorted(set(data) - {"train", "valid", "test", "src_lang", "tgt_lang"})
    if unknown:
        raise UserError(
            f"{path}: unknown key {unknown[0]!r} (train, valid, test, src_lang, tgt_lang)"
        )
    if not isinstance(data.get("train"), list) or not data["train"]:
        raise UserError(f"{path}: 'train' must be a list of corpora")
    base = path.parent
    splits: dict[str, list[Corpus]] = {}
    for split in ("train", "valid", "test"):
        entries = data.get(split)
        if entries is None:
            continue
        entries = entries if isinstance(entries, list) else [entries]
        splits[split] = [
            _relative(Corpus.from_dict(e, f"{path}: {split}[{i}]", f"{split}{i}"), base)
            for i, e in enumerate(entries)
        ]
    return splits, Languages(data.get("src_lang"), data.get("tgt_lang"))


def _relative(corpus: Corpus, base: Path) -> Corpus:
    files = tuple(f if f.is_absolute() else base / f for f in corpus.files)
    return replace(corpus, files=files)
