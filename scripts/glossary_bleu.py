"""A glossary's cost in BLEU: terms drawn from the bundled corpus's aligned words, applied to
the test split, the terms counted in the outputs, and BLEU with and without them as a record.

    python scripts/glossary_bleu.py --checkpoint runs/demo/averaged --record records

The terms: IBM Model 1 (``aiayn.data.lexical.ibm1``) over the words (not the pieces) of the
first ``--pairs`` training pairs; a term is a source word of at least four letters, outside
the most frequent hundred, whose likeliest translation has t >= ``--min-prob``, and which the
test sources hold; the ``--terms`` most frequent in the test sources are kept. Under
``--draw one-to-one`` (the default) the pair must also align the other way: the source word
is its translation's likeliest source, t >= ``--min-prob`` (a model trained target to
source), as a glossary's terminology does and function words ("like", "through") do not;
``--draw frequent`` leaves that out. Every term
whose source occurs in a sentence must then be in its output (a whole word): the script says
how many are, and fails when one is missing. The issue's goal: the glossary costs at most
0.5 BLEU.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np

import aiayn
from aiayn.data.lexical import NULL, ibm1
from aiayn.data.prepare import bundled_corpus_paths
from aiayn.files import iter_lines, read_lines
from aiayn.records import make_record, write_record
from aiayn.text.glossary import Glossary

WORD = re.compile(r"\w+")
COMMON = 100  # the most frequent source words are never terms: they translate many ways


def words(line: str) -> list[str]:
    return WORD.findall(line)


def draw_terms(
    pairs: list[tuple[str, str]],
    tests: list[str],
    n: int,
    min_prob: float,
    *,
    both_ways: bool = False,
) -> dict[str, str]:
    """``n`` source words -> their likeliest aligned target word (IBM Model 1 over words), of
    those the ``tests`` sources hold, the most frequent there first. ``both_ways``: only
    one-to-one pairs, the source word also the target word's likeliest source (t >=
    ``min_prob`` each way), as terminology is: a function word ("also", "through") has a
    likely translation but is not its translation's likely source."""
    ids: dict[str, int] = {}
    encoded = [
        ([ids.setdefault(w, len(ids)) for w in words(s)], [ids.setdefault(w, len(ids)) for w in words(t)])
        for s, t in pairs
    ]  # fmt: skip
    arrays = [(np.asarray(s), np.asarray(t)) for s, t in encoded]
    table = ibm1(arrays, len(ids)).best(1, min_prob)
    back = ibm1([(t, s) for s, t in arrays], len(ids)).best(1, min_prob) if both_ways else {}
    names = {i: w for w, i in ids.items()}
    common = {w for w, _ in Counter(w for s, _ in pairs for w in words(s)).most_common(COMMON)}
    in_tests = Counter(w for line in tests for w in set(words(line)))
    terms = {}
    for word, _ in in_tests.most_common():
        best = table.get(ids.get(word, NULL))
        if word in common or len(word) < 4 or not word.isalpha() or not best:
            continue
        target = names[best[0][0]]
        returns = back.get(best[0][0], [(NULL, 0.0)])[0][0] == ids[word]
        if target.isalpha() and (returns or not both_ways):
            terms[word] = target
        if len(terms) == n:
            break
    return terms


def present(glossary: Glossary, sources: list[str], outputs: list[str]) -> tuple[int, int, int]:
    """(terms whose source occurs, of them those whose target is a word of the output,
    sentences with a term)."""
    applied = found = lines = 0
    for source, output in zip(sources, outputs, strict=True):
        terms = glossary.matches(source)
        applied, lines = applied + len(terms), lines + bool(terms)
        for term in terms:
            found += bool(re.search(rf"(?<!\w){re.escape(term.target)}(?!\w)", output))
    return applied, found, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--terms", type=int, default=50)
    p.add_argument("--pairs", type=int, default=10000, help="training pairs aligned")
    p.add_argument("--min-prob", type=float, default=0.5)
    p.add_argument(
        "--draw",
        choices=("one-to-one", "frequent"),
        default="one-to-one",
        help="one-to-one: aligned both ways, t >= --min-prob each way (terminology); "
        "frequent: the likeliest translation of each frequent word",
    )
    p.add_argument("--limit", type=int, help="the first N test pairs only")
    p.add_argument("--beam", type=int)
    p.add_argument("--workers", default="auto")
    p.add_argument("--glossary-out", help="write the terms drawn here (source<TAB>target)")
    p.add_argument("--record", metavar="DIR", help="write the figures as a record into DIR")
    args = p.parse_args(argv)
    paths = bundled_corpus_paths()
    train = zip(iter_lines(paths["train"][0]), iter_lines(paths["train"][1]))
    pairs = [pair for pair, _ in zip(train, range(args.pairs))]
    sources, references = (read_lines(f)[: args.limit] for f in paths["test"])
    drawn = draw_terms(
        pairs, sources, args.terms, args.min_prob, both_ways=args.draw == "one-to-one"
    )
    workers = args.workers if args.workers == "auto" else int(args.workers)
    with aiayn.Translator(args.checkpoint, workers=workers) as translator:
        vocab = translator.vocab  # a small vocabulary may lack a letter: such terms are left out
        terms = {s: t for s, t in drawn.items() if vocab.unk_id not in vocab.encode_target(t)}
        if args.glossary_out:
            Path(args.glossary_out).write_text("".join(f"{s}\t{t}\n" for s, t in terms.items()))
        free = translator.request(beam=args.beam)  # a glossary widens the default beam
        plain = translator.evaluate(sources, references, free)
        search = translator.request(beam=args.beam, glossary=terms)
        termed = translator.evaluate(sources, references, search)
    assert search.glossary is not None
    applied, found, lines = present(search.glossary, sources, termed.hypotheses)
    figures = {
        "SacreBLEU with": round(termed.sacrebleu, 2),
        "SacreBLEU without": round(plain.sacrebleu, 2),
        "change": round(termed.sacrebleu - plain.sacrebleu, 2),
        "terms": len(terms),
        "applied": applied,
        "in the output": found,
        "sentences": f"{lines} of {len(sources)}",
        "beam": f"{search.decode.beam} with, {free.decode.beam} without",
        "draw": args.draw,
    }
    print(" | ".join(f"{k}: {v}" for k, v in figures.items()))
    if args.record:
        command = "python scripts/glossary_bleu.py " + " ".join(argv or sys.argv[1:])
        what = f"a glossary of {len(terms)} aligned words on the Bible test split"
        record = make_record(topic="decoding", what=what, figures=figures, command=command)
        print(f"wrote {write_record(record, args.record)}")
    return 0 if found == applied else 1


if __name__ == "__main__":
    sys.exit(main())
