"""What several commands share, written once: the decoding options and the ``DecodeConfig``
they make, the device, the thread count, the training run, and the line saying where a
command wrote."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from ..decode import Batching, DecodeConfig, SampleConfig, SearchRequest
    from ..decode.capabilities import Feature
    from ..translator import Translator

# --search-rules' choices: aiayn.decode.rules.SEARCH_RULES' names (tested), named here so
# that parsing the command line does not import torch.
SEARCH_RULE_NAMES = ("paper", "fairseq", "hf", "ct2")

# (beam help, alpha help) as each decode preset's commands state its defaults.
_PRESET_HELP = {
    "translation": (
        "beam size (translation preset: 4)",
        "GNMT length penalty alpha (translation preset: 0.6)",
    ),
    "parsing": ("beam size (paper: 21)", "GNMT length penalty alpha (paper: 0.3)"),
}


def say_wrote(command: str, *paths: str | Path) -> None:
    """Where a command wrote, as absolute paths: relative ones resolve against the working directory."""
    print(
        f"aiayn {command}: wrote {', '.join(str(Path(p).resolve()) for p in paths)}",
        file=sys.stderr,
    )


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
        p.add_argument("--decode-preset", default="translation", choices=list(_PRESET_HELP))
    else:
        p.set_defaults(decode_preset=preset)
    beam_help, alpha_help = _PRESET_HELP[preset or "translation"]
    if search:
        p.add_argument("--beam", type=int, help=beam_help)
    p.add_argument("--alpha", type=float, help=alpha_help)
    if search and preset is None:
        p.add_argument(
            "--search-rules",
            default="paper",
            choices=list(SEARCH_RULE_NAMES),
            help="whose beam-search rules to follow: the paper's (GNMT penalty, exact stop, "
            "|X|+50), or fairseq's, Hugging Face's or CTranslate2's length penalty, stopping "
            "rule and length limit (docs/decoding.md; default: paper)",
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
    if outputs:
        add_output_args(p)


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
    """``--workers``: a count or "auto" (resolved by ``workers_option`` once the device is known)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of processes or auto, not {text!r}") from None


def workers_option(args: argparse.Namespace) -> int:
    """``--workers`` as a count, at least 1 (``decode.workers.resolve_workers`` on
    ``--device``, as ``aiayn.Translator`` resolves it); 1 for a command without the option."""
    from ..decode.workers import resolve_workers

    return resolve_workers(getattr(args, "workers", 1), getattr(args, "device", "cpu"))


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


def follow_checkpoint_pointers(args: argparse.Namespace) -> None:
    """``--checkpoint`` (each of them), ``--resume`` and ``--init-from`` given as a run's
    ``checkpoints/latest`` or ``checkpoints/best`` file: the checkpoint it names instead."""
    given = {name: getattr(args, name, None) for name in ("checkpoint", "resume", "init_from")}
    given = {name: value for name, value in given.items() if value not in (None, "auto")}
    if not given:
        return
    from ..checkpoint import follow_pointer

    for name, value in given.items():
        followed = [str(follow_pointer(v)) for v in value] if isinstance(value, list) else None
        setattr(args, name, followed if followed is not None else str(follow_pointer(value)))


def shortlist_sizes(args: argparse.Namespace) -> dict[str, int] | None:
    """The sizes ``--shortlist`` is cut to (``add_shortlist_args``; those not given keep the
    library's defaults), checked before anything loads; None without ``--shortlist``."""
    sizes = {"frequent": args.shortlist_frequent, "best": args.shortlist_best}
    if args.shortlist is None:
        given = [f"--shortlist-{k}" for k, v in sizes.items() if v is not None]
        if given:
            raise UserError(f"{given[0]} sizes a shortlist: give --shortlist FILE too")
        return None
    for option in ("prefix", "constraints"):  # the library's message says "constraints"
        if getattr(args, option, None) is not None:
            raise UserError(
                f"--shortlist and --{option} cannot be combined (a shortlist renumbers the "
                "pieces the search sees)"
            )
    if getattr(args, "sample", False):
        raise UserError("--shortlist restricts the beam search; --sample draws from every piece")
    chosen = {k: v for k, v in sizes.items() if v is not None}
    for key, value in chosen.items():
        if value < 0:
            raise UserError(f"--shortlist-{key} must be at least 0, got {value}")
    if chosen == {"frequent": 0, "best": 0}:
        raise UserError(
            "--shortlist-frequent 0 and --shortlist-best 0 leave only the special pieces: every "
            "output would be empty; give either at least 1"
        )
    return chosen


