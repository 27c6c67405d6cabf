"""Rebuild the bundled English->Spanish Bible corpus in src/aiayn/corpus/bible/ from Debian's SWORD modules.

    apt-get install -y libsword-utils sword-text-web sword-text-sparv
    python scripts/build_bible_corpus.py            # writes src/aiayn/corpus/bible/*.gz

English is the World English Bible (module engWEB2015eb), Spanish the Reina-Valera 1909
(spaRV1909eb); both are public domain. Verses are aligned by reference. Whole chapters are
held out for valid/test (every 20th chapter in canonical order, offsets 7 and 17) so that
evaluation verses are not the neighbours of training verses; held-out pairs whose English
or Spanish side also occurs verbatim in training are dropped. The output is byte-identical
across runs (sorted by canonical order, gzip with a zero timestamp). The two modules number
a few chapters differently, so chapters whose lengths fit better shifted by one verse, and
pairs whose lengths differ more than 2.5x, are dropped.
"""

from __future__ import annotations

import argparse
import gzip
import html
import math
import os
import re
import subprocess
from pathlib import Path

MODULES = {"en": "engWEB2015eb", "es": "spaRV1909eb"}
HELD_OUT_EVERY = 20
HELD_OUT_OFFSET = {"valid": 7, "test": 17}

_REF = re.compile(r"^(.+) (\d+):(\d+)$")
_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.S)
# Section headings are editorial; canonical titles (the Psalm superscriptions) are scripture
# and the Spanish module has them inline in verse 1, so only the former are removed.
_TITLE = re.compile(r"<title\b(?![^>]*canonical=\"true\")[^>]*>.*?</title>", re.S)
_TAG = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")


def read_module(module: str, sword_path: str) -> dict[str, str]:
    """Raw OSIS text of every entry of ``module``, keyed by reference ("Genesis 1:1")."""
    env = {**os.environ, "SWORD_PATH": sword_path}
    out = subprocess.run(["mod2imp", module], env=env, check=True, capture_output=True).stdout
    entries: dict[str, str] = {}
    ref = None
    for line in out.decode("utf-8").split("\n"):
        if line.startswith("$$$"):
            ref = line[3:].strip()
            entries[ref] = ""
        elif ref is not None:
            entries[ref] += line + "\n"
    return entries


def clean(osis: str) -> str:
    """Plain verse text: notes and headings dropped, other tags stripped, spaces normalised."""
    text = _TITLE.sub(" ", _NOTE.sub(" ", osis))
    text = html.unescape(_TAG.sub(" ", text))
    text = _SPACE.sub(" ", text).strip()
    # Tags split words from their punctuation ("spirit</w>," -> "spirit ,"); rejoin them.
    return re.sub(r" ([,.;:!?’”)\]])", r"\1", re.sub(r"([“‘(¡¿\[]) ", r"\1", text))


def verses(entries: dict[str, str]) -> dict[tuple[str, int, int], str]:
    """Cleaned, non-empty verses keyed by (book, chapter, verse); intros (0:0) are skipped."""
    out = {}
    for ref, osis in entries.items():
        m = _REF.match(ref)
        if m and int(m[2]) > 0 and int(m[3]) > 0:
            text = clean(osis)
            if text:
                out[(m[1], int(m[2]), int(m[3]))] = text
    return out


def _length_cost(
    en: dict, es: dict, chapter: tuple[str, int], verses: list[int], shift: int
) -> float:
    pairs = [(v, v + shift) for v in verses if (*chapter, v + shift) in es]
    if len(pairs) < 0.6 * len(verses):
        return math.inf
    return sum(
        abs(math.log(len(en[(*chapter, a)]) / len(es[(*chapter, b)]))) for a, b in pairs
    ) / len(pairs)


def shifted_chapters(en: dict, es: dict, keys: list[tuple[str, int, int]]) -> set[tuple[str, int]]:
    """Chapters whose verse numbering differs between the modules (Spanish follows the Hebrew
    numbering in a few places, e.g. Numbers 13): pairing verse v with v+-1 fits the lengths
    clearly better (mean |log length ratio| at least 20% lower) than pairing v with v."""
    verses: dict[tuple[str, int], list[int]] = {}
    for book, chapter, verse in keys:
        verses.setdefault((book, chapter), []).append(verse)
    return {
        c
        for c, vs in verses.items()
        if min(_length_cost(en, es, c, vs, s) for s in (-1, 1))
        < 0.8 * _length_cost(en, es, c, vs, 0)
    }


def plausible(en: str, es: str) -> bool:
    """False for pairs whose lengths differ more than 2.5x: colophons present on one side
    only, verses merged by one module, and the glossary WEB appends to Revelation 22:21."""
    return max(len(en), len(es)) <= 2.5 * min(len(en), len(es))


def split_of(chapter_index: int) -> str:
    for split, offset in HELD_OUT_OFFSET.items():
        if chapter_index % HELD_OUT_EVERY == offset:
            return split
    return "train"


def build(sword_path: str) -> dict[str, list[tuple[str, str, str]]]:
    """(reference, English, Spanish) triples per split, in canonical order."""
    en_entries = read_module(MODULES["en"], sword_path)
    en, es = verses(en_entries), verses(read_module(MODULES["es"], sword_path))
    book_order = {}
    for ref in en_entries:  # the module's own order is canonical order
        m = _REF.match(ref)
        if m:
            book_order.setdefault(m[1], len(book_order))
    keys = sorted(en.keys() & es.keys(), key=lambda k: (book_order[k[0]], k[1], k[2]))
    shifted = shifted_chapters(en, es, keys)
    chapters: dict[tuple[str, int], int] = {}
    splits: dict[str, list[tuple[str, str, str]]] = {"train": [], "valid": [], "test": []}
    for book, chapter, verse in keys:
        index = chapters.setdefault((book, chapter), len(chapters))
        if (book, chapter) in shifted or not plausible(
            en[book, chapter, verse], es[book, chapter, verse]
        ):
            continue
        splits[split_of(index)].append(
            (f"{book} {chapter}:{verse}", en[book, chapter, verse], es[book, chapter, verse])
        )
    seen = {text for _, e, s in splits["train"] for text in (e, s)}
    for split in ("valid", "test"):
        splits[split] = [t for t in splits[split] if t[1] not in seen and t[2] not in seen]
    return splits


def write_gz(path: Path, lines: list[str]) -> None:
    # mtime=0 and no stored file name make the archive byte-identical across rebuilds.
    with open(path, "wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as f:
        f.write("".join(line + "\n" for line in lines).encode("utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parents[1] / "src" / "aiayn" / "corpus" / "bible"
    )
    parser.add_argument("--sword-path", default="/usr/share/sword")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split, triples in build(args.sword_path).items():
        for suffix, column in (("ref", 0), ("en", 1), ("es", 2)):
            write_gz(args.out / f"{split}.{suffix}.gz", [t[column] for t in triples])
        print(f"{split}: {len(triples)} pairs")


if __name__ == "__main__":
    main()
