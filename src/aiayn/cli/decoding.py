"""The decoding options of the commands that run a checkpoint, declared once and passed
through whole: each option's destination is the keyword of ``aiayn.Translator(...)`` (how the
checkpoint loads) or ``Translator.request(...)`` (how to search), and the Translator checks
them all, named as options (``capabilities.COMMAND_LINE``). Nothing here checks an option of
its own: a check the command line has, Python users have too."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .common import add_device_arg

if TYPE_CHECKING:
    from ..decode import DecodeConfig, SearchRequest
    from ..translator import Translator

# --search-rules' choices: aiayn.decode.rules.SEARCH_RULES' names (tested), named here so
# that parsing the command line does not import torch.
SEARCH_RULE_NAMES = ("paper", "fairseq", "hf", "ct2", "marian")

# (beam help, alpha help) as each decode preset's commands state its defaults.
_PRESET_HELP = {
    "translation": (
        "beam size (translation preset: 4)",
        "GNMT length penalty alpha (translation preset: 0.6)",
    ),
    "parsing": ("beam size (paper: 21)", "GNMT length penalty alpha (paper: 0.3)"),
}


def add_decode_args(
    p: argparse.ArgumentParser,
    preset: str | None = None,
    *,
    search: bool = True,
    outputs: bool = False,
    ensemble: bool = False,
) -> None:
    """The options of every command that decodes with a checkpoint (translate, evaluate, score,
    parse evaluate, parse parse): every decoding option belongs here.

    ``preset=None`` lets ``--decode-preset`` choose (the translation commands); ``"parsing"``
    fixes the preset and adds its constrained search. ``search=False`` (score: forced
    decoding) leaves out the beam; ``outputs`` (translate) adds what it prints besides the best
    line (``add_output_args``); ``ensemble``: ``--checkpoint`` may repeat (a list).
    """
    if ensemble:
        p.add_argument(
            "--checkpoint",
            action="append",
            required=True,
            help="checkpoint or averaged directory; repeat it to decode with an ensemble (the "
            "models' log-probabilities averaged at every step; one vocabulary)",
        )
    else:
        p.add_argument("--checkpoint", required=True, help="checkpoint or averaged directory")
    if preset is None:
        p.add_argument(
            "--decode-preset", dest="preset", default="translation", choices=list(_PRESET_HELP)
        )
    else:
        p.set_defaults(preset=preset)
    beam_help, alpha_help = _PRESET_HELP[preset or "translation"]
    if search:
        p.add_argument("--beam", type=int, help=beam_help)
    p.add_argument("--alpha", type=float, help=alpha_help)
    if search and preset is None:
        p.add_argument(
            "--search-rules",
            dest="rules",
            default="paper",
            choices=list(SEARCH_RULE_NAMES),
            help="whose beam-search rules to follow: the paper's (GNMT penalty, exact stop, "
            "|X|+50), or fairseq's, Hugging Face's, CTranslate2's or Marian's length penalty, "
            "stopping rule and length limit (docs/decoding.md; default: paper)",
        )
        _add_guard_args(p)
    if preset == "parsing":
        p.add_argument(
            "--constrained",
            action="store_true",
            help="search only well-formed trees with one leaf per word (not in the paper; "
            "default: the paper's search, then repair)",
        )
    add_device_arg(p)
    if preset is None:
        add_quantize_arg(p)
        add_precision_args(p)
    if search and preset is None:
        add_glossary_arg(p)
        add_target_lang_arg(p)
    if outputs:
        add_output_args(p)


def add_glossary_arg(p: argparse.ArgumentParser) -> None:
    """``--glossary``: terms that become lexical constraints (``aiayn.text.glossary``)."""
    p.add_argument(
        "--glossary",
        metavar="FILE",
        help="source<TAB>target terms: where a term's source occurs in a sentence (whole words, "
        "case-sensitive), its output must hold the target (docs/glossary.md)",
    )


def add_target_lang_arg(p: argparse.ArgumentParser) -> None:
    """``--target-lang`` of a multilingual model (its ``>>xx<<`` tokens)."""
    p.add_argument(
        "--target-lang",
        metavar="CODE",
        help="the language to translate into, for a model with language tokens (>>CODE<<, "
        "put in front of every source; docs/glossary.md#target-languages)",
    )


def _add_guard_args(p: argparse.ArgumentParser) -> None:
    """The repetition guards (``aiayn.decode.repetition``), for every rule and sampling."""
    p.add_argument(
        "--no-repeat-ngram-size",
        type=int,
        metavar="N",
        help="never repeat an N-gram of the output (transformers' definition; not in the "
        "paper; default: off)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        metavar="P",
        help="multiply the log-probability of every token already in the output by P "
        "(> 1 penalises; transformers' beam-search definition; default: 1, off)",
    )


def add_output_args(p: argparse.ArgumentParser) -> None:
    """N-best lists, JSON lines and token scores (``aiayn.decode.nbest``)."""
    p.add_argument(
        "--nbest",
        type=int,
        metavar="K",
        help="the K best per input line, as 'sentence-id ||| text ||| score ||| log-prob' "
        "(ids from 0; score = log-prob / GNMT lp); raises --beam to K unless given",
    )
    p.add_argument(
        "--format",
        choices=["text", "jsonl"],
        help="text: lines as above; jsonl: one JSON object per input line, "
        '{"id", "hypotheses": [{"text", "score", "log_prob", "length"}]} '
        "(default: text, jsonl with --token-scores)",
    )
    p.add_argument(
        "--token-scores",
        action="store_true",
        help="add [piece, log-prob] of every output subword, eos included (JSON lines)",
    )
    p.add_argument(
        "--alignments",
        action="store_true",
        help="word alignments from the encoder-decoder attention, Pharaoh 'i-j' pairs (source "
        "word i, target word j, from 0): 'text ||| pairs' lines, a 5th n-best field, or "
        '"alignment" in JSON',
    )
    p.add_argument(
        "--alignment-layer",
        type=int,
        help="with --alignments: the decoder layer whose attention aligns (from 0; default "
        "-1: the last)",
    )
    _add_constraint_args(p)
    _add_sampling_args(p)


def _add_constraint_args(p: argparse.ArgumentParser) -> None:
    """Target prefixes and lexical constraints, a file of one line per input line."""
    g = p.add_argument_group("constraints (aiayn.decode.constraints)")
    g.add_argument(
        "--prefix",
        dest="prefixes",  # Translator.translate's keyword
        metavar="FILE",
        help="one line per input line: the fixed start of its output (blank: none)",
    )
    g.add_argument(
        "--constraints",
        metavar="FILE",
        help="one line per input line: tab-separated words or phrases its output must "
        "contain (blank: none)",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    """``--sample`` and how it draws (``aiayn.decode.sample``)."""
    g = p.add_argument_group("sampling (not in the paper; e.g. for back-translation)")
    g.add_argument(
        "--sample",
        action="store_true",
        help="draw outputs from the model instead of beam search (--nbest N: N per source)",
    )
    g.add_argument("--top-k", type=int, help="draw among the K most probable tokens (0: all)")
    g.add_argument(
        "--top-p", type=float, help="draw among the fewest tokens of probability >= P (1: all)"
    )
    g.add_argument("--temperature", type=float, help="< 1 sharpens, > 1 flattens (default: 1)")
    g.add_argument(
        "--seed",
        type=int,
        help="the same seed gives the same samples (each line has its own random stream; "
        "another batching can change the last bits of the probabilities, so give --batch-size "
        "1 for samples independent of it; default: 0)",
    )


def add_corpus_args(p: argparse.ArgumentParser, *, window: bool = False) -> None:
    """How a command that translates a whole file batches it and shows its progress
    (``aiayn.decode.translate_corpus``, whose defaults the help states: importing them here
    would import torch for ``--help``); ``window``: the file is written a window at a time."""
    if window:
        p.add_argument(
            "--window",
            type=int,
            metavar="LINES",
            help="lines read, sorted by length, translated and written together; memory grows "
            "with it, not with the file (default: 100000)",
        )
    p.add_argument(
        "--max-tokens",
        type=int,
        help="padded source tokens in one batch at most (default: 8000; a beam over 4 gets "
        "8000 x 4 / beam, as its rows grow)",
    )
    p.add_argument("--batch-size", type=int, help="sentences in one batch at most (default: 64)")
    p.add_argument(
        "--workers",
        type=workers_arg,
        default="auto",
        help="CPU processes decoding batches side by side, sharing the threads; auto: one per "
        "thread on the CPU (at most 8), 1 on a GPU (default: auto; 2 on 2 cores is faster than "
        "2 threads in one; the same outputs; with --engine ctranslate2, its replicas)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar (shown on stderr, with sentences/s and ETA, when it is a terminal)",
    )


def workers_arg(text: str) -> int | str:
    """``--workers``: a count or "auto" (resolved by ``aiayn.Translator`` once the device is known)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of processes or auto, not {text!r}") from None