_BATCHING = {"max_tokens": "--max-tokens", "batch_size": "--batch-size"}


def search_request(args: argparse.Namespace, *, sampling: bool = False) -> SearchRequest:
    """The one search the options ask for (``aiayn.decode.request``), every option checked
    before a model loads: the decoding preset and its overrides, batching and, given
    ``sampling``, ``--sample``'s draw; the shortlist is read by ``open_decoding`` for the
    checkpoint's vocabulary. Without options it is ``Translator.request()`` (tested)."""
    from ..decode import SearchRequest

    check_engine_options(args)
    drawn = sample_config(args) if sampling else None
    if drawn is not None and getattr(args, "search_rules", "paper") != "paper":
        raise UserError(f"--search-rules {args.search_rules} is a beam search's; --sample draws")
    if hasattr(args, "shortlist"):
        shortlist_sizes(args)
    return SearchRequest(decode_config(args), sampling=drawn, batching=batching_option(args))


def open_decoding(
    args: argparse.Namespace, command: str, request: SearchRequest
) -> tuple[Translator, SearchRequest]:
    """The one ``aiayn.Translator`` (``open_translator``) of a command that decodes, and its
    one request: ``request`` (``search_request``) with ``--shortlist`` read for its vocabulary."""
    from dataclasses import replace

    translator = open_translator(args, command)
    sizes = shortlist_sizes(args) if hasattr(args, "shortlist") else None
    if sizes is not None:
        from ..decode.shortlist import load_shortlist

        shortlist = load_shortlist(args.shortlist, translator.vocab, **sizes)
        request = replace(request, shortlist=shortlist)
    return translator, request


def batching_option(args: argparse.Namespace) -> Batching:
    """``--max-tokens`` and ``--batch-size`` (``add_corpus_args``), each at least 1, those
    not given keeping the one policy's defaults; and ``--workers`` (``workers_option``)."""
    from ..decode import Batching

    given = {k: getattr(args, k) for k in _BATCHING if getattr(args, k, None) is not None}
    for key, value in given.items():
        if value < 1:
            raise UserError(f"{_BATCHING[key]} must be at least 1, got {value}")
    return Batching(**given, workers=workers_option(args))


def window_option(args: argparse.Namespace) -> dict[str, int]:
    """``--window`` as ``translate_corpus``'s keyword (none: its default), at least 1."""
    if args.window is None:
        return {}
    if args.window < 1:
        raise UserError(f"--window must be at least 1, got {args.window}")
    return {"window": args.window}


def show_progress(args: argparse.Namespace) -> bool:
    """A progress bar on stderr: when it is a terminal, and without ``--quiet``."""
    return not args.quiet and sys.stderr.isatty()


def add_device_arg(p: argparse.ArgumentParser, default: str = "cpu") -> None:
    """``--device`` of every command that runs a model; ``main`` checks it (``check_device``)
    before the command starts."""
    p.add_argument(
        "--device", default=default, help=f"cpu, cuda, cuda:N or auto (default: {default})"
    )


def check_device(name: str) -> str:
    """``--device`` as torch takes it, or a one-line ``UserError`` (``hardware.resolve_device``,
    which ``aiayn.Translator`` resolves its device with too)."""
    from ..hardware import resolve_device

    return resolve_device(name)


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


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """The preset ``add_decode_args`` chose, with ``--beam``, ``--alpha``, ``--nbest``,
    ``--search-rules`` and the repetition guards where given (``DecodeConfig.choose``, as
    ``aiayn.Translator`` takes them)."""
    from ..decode import DecodeConfig

    return DecodeConfig.choose(
        args.decode_preset,
        beam=getattr(args, "beam", None),
        alpha=args.alpha,
        nbest=getattr(args, "nbest", None),
        rules=getattr(args, "search_rules", "paper"),
        no_repeat_ngram_size=getattr(args, "no_repeat_ngram_size", None),
        repetition_penalty=getattr(args, "repetition_penalty", None),
    )


