"""Which sentence segmenter ``translate --split`` uses: pysbd, sentencex and sentence-splitter
(Moses' rules) on a gold set, for accuracy and (indicative) speed.

    PYTHONPATH=src python scripts/compare_segmenters.py           # the table in docs/documents.md

The gold set (``gold``): paragraphs of consecutive verses of the bundled corpus's test split,
English and Spanish, whose sentence ends are the verse ends that end in . ? ! (with any closing
quote); verses ending in a comma or colon run on into the next one's sentence, and verses with
an end inside them are left out (where a sentence ends inside a verse nobody marked). Then
hand-made cases of what verses lack: abbreviations, initials, numbers, decimals, ellipses,
quotes, URLs and e-mail addresses (``TRICKY``). The segmenters need ``pip install pysbd
sentencex sentence-splitter``; only the chosen one is a dependency of the package.
"""

from __future__ import annotations

import gzip
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiayn.data import bundled_corpus_paths

END = re.compile(r"[.?!][”’\"')\]]*$")  # a verse that ends a sentence
INSIDE = re.compile(r"[.?!][”’\"')\]]*\s+[“‘\"(¿¡]?[A-ZÁÉÍÓÚÑ]")  # an end inside a verse
SIZES = (2, 3, 4, 5, 6, 8, 10)  # sentences per paragraph, in turn

TRICKY: list[tuple[str, list[str]]] = [
    (
        "Dr. Smith arrived at 5 p.m. on Monday. He left early.",
        ["Dr. Smith arrived at 5 p.m. on Monday.", "He left early."],
    ),
    (
        "Mr. and Mrs. Jones live in the U.S. now. They moved in 2019.",
        ["Mr. and Mrs. Jones live in the U.S. now.", "They moved in 2019."],
    ),
    (
        "The price is $3.50 per unit. Order 1,000.5 kg today.",
        ["The price is $3.50 per unit.", "Order 1,000.5 kg today."],
    ),
    ("Version 2.4.1 fixes the bug. Upgrade now!", ["Version 2.4.1 fixes the bug.", "Upgrade now!"]),
    ('She said, "Stop." Then she walked away.', ['She said, "Stop."', "Then she walked away."]),
    ("He asked, “Why not?” Nobody answered.", ["He asked, “Why not?”", "Nobody answered."]),
    ("Wait... what happened? I don't know.", ["Wait... what happened?", "I don't know."]),
    (
        "See https://example.com/a.b?c=1 for details. It is free.",
        ["See https://example.com/a.b?c=1 for details.", "It is free."],
    ),
    (
        "Write to info@example.org. We answer within a day.",
        ["Write to info@example.org.", "We answer within a day."],
    ),
    ("J. R. R. Tolkien wrote it. It sold well.", ["J. R. R. Tolkien wrote it.", "It sold well."]),
    ("It costs approx. 20 euros. That is cheap.", ["It costs approx. 20 euros.", "That is cheap."]),
    ("Use e.g. a hammer. Or i.e. any tool.", ["Use e.g. a hammer.", "Or i.e. any tool."]),
    (
        "The meeting is at 10 a.m. tomorrow. Please be on time.",
        ["The meeting is at 10 a.m. tomorrow.", "Please be on time."],
    ),
    ("Really?! That is amazing.", ["Really?!", "That is amazing."]),
    ("Chapter 3. The Return", ["Chapter 3.", "The Return"]),
    ("Pi is about 3.14159. E is about 2.718.", ["Pi is about 3.14159.", "E is about 2.718."]),
    (
        "The file is named report.final.pdf. Open it.",
        ["The file is named report.final.pdf.", "Open it."],
    ),
    (
        "He works at Acme Inc. in Boston. His boss is nice.",
        ["He works at Acme Inc. in Boston.", "His boss is nice."],
    ),
    ("(This is a note.) The text goes on.", ["(This is a note.)", "The text goes on."]),
    ("No. 5 is my favourite. No. 6 is not.", ["No. 5 is my favourite.", "No. 6 is not."]),
    (
        "St. Louis is in Missouri. It is on the Mississippi.",
        ["St. Louis is in Missouri.", "It is on the Mississippi."],
    ),
    (
        "The U.K. voted. The results came in at 3 a.m.",
        ["The U.K. voted.", "The results came in at 3 a.m."],
    ),
    ("Prof. Li teaches at MIT. She is busy.", ["Prof. Li teaches at MIT.", "She is busy."]),
    ("I saw it on Jan. 5th. It was cold.", ["I saw it on Jan. 5th.", "It was cold."]),
    ("Call 555-1234. Ask for Sam.", ["Call 555-1234.", "Ask for Sam."]),
    (
        "El Sr. García llegó a las 5. Se fue pronto.",
        ["El Sr. García llegó a las 5.", "Se fue pronto."],
    ),
    ("¿Vienes mañana? ¡Claro que sí!", ["¿Vienes mañana?", "¡Claro que sí!"]),
    ("La Dra. Pérez pagó 3,50 €. Luego salió.", ["La Dra. Pérez pagó 3,50 €.", "Luego salió."]),
    (
        "Visite www.ejemplo.es para más información. Es gratis.",
        ["Visite www.ejemplo.es para más información.", "Es gratis."],
    ),
    ("Vol. 2 is out. Read it.", ["Vol. 2 is out.", "Read it."]),
]


