"""``aiayn score``: forced decoding, the log-probability a checkpoint gives each reference
(``aiayn.decode.score``), e.g. to filter back-translations or to compare two models on the
same pairs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

from ..errors import UserError
from .decoding import add_decode_args, decode_config, open_translator


def read_pairs(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """(sources, references, what errors call the references) from ``--src``/``--ref``, or
    from ``source<TAB>reference`` lines on stdin."""
    from ..evaluate import check_test_pair, read_test_pair
    from ..files import iter_lines

    if (args.src is None) != (args.ref is None):
        raise UserError("give --src and --ref together, or neither (then: TSV on stdin)")
    if args.src is not None:  # evaluate's checks: empty files, line counts, no source text
        return *read_test_pair(args.src, args.ref, task="score"), args.ref
    pairs = list(_tsv_pairs(iter_lines(sys.stdin.buffer, "<stdin>")))
    sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    check_test_pair(sources, references, "<stdin>", "<stdin>", task="score")
    return sources, references, "<stdin>"


def _tsv_pairs(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    for lineno, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise UserError(
                f"<stdin>: line {lineno}: expected source<TAB>reference, found "
                f"{len(fields) - 1} tab(s)"
            )
        yield fields[0], fields[1]


def _score(args: argparse.Namespace) -> None:
    from ..train.loss import perplexity

    fmt = args.format or ("jsonl" if args.tokens else "tsv")
    if args.tokens and fmt != "jsonl":
        raise UserError("--tokens prints JSON lines: drop --format tsv")
    alpha = decode_config(args).alpha
    sources, references, name = read_pairs(args)
    translator = open_translator(args, "score")
    scores = translator.score(sources, references, alpha=alpha, name=name, eos=not args.no_eos)
    vocab = translator.vocab
    for score, reference, sentence_id in zip(scores, references, range(len(scores))):
        if fmt == "tsv":
            print("\t".join(("", "", "", "") if score is None else _tsv_fields(score)))
        else:
            target = vocab.encode_target(reference) + [vocab.eos_id] if args.tokens else []
            pieces = [vocab.id_to_piece(t) for t in target] if args.tokens else None
            print(json.dumps(score_record(score, sentence_id, pieces), ensure_ascii=False))
    scored = [s for s in scores if s is not None]
    log_prob, length = sum(s.log_prob for s in scored), sum(s.length for s in scored)
    empty = len(scores) - len(scored)
    print(
        f"aiayn score: {len(scored)} pairs, {length} target tokens "
        f"({'no eos' if args.no_eos else 'eos included'}): log-prob "
        f"{log_prob:.4f}, perplexity {perplexity(-log_prob, length):.4f}"
        + (f"; {empty} empty source(s) not scored" if empty else ""),
        file=sys.stderr,
    )


def _tsv_fields(score) -> tuple[str, ...]:
    return (f"{score.log_prob:.6f}", str(score.length), f"{score.score:.6f}", f"{score.ppl:.6f}")


def score_record(score, sentence_id: int, pieces: list[str] | None = None) -> dict:
    """One JSON line: the pair's ``id`` (from 0, as ``translate``'s n-best lines and JSON
    lines count them), its numbers (null for an empty source) and, given the target's
    pieces, [piece, log-prob] for each of them."""
    record: dict = {"id": sentence_id}
    fields = ("log_prob", "length", "score", "ppl")
    record.update({f: None if score is None else getattr(score, f) for f in fields})
    if pieces is not None:
        lps = [] if score is None else score.token_log_probs
        record["tokens"] = [[p, lp] for p, lp in zip(pieces, lps)]
    return record


def add_score(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score",
        help="forced decoding: log-probability, length, GNMT score and perplexity of references",
        description="Print per pair: log P(ref | src) (eos included), its length |Y|, the "
        "GNMT score log P / lp(|Y|) the beam search ranks by, and exp(-log P / |Y|), "
        "tab-separated; --tokens (JSON lines) adds log P of every subword. The sum over "
        "tokens is the training loss without label smoothing.",
    )
    add_decode_args(p, search=False, ensemble=True)
    p.add_argument("--src", help="source text (.gz allowed)")
    p.add_argument("--ref", help="reference text, one line per source line (.gz allowed)")
    p.add_argument("--tokens", action="store_true", help="log-probability of every subword")
    p.add_argument(
        "--no-eos",
        action="store_true",
        help="score each reference as an unfinished output, without eos: what translate "
        'prints for an output cut at the length limit ("cut" in its JSON lines)',
    )
    p.add_argument(
        "--format",
        choices=["tsv", "jsonl"],
        help='default: tsv (jsonl with --tokens: {"id" from 0, "log_prob", "length", "score", '
        '"ppl"}, as translate --format jsonl numbers its lines)',
    )
    p.set_defaults(func=_score)
