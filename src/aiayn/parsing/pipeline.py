"""Constituency parsing as translation (paper section 6.3, Table 4): treebank -> dataset,
checkpoint -> EVALB F1, raw sentences -> trees. The one module of ``aiayn.parsing`` that uses
torch (through the model); the package does not import it, so the rest stays torch-free.

    prepare_parsing(split.train, split.dev, split.test, "work/ptb-sample", vocab_size=4000)
    # ... train with the ordinary trainer on "work/ptb-sample", average the last checkpoints ...
    evaluate_parser("runs/parsing-sample/averaged", "work/ptb-sample", "test")
    parse_lines("runs/parsing-sample/averaged", ["The dog barks ."])

A prepared directory holds what ``prepare_corpus`` writes (``spm.model``, ``meta.json`` and
the binarised ``train``/``valid``/``test`` splits; ``valid`` is the dev set, the name the
trainer validates on) plus ``text/{train,dev,test}.{src,tgt}`` (words / linearised trees,
one sentence a line) and ``{dev,test}.gold`` (the preprocessed gold trees, one a line, with
their POS tags: ``delinearize`` puts them on the predicted trees so that EVALB removes the
same punctuation from both sides).

The bracket tokens (``(NP``, ``)NP``, ``XX``, ...) are declared to SentencePiece as
user-defined symbols *with* the word-boundary mark ``▁`` they carry after normalisation, so
each is exactly one vocabulary piece: one decoder step per bracket, never split, never merged
with a neighbour. Without the mark a bracket costs two pieces (``▁`` and ``(NP``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sentencepiece import sentencepiece_model_pb2 as sp_model

from ..checkpoint import checkpoint_files, load_translator, read_meta
from ..data import Vocab, check_vocab, prepare_corpus
from ..data import read_meta as read_dataset_meta
from ..data.pieces import AnyVocab
from ..decode import Batching, DecodeConfig, SearchRequest, decode_ids
from ..decode.translate import check_sentences
from ..errors import UserError
from ..files import check_not_input, write_lines_atomic
from ..runtime.kernels import use_fast_paths
from .constraint import TreeConstraint
from .evalb import evalb_score
from .linearize import Leaves, delinearize, index_token, is_bracket, linearize, source_line
from .trees import Tree, read_tree_lines, read_treebank, to_bracketed, write_tree_lines
from .wsj import write_tree_pairs

WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁"
PARSING_SPLITS = ("train", "dev", "test")
# The trainer validates on "valid"; the treebank calls that split "dev".
BINARISED_NAME = {"train": "train", "dev": "valid", "test": "test"}
# Word markers a ``--leaves index`` vocabulary has at least (the WSJ's longest sentence: 249
# words in NLTK's sample, 141 in sections 02-21).
MIN_INDEX_TOKENS = 300
# Constrained search opens at most this many brackets in a row: the WSJ sample's training
# trees have at most 6 (one tree; 5 in 27), and without a bound the 30-minute model nested
# (X (X (X ... rather than copy a word it did not expect (docs/parsing.md).
MAX_OPEN_RUN = 8


PARSING_INFO = "parsing.json"  # prepare_parsing's summary beside the dataset


def text_paths(data_dir: str | Path, split: str) -> tuple[Path, Path]:
    """(words file, linearised-tree file) of ``split`` in a prepared directory."""
    text = Path(data_dir) / "text"
    return text / f"{split}.src", text / f"{split}.tgt"


def gold_path(data_dir: str | Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.gold"


def _prepared_text(data_dir: Path) -> list[Path]:
    """The text files ``prepare_parsing`` writes before binarising."""
    texts = [p for split in PARSING_SPLITS for p in text_paths(data_dir, split)]
    return texts + [gold_path(data_dir, split) for split in PARSING_SPLITS if split != "train"]


def bracket_symbols(trees: Iterable[Tree], leaves: Leaves = "XX", max_words: int = 0) -> list[str]:
    """The target tokens of ``trees`` as SentencePiece user-defined symbols (``▁(NP``...),
    sorted so that the vocabulary does not depend on the order of the trees. With
    ``leaves="tags"`` the POS tags are symbols too, with ``leaves="index"`` the markers of
    ``max_words`` words (one piece, one decoder step each); words (``leaves="words"``) are
    left to the subword model."""
    written = leaves if leaves in ("index", "tags") else "XX"
    symbols = {tok for tree in trees for tok in linearize(tree, written)}
    if leaves == "index":
        symbols |= {index_token(i) for i in range(1, max_words + 1)}
    return sorted(WORD_BOUNDARY + tok for tok in symbols)


def prepare_parsing(
    train_files: Sequence[str | Path],
    dev_files: Sequence[str | Path],
    test_files: Sequence[str | Path],
    out_dir: str | Path,
    vocab_size: int = 4000,
    max_len: int | None = None,
    leaves: Leaves = "XX",
) -> dict[str, Any]:
    """Read and preprocess the ``.mrg`` files of each split, write the parallel text and the
    gold trees, then build the shared vocabulary (brackets atomic) and the binarised dataset.

    ``max_len`` (subwords per side) is off by default: the longest WSJ sample tree is 573
    target tokens, and dropping long sentences from dev/test would bias the F1.
    ``leaves="index"`` / ``"tags"`` / ``"words"`` write word markers / POS tags / words
    instead of ``XX`` in the targets (options; see ``linearize``); the choice is recorded in
    the dataset's ``meta.json`` (and so in every checkpoint trained on it) and in
    ``parsing.json``.
    Returns ``prepare_corpus``'s summary plus the sentence counts and the number of symbols.
    """
    out = Path(out_dir)
    treebank = [*train_files, *dev_files, *test_files]
    for output in [out, *_prepared_text(out), out / PARSING_INFO]:
        check_not_input(output, treebank, option="--out")
    (out / "text").mkdir(parents=True, exist_ok=True)
    trees = {
        "train": read_treebank(train_files),
        "dev": read_treebank(dev_files),
        "test": read_treebank(test_files),
    }
    for split, split_trees in trees.items():
        if not split_trees:
            raise UserError(f"the {split} split has no trees")
        write_tree_pairs(split_trees, *text_paths(out, split), leaves=leaves)
        if split != "train":
            write_tree_lines(split_trees, gold_path(out, split))
    # Markers for the longest sentence of any split, and for at least MIN_INDEX_TOKENS words
    # so that `aiayn parse parse` can take longer sentences than the treebank's.
    longest = max(len(tree.words()) for split_trees in trees.values() for tree in split_trees)
    symbols = bracket_symbols(trees["train"], leaves, max(longest, MIN_INDEX_TOKENS))
    summary = prepare_corpus(
        {BINARISED_NAME[s]: text_paths(out, s) for s in PARSING_SPLITS},
        out,
        vocab_size=vocab_size,
        max_len=max_len,
        user_defined_symbols=symbols,
        record={"task": "parsing", "leaves": leaves},
    )
    info = {
        "sentences": {s: len(t) for s, t in trees.items()},
        "bracket_symbols": len(symbols),
        "leaves": leaves,
        "files": {s: len(f) for s, f in zip(PARSING_SPLITS, (train_files, dev_files, test_files))},
    }
    (out / PARSING_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return {**summary, **info}


def ids_to_tokens(vocab: Vocab, ids: Iterable[int]) -> list[str]:
    """Decoded ids -> target tokens: up to the first eos, pieces joined as SentencePiece
    joins them (``▁`` starts a token). Brackets are single pieces, so this is mostly one
    token per id; a stray subword piece merges into its neighbour and is then dropped by
    ``delinearize``'s repair rule 1."""
    pieces = [vocab.id_to_piece(i) for i in vocab.content_ids(ids)]
    return "".join(pieces).replace(WORD_BOUNDARY, " ").split()


def prepared_leaves(data_dir: str | Path) -> Leaves:
    """How the targets of a prepared directory write preterminals: as its ``meta.json``
    records, else its ``parsing.json`` (directories from before the record), else "XX"
    (directories from before the option)."""
    recorded = read_dataset_meta(data_dir).get("record", {}).get("leaves")
    info = Path(data_dir) / PARSING_INFO
    if recorded is None and info.exists():
        recorded = json.loads(info.read_text(encoding="utf-8")).get("leaves")
    return recorded or "XX"


def trained_leaves(checkpoint: str | Path) -> Leaves | None:
    """The leaf form of the data ``checkpoint`` was trained on, as the dataset's record in its
    ``meta.json`` says; None for a checkpoint that records none (trained before the record)."""
    dataset = read_meta(Path(checkpoint)).get("dataset") or {}
    return dataset.get("record", {}).get("leaves")


def decode_leaves(checkpoint: str | Path, asked: Leaves | None = None) -> Leaves:
    """The leaf form to decode ``checkpoint`` with: the recorded one (``trained_leaves``), which
    ``asked`` may repeat but not contradict; ``asked``, else "XX", where none is recorded."""
    recorded = trained_leaves(checkpoint)
    if recorded is not None and asked is not None and asked != recorded:
        raise UserError(
            f"{checkpoint} was trained on --leaves {recorded} targets (its meta.json says so): "
            f"decoding it with --leaves {asked} misreads every tree; drop --leaves"
        )
    return recorded or asked or "XX"


def leaf_tokens(vocab: Vocab) -> list[str]:
    """The target tokens that stand for a preterminal in ``vocab``: its user-defined symbols
    that are not brackets (``XX``, or the markers or tags of a ``--leaves index|tags``
    vocabulary), markers in word order.

    Read from the model itself, so a checkpoint is enough to decode with; SentencePiece's
    Python API has no "is user-defined" query, hence its model proto."""
    proto = sp_model.ModelProto()
    proto.ParseFromString(vocab.sp.serialized_model_proto())
    user = sp_model.ModelProto.SentencePiece.USER_DEFINED
    tokens = {p.piece.removeprefix(WORD_BOUNDARY) for p in proto.pieces if p.type == user}
    markers = [index_token(i) for i in range(1, len(tokens) + 1) if index_token(i) in tokens]
    return markers or sorted(tok for tok in tokens if not is_bracket(tok))


def tree_constraint(vocab: Vocab, copy_words: bool = False) -> TreeConstraint:
    """Constrained decoding over ``vocab``'s bracket and leaf pieces (``--constrained``);
    ``copy_words`` for a ``--leaves words`` model (its vocabulary cannot say so: it declares
    ``XX`` like the paper's)."""
    leaves = leaf_tokens(vocab)
    return TreeConstraint(
        [vocab.id_to_piece(i) for i in range(len(vocab))],
        vocab.eos_id,
        WORD_BOUNDARY,
        leaves,
        indexed=leaves[0] == index_token(1),
        copy_words=copy_words,
        max_open_run=MAX_OPEN_RUN,
    )


def _parser_vocab(vocab: AnyVocab, checkpoint: str | Path) -> Vocab:
    """A parser's one SentencePiece model (the leaves are read from it), or a one-line refusal
    of a checkpoint with one model per side, such as an imported translator."""
    if not isinstance(vocab, Vocab):
        raise UserError(f"{checkpoint}: not a parser (it has a vocabulary per side)")
    return vocab


def _parse_words(
    model: Any,
    vocab: Vocab,
    sentences: Sequence[Sequence[str]],
    decode: DecodeConfig,
    tags: Sequence[Sequence[str]] | None = None,
    progress: bool = False,
    constrained: bool = False,
    leaves: Leaves = "XX",
) -> list[tuple[Tree, bool]]:
    """Beam-decode word lists (none empty) -> (tree, repaired) each, in input order."""
    if leaves == "index":
        markers = len(leaf_tokens(vocab))
        if (longest := max((len(words) for words in sentences), default=0)) > markers:
            raise UserError(
                f"a sentence of {longest} words: this vocabulary marks at most {markers}"
            )
    sources = [vocab.encode_source(source_line(words, leaves)) for words in sentences]
    constraint = tree_constraint(vocab, leaves == "words") if constrained else None
    # Outputs are long (+300): fewer sentences a batch than translation's (the token budget
    # already shrinks with the beam's 21 rows).
    request = SearchRequest(decode, constraints=constraint, batching=Batching(batch_size=16))
    nbest = decode_ids(model, sources, request.with_ids(vocab), progress=progress)
    out = []
    for i, (words, hyps) in enumerate(zip(sentences, nbest)):
        tokens = ids_to_tokens(vocab, hyps[0].tokens) if hyps else []
        out.append(
            delinearize(tokens, list(words), None if tags is None else list(tags[i]), leaves)
        )
    return out


def _load(checkpoint: str | Path, device: str) -> tuple[Any, Vocab]:
    """(model, vocabulary) of a checkpoint, with the fast kernels it always parsed with (not
    the packed weights of ``runtime.for_decoding``: the same trees as before)."""
    model, vocab = load_translator(checkpoint, device)
    return use_fast_paths(model), _parser_vocab(vocab, checkpoint)


def evaluate_parser(
    checkpoint: str | Path,
    data_dir: str | Path,
    split: str,
    decode: DecodeConfig = DecodeConfig.preset("parsing"),
    limit: int | None = None,
    out_dir: str | Path | None = None,
    device: str = "cpu",
    progress: bool = False,
    constrained: bool = False,
) -> dict[str, Any]:
    """Parse the ``split`` ("dev" or "test") sentences of ``data_dir`` with ``checkpoint`` and
    score them with EVALB (COLLINS.prm) against the gold trees.

    Writes ``{split}.parsed`` (predicted trees with the gold tags, one a line, as EVALB reads
    them) and ``{split}.evalb`` (EVALB's summary and the repair count) to ``out_dir`` (default:
    the checkpoint directory), each atomically. Returns P/R/F1 and complete match for all
    sentences and for len<=40, the repair rate and the paths. ``constrained`` searches only
    well-formed trees (``aiayn.parsing.constraint``; not the paper's search).
    """
    if split not in ("dev", "test"):
        raise UserError(f"split must be 'dev' or 'test', got {split!r}")
    out = Path(out_dir) if out_dir is not None else Path(checkpoint)
    trees_path, report_path = out / f"{split}.parsed", out / f"{split}.evalb"
    inputs = [gold_path(data_dir, split), *checkpoint_files(Path(checkpoint))]
    for output in (trees_path, report_path):
        check_not_input(output, inputs, option="--out")
    gold = _gold_trees(data_dir, split, limit)
    model, vocab = _load(checkpoint, device)
    check_vocab(data_dir, vocab)
    leaves = prepared_leaves(data_dir)
    parsed = _parse_words(
        model,
        vocab,
        [g.words() for g in gold],
        decode,
        tags=[g.tags() for g in gold],
        progress=progress,
        constrained=constrained,
        leaves=leaves,
    )
    predicted = [tree for tree, _ in parsed]
    repaired = sum(flag for _, flag in parsed)
    result = evalb_score(gold, predicted)
    write_lines_atomic(trees_path, [to_bracketed(t) for t in predicted])
    header = _header(checkpoint, split, len(gold), decode, constrained, repaired)
    write_lines_atomic(report_path, (header + result.format_report()).splitlines())
    return {
        "split": split,
        "sentences": len(gold),
        "constrained": constrained,
        "leaves": leaves,
        "repaired": repaired,
        "repair_rate": repaired / len(gold) if gold else 0.0,
        "errors": result.n_errors,
        "skipped": result.n_skipped,
        "predictions": str(trees_path),
        "report": str(report_path),
        **_scores(result),
    }


def _header(
    checkpoint: str | Path,
    split: str,
    n: int,
    decode: DecodeConfig,
    constrained: bool,
    repaired: int,
) -> str:
    """What the EVALB report says above EVALB's own summary: what was parsed, and how."""
    return (
        f"checkpoint {checkpoint}\nsplit {split}: {n} sentences\n"
        f"decode beam={decode.beam} alpha={decode.alpha} "
        f"max_len={decode.max_len_a:g}*src+{decode.max_len_b}"
        f"{' constrained to well-formed trees' if constrained else ''}\n"
        f"repaired outputs {repaired} of {n}\n\n"
    )


def _gold_trees(data_dir: str | Path, split: str, limit: int | None) -> list[Tree]:
    """The split's gold trees (its first ``limit``), or ``UserError`` for a blank line."""
    gold = read_tree_lines(gold_path(data_dir, split))
    if limit is not None:
        gold = gold[:limit]
    trees = [tree for tree in gold if tree is not None]
    if len(trees) < len(gold):
        raise UserError(f"{gold_path(data_dir, split)} has a blank line")
    return trees


def _scores(result: Any) -> dict[str, float]:
    """EVALB's precision, recall, F1 and complete match, for all sentences and len <= 40."""
    scores = {}
    for name, totals in (("", result.all), ("_le40", result.short)):
        scores[f"precision{name}"] = totals.precision
        scores[f"recall{name}"] = totals.recall
        scores[f"f1{name}"] = totals.f1
        scores[f"complete_match{name}"] = totals.complete_match
    return scores


def parse_lines(
    checkpoint: str | Path,
    lines: Sequence[str],
    decode: DecodeConfig = DecodeConfig.preset("parsing"),
    device: str = "cpu",
    constrained: bool = False,
    leaves: Leaves | None = None,
) -> list[str]:
    """Tokenised sentences (PTB tokens split by spaces) -> one-line bracketed trees whose
    preterminals are tagged ``XX`` (the model predicts no tags); a blank line gives "".

    ``leaves``: how the checkpoint's training targets wrote preterminals; by default what the
    checkpoint records (``decode_leaves``)."""
    check_sentences(lines, "lines")
    leaves = decode_leaves(checkpoint, leaves)
    model, vocab = _load(checkpoint, device)
    words = [line.split() for line in lines]
    index = [i for i, w in enumerate(words) if w]
    parsed = _parse_words(
        model, vocab, [words[i] for i in index], decode, constrained=constrained, leaves=leaves
    )
    out = [""] * len(lines)
    for i, (tree, _) in zip(index, parsed):
        out[i] = to_bracketed(tree)
    return out


__all__ = [
    "prepare_parsing",
    "evaluate_parser",
    "parse_lines",
    "ids_to_tokens",
    "bracket_symbols",
    "text_paths",
    "gold_path",
    "tree_constraint",
    "prepared_leaves",
    "trained_leaves",
    "decode_leaves",
]