_SAMPLING = {
    "top_k": "--top-k",
    "top_p": "--top-p",
    "temperature": "--temperature",
    "seed": "--seed",
}


def sample_config(args: argparse.Namespace) -> SampleConfig | None:
    """``--sample`` and its options (``add_output_args``) as a SampleConfig; None without it."""
    from ..decode import SampleConfig
    from ..errors import UserError

    given = {k: getattr(args, k) for k in _SAMPLING if getattr(args, k, None) is not None}
    if not getattr(args, "sample", False):
        if given:
            raise UserError(f"{_SAMPLING[next(iter(given))]} needs --sample")
        return None
    if args.beam is not None:
        raise UserError("--beam has no effect with --sample (--nbest N: N samples per source)")
    return SampleConfig(samples=args.nbest or 1, **given)


def open_translator(args: argparse.Namespace, command: str) -> Translator:
    """The ``aiayn.Translator`` of ``--checkpoint`` (an ensemble when repeated), ``--device``,
    ``--precision``, ``--workers``, ``--engine`` and ``--quantize`` as parsed (a command
    without ``--workers``, score and serve, decodes in one process), its precision said on
    stderr with ``--verbose``. The options an engine cannot honour are refused first, by name."""
    from ..translator import Translator

    check_engine_options(args)
    translator = Translator(
        args.checkpoint,
        device=args.device,
        precision=getattr(args, "precision", "auto"),
        workers=getattr(args, "workers", 1),
        engine=getattr(args, "engine", "torch"),
        quantize=getattr(args, "quantize", None),
    )
    if getattr(args, "verbose", False):
        precision = translator.precision
        print(f"aiayn {command}: precision {precision.name}: {precision.reason}", file=sys.stderr)
    return translator


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads (default: torch's); 1 is far faster on a busy machine",
    )