def _verses(path: str) -> Iterator[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        yield from (line.rstrip("\n") for line in f)


def _sentences(lines: Iterator[str]) -> Iterator[str | None]:
    """Gold sentences of consecutive verses (run-on verses joined); None where a verse with an
    end inside it breaks the run."""
    open_: list[str] = []
    for verse in lines:
        if INSIDE.search(verse):
            open_ = []
            yield None
            continue
        open_.append(verse)
        if END.search(verse):
            yield " ".join(open_)
            open_ = []


def gold(per_language: int = 60) -> list[tuple[str, str, list[str]]]:
    """(language, paragraph, its sentences): ``per_language`` corpus paragraphs of each side,
    then ``TRICKY`` (language "en", or "es" where Spanish)."""
    out: list[tuple[str, str, list[str]]] = []
    for lang, path in zip(("en", "es"), bundled_corpus_paths()["test"]):
        run: list[str] = []
        made = 0
        for sentence in _sentences(_verses(str(path))):
            if sentence is None:
                run = []
                continue
            run.append(sentence)
            if len(run) == SIZES[made % len(SIZES)]:
                out.append((lang, " ".join(run), run))
                run, made = [], made + 1
                if made == per_language:
                    break
    for text, sentences in TRICKY:
        spanish = any(c in text for c in "¿¡ñáéíóú€") or text.startswith(("El ", "La ", "Visite"))
        out.append(("es" if spanish else "en", text, sentences))
    return out


def segmenters() -> dict[str, Callable[[str, str], list[str]]]:
    """Each candidate as (language, text) -> stripped sentences."""
    import pysbd
    import sentencex
    from sentence_splitter import SentenceSplitter

    sbd = {lang: pysbd.Segmenter(language=lang, clean=False) for lang in ("en", "es")}
    moses = {lang: SentenceSplitter(language=lang) for lang in ("en", "es")}
    return {
        "pysbd": lambda lang, text: [s.strip() for s in sbd[lang].segment(text) if s.strip()],
        "sentencex": lambda lang, text: [
            s.strip() for s in sentencex.segment(lang, text) if s.strip()
        ],
        "sentence-splitter": lambda lang, text: moses[lang].split(text),
    }


def measure(
    split: Callable[[str, str], list[str]], cases: list[tuple[str, str, list[str]]]
) -> dict[str, Any]:
    """Each paragraph split exactly right or not, boundary precision and recall, characters a
    second (one pass: a segmenter that caches would be timed on its cache by a second)."""
    found = right = wanted = 0
    start = time.perf_counter()
    outputs = [split(lang, text) for lang, text, _ in cases]
    seconds = time.perf_counter() - start
    for (_, text, gold_sentences), mine in zip(cases, outputs):
        ends, mine_ends = _ends(text, gold_sentences), _ends(text, mine)
        found, right, wanted = (
            found + len(mine_ends),
            right + len(ends & mine_ends),
            wanted + len(ends),
        )
    return {
        "exact": [mine == g for (_, _, g), mine in zip(cases, outputs)],
        "precision": right / max(found, 1),
        "recall": right / max(wanted, 1),
        "chars_per_s": sum(len(t) for _, t, _ in cases) / seconds,
    }


def _ends(text: str, sentences: list[str]) -> set[int]:
    """Where in ``text`` each sentence but the last ends (sentences found in order)."""
    ends, at = set(), 0
    for s in sentences[:-1]:
        at = text.find(s, at) + len(s)
        ends.add(at)
    return ends


def main() -> None:
    cases = gold()
    n = len(cases) - len(TRICKY)
    print(f"{n} corpus paragraphs, {len(TRICKY)} hand-made\n")
    print("| segmenter | corpus exact | hand-made exact | boundary precision | recall | chars/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, split in segmenters().items():
        split("en", "Warm up. Once.")
        m = measure(split, cases)
        corpus, tricky = sum(m["exact"][:n]) / n, sum(m["exact"][n:]) / len(TRICKY)
        print(
            f"| {name} | {corpus:.1%} | {tricky:.1%} | {m['precision']:.3f} | "
            f"{m['recall']:.3f} | {m['chars_per_s']:,.0f} |"
        )


if __name__ == "__main__":
    main()