def add_shortlist_args(p: argparse.ArgumentParser) -> None:
    """The vocabulary shortlist of translate and evaluate (``aiayn.decode.shortlist``); the
    defaults are the library's, stated here so that ``--help`` does not import torch."""
    p.add_argument(
        "--shortlist",
        metavar="FILE",
        help="search each sentence over its own shortlist from FILE (aiayn shortlist builds "
        "it): faster, and outputs change (opt-in; docs/decoding.md)",
    )
    p.add_argument(
        "--shortlist-frequent",
        type=int,
        metavar="K",
        help="the K most frequent target pieces are always in (default: 100)",
    )
    p.add_argument(
        "--shortlist-best",
        type=int,
        metavar="M",
        help="and each source piece's M likeliest translations (default: 10)",
    )


def add_quantize_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize",
        choices=["int8"],
        help="int8 weights for the Linear layers (CPU; quantized after loading)",
    )


def add_precision_args(p: argparse.ArgumentParser) -> None:
    """``--precision`` and ``--verbose`` (which says on stderr what it chose and why)."""
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="bf16: weights and activations in bf16, log-probabilities and scores in fp32; "
        "auto (default): fp32 unless bf16 is native and measured faster at the same BLEU "
        "(docs/decoding.md#precision)",
    )
    p.add_argument("--verbose", action="store_true", help="say on stderr how the model decodes")