def set_threads(args: argparse.Namespace) -> None:
    """Apply ``--threads`` (``add_threads_arg``); without it torch keeps its default."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def add_train_args(
    p: argparse.ArgumentParser, recipe: str, set_example: str, resume_help: str
) -> None:
    """The options of a training command: a config (``recipe`` names a bundled one), overrides,
    resumption and the device."""
    p.add_argument(
        "config",
        nargs="?",
        help=f"YAML/TOML/JSON file of TrainConfig keys, or a bundled recipe: {recipe}",
    )
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help=f"override, e.g. {set_example}"
    )
    p.add_argument("--resume", default="auto", help=resume_help)
    p.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="fine-tune: start a new run from this checkpoint's weights (its vocabulary: "
        "prepare the new text with --vocab CHECKPOINT); OUT's own latest "
        "checkpoint, when there is one, is resumed instead",
    )
    p.add_argument(
        "--init-from-keep",
        metavar="PARTS",
        help="also carry over its optimizer, schedule or both (optimizer,schedule); "
        "default: fresh ones",
    )
    add_device_arg(p, default="auto")


def run_training(args: argparse.Namespace, command: str, **defaults: str) -> None:
    """Train as ``add_train_args`` parsed (``defaults``: TrainConfig keys, e.g. the preset, that
    a config and ``--set`` override); the main process prints the summary, the run's cost
    against the matmul peak measured here, and where it wrote.

    SIGTERM or Ctrl-C stops the run after the update in progress with a checkpoint, one line
    saying where and how to resume, and the exit status a shell gives the signal (143, 130).
    """
    from ..train.preemption import exit_code
    from ..workflow import train_model

    def say_stopped(summary: dict[str, Any]) -> None:
        print(_stopped_line(args, command, summary), file=sys.stderr)

    run = train_model(
        args.config,
        overrides=args.set or [],
        resume=args.resume,
        device=args.device,
        init_from=args.init_from,
        init_from_keep=args.init_from_keep,
        on_stopped=say_stopped,
        **defaults,
    )
    if run.stopped is not None:
        raise SystemExit(exit_code(run.stopped))
    if run.main:
        print(run.json())
        say_wrote(command, run.out)


def _stopped_line(args: argparse.Namespace, command: str, summary: dict[str, Any]) -> str:
    """``aiayn train: stopped by SIGTERM at update N, checkpoint PATH; resume: COMMAND``."""
    saved = summary["checkpoint"] or "nothing saved (no update yet)"
    return (
        f"aiayn {command}: stopped by {summary['stopped']} at update {summary['updates']}, "
        f"checkpoint {saved}; resume: {resume_command(args, command)}"
    )


def resume_command(args: argparse.Namespace, command: str) -> str:
    """The command line that carries on a training run: its own options without ``--resume``,
    so that it takes OUT's latest checkpoint; under torchrun, launched as it was (on several
    nodes, the rendezvous endpoint is left for the user to fill in: HOST:PORT)."""
    argv = ["aiayn", *command.split(), *([args.config] if args.config else [])]
    for item in args.set or []:
        argv += ["--set", item]
    for option in ("init_from", "init_from_keep"):
        if getattr(args, option) is not None:
            argv += ["--" + option.replace("_", "-"), getattr(args, option)]
    argv += ["--device", args.device]
    world, local = int(os.environ.get("WORLD_SIZE", "1")), os.environ.get("LOCAL_WORLD_SIZE")
    if world == 1:
        return shlex.join(argv)
    launch = ["torchrun", "--nproc_per_node", local or str(world)]
    if local is not None and int(local) != world:  # several nodes: on each, with its rendezvous
        nodes = str(world // int(local))
        launch += ["--nnodes", nodes, "--rdzv_backend", "c10d", "--rdzv_endpoint", "HOST:PORT"]
    return shlex.join([*launch, "-m", *argv])


ENGINES = ("torch", "ctranslate2", "onnxruntime")

# The attribute argparse sets for each feature an option asks of an engine
# (``decode.capabilities``), and the value that leaves it off.
_ASKED_BY: dict[Feature, tuple[str, object]] = {
    "lexical_constraints": ("constraints", None),
    "prefixes": ("prefix", None),
    "sampling": ("sample", False),
    "seed": ("seed", None),
    "shortlist": ("shortlist", None),
    "search_rules": ("search_rules", "paper"),
    "no_repeat_ngram": ("no_repeat_ngram_size", 0),
    "repetition_penalty": ("repetition_penalty", 1.0),
    "token_scores": ("token_scores", False),
    "alignments": ("alignments", False),
}


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


def check_engine_options(args: argparse.Namespace) -> None:
    """Refuse in one line, by name, every option the chosen engine cannot honour, before the
    checkpoint loads or exports: ``decode.capabilities.check_supported``, the refusal of
    ``aiayn.Translator`` and the server."""
    engine = getattr(args, "engine", "torch")
    if engine == "torch":  # ours does every one: no need to import the engines
        return
    from ..decode.capabilities import check_supported
    from ..translator import engine_supports

    check_supported(asked_features(args), engine, engine_supports(engine), instead="--engine torch")


def asked_features(args: argparse.Namespace) -> dict[Feature, str]:
    """What the parsed options ask of an engine beyond the paper's search, by option name."""
    from ..decode.capabilities import CAPABILITIES
    from ..translator import loading_features

    checkpoints = args.checkpoint if isinstance(args.checkpoint, list) else [args.checkpoint]
    asked = loading_features(
        len(checkpoints), getattr(args, "quantize", None), getattr(args, "precision", "auto")
    )
    for feature, (attr, off) in _ASKED_BY.items():
        value = getattr(args, attr, None)
        if value is not None and value != off:
            option = CAPABILITIES[feature].option
            asked[feature] = f"{option} {value}" if feature == "search_rules" else str(option)
    return asked