ENGINES = (
    "torch",
    "ctranslate2",
    "onnxruntime",
)  # aiayn.translator.ENGINES (tested): --help without torch


def add_engine_arg(p: argparse.ArgumentParser) -> None:
    """``--engine`` of translate, evaluate and serve (``aiayn.decode.engine``)."""
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="torch",
        help="what decodes: torch (ours, the reference), ctranslate2 (the checkpoint "
        "exported once into CHECKPOINT.ctranslate2/ beside it; the same search and outputs) "
        "or onnxruntime (our search on its ONNX graphs, exported once into CHECKPOINT.onnx/, "
        "or on an `aiayn export --to onnx` directory given as --checkpoint)",
    )


def keywords(args: argparse.Namespace, function: Callable[..., Any]) -> dict[str, Any]:
    """The parsed options that are keywords of ``function``, passed through whole: an option's
    destination is its keyword (``--top-k`` is ``top_k``), as sacrebleu's command line passes
    its options into ``BLEU(**kwargs)``; the library checks them all."""
    names = inspect.signature(function).parameters
    return {name: value for name, value in vars(args).items() if name in names}


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """The decoding options as a ``DecodeConfig`` (``DecodeConfig.choose``), for the commands
    that decode without a ``SearchRequest``: score (its alpha) and the parsing pipeline."""
    from ..decode import DecodeConfig

    names = inspect.signature(DecodeConfig).parameters
    options = {k: v for k, v in vars(args).items() if k in names or k == "rules"}
    return DecodeConfig.choose(args.preset, **options)


def open_translator(
    args: argparse.Namespace, command: str, loading: dict[str, Any] | None = None
) -> Translator:
    """The ``aiayn.Translator`` of the loading options as parsed (``--checkpoint``, repeated for
    an ensemble, ``--device``, ``--precision``, ``--workers``, ``--engine``, ``--quantize``;
    a command without ``--workers``, score and serve, decodes in one process), its refusals
    named as options; its precision said on stderr with ``--verbose``. Nothing loads yet.
    ``loading``: those options, already picked (``keywords``)."""
    from ..decode.capabilities import COMMAND_LINE
    from ..translator import Translator

    options = {"workers": 1, **(keywords(args, Translator) if loading is None else loading)}
    translator = Translator(**options, spelling=COMMAND_LINE)
    if getattr(args, "verbose", False):
        precision = translator.precision
        print(f"aiayn {command}: precision {precision.name}: {precision.reason}", file=sys.stderr)
    return translator


def open_decoding(args: argparse.Namespace, command: str) -> tuple[Translator, SearchRequest]:
    """The one ``aiayn.Translator`` of a command that decodes, and the one request its search
    options ask for (``Translator.request``: every check, before the model loads, but for a
    shortlist's file, which is read for the checkpoint's vocabulary)."""
    from ..translator import Translator

    loading, search = keywords(args, Translator), keywords(args, Translator.request)
    translator = open_translator(args, command, loading)
    return translator, translator.request(**search)
