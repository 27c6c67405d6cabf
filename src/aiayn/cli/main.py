"""The ``aiayn`` command line. Each sub-command parses its arguments and calls the library.

    aiayn demo                      # the bundled English->Spanish translator, end to end
    aiayn info --presets            # parameter counts next to Table 3
    aiayn prepare --bundled --out work/bible
    aiayn train --set data=work/bible --set out=runs/demo --set preset=demo --set max_minutes=15
    torchrun --nproc_per_node 8 -m aiayn train wmt14-base   # a bundled recipe (aiayn/configs/) or a file
    aiayn average runs/demo/checkpoints --last 5 --out runs/demo/averaged
    aiayn evaluate --checkpoint runs/demo/averaged --src src/aiayn/corpus/bible/test.en.gz --ref src/aiayn/corpus/bible/test.es.gz --lang es
    echo "In the beginning ..." | aiayn translate --checkpoint runs/demo/averaged
    aiayn serve --checkpoint runs/demo/averaged --port 8000   # then open http://127.0.0.1:8000/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def say_wrote(command: str, *paths: str | Path) -> None:
    """Where a command wrote, as absolute paths: relative ones resolve against the working directory."""
    print(f"aiayn {command}: wrote {', '.join(str(Path(p).resolve()) for p in paths)}", file=sys.stderr)


def _info(args: argparse.Namespace) -> None:
    from ..info import preset_table

    print(preset_table())


def _prepare(args: argparse.Namespace) -> None:
    from ..data import bundled_corpus_paths, prepare_corpus

    if args.bundled:
        splits = bundled_corpus_paths()
    elif args.wmt14:
        from ..data.corpus import check_target
        from ..data.wmt import download_wmt14

        check_target(Path(args.out))  # before hours of downloading
        src, tgt = args.wmt14.split("-")[1], args.wmt14.split("-")[0]  # "de-en" -> en->de
        splits = download_wmt14(args.wmt14, src, tgt, Path(args.out) / "raw")
    else:
        if not (args.train_src and args.train_tgt):
            raise SystemExit("aiayn prepare: give --bundled, or --train-src and --train-tgt")
        splits = {"train": (Path(args.train_src), Path(args.train_tgt))}
        for name in ("valid", "test"):
            src, tgt = getattr(args, f"{name}_src"), getattr(args, f"{name}_tgt")
            if src and tgt:
                splits[name] = (Path(src), Path(tgt))
    summary = prepare_corpus(splits, args.out, vocab_size=args.vocab_size, max_len=args.max_len)
    print(json.dumps(summary, indent=2))
    say_wrote("prepare", args.out)


def _train(args: argparse.Namespace) -> None:
    from ..train import load_train_config
    from ..train.trainer import Trainer

    cfg = load_train_config(args.config, args.set or [])
    trainer = Trainer(cfg, device=args.device)
    summary = trainer.run(resume=args.resume)
    if trainer.dist.is_main:
        print(json.dumps(summary, indent=2))
        say_wrote("train", cfg.out)
    from ..train import distributed

    distributed.teardown()


def _average(args: argparse.Namespace) -> None:
    import warnings

    from ..checkpoint import average_checkpoints, choose_last

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = choose_last(Path(args.checkpoints), args.last)
    for warning in caught:
        print(f"aiayn average: warning: {warning.message}", file=sys.stderr)
    if args.choose_on:
        from ..evaluate import average_last_best
        from ..io import read_lines

        sources, references = (read_lines(p) for p in args.choose_on)
        out, k_best, ppl_by_k = average_last_best(chosen, Path(args.out), sources, references, force=args.force)
        print("validation perplexity by number averaged: "
              + ", ".join(f"{k}: {ppl:.3f}" for k, ppl in ppl_by_k.items()))
        chosen = chosen[-k_best:]
    else:
        out = average_checkpoints(chosen, Path(args.out), force=args.force)
    print(f"averaged {len(chosen)} checkpoints ({chosen[0].name} .. {chosen[-1].name}) -> {out.resolve()}")


def _diagnose(args: argparse.Namespace) -> None:
    import json

    from ..checkpoint import VOCAB, load_transformer
    from ..data import Vocab
    from ..diagnose import encoder_spread, source_sensitivity
    from ..io import read_lines

    sources, references = read_lines(args.src)[: args.limit], read_lines(args.ref)[: args.limit]
    if len(sources) != len(references):
        raise ValueError(f"{args.src} has {len(sources)} lines, {args.ref} {len(references)}")
    model, _ = load_transformer(args.checkpoint, "cpu")
    vocab = Vocab.load(Path(args.checkpoint) / VOCAB)
    report = {**source_sensitivity(model, vocab, sources, references),
              "encoder_spread": encoder_spread(model, vocab, sources)}
    print(json.dumps(report, indent=2))


def _decode_config(args: argparse.Namespace):
    from ..decode import DecodeConfig

    overrides = {k: v for k, v in (("beam", args.beam), ("alpha", args.alpha)) if v is not None}
    return DecodeConfig.preset(args.decode_preset, **overrides)


def _evaluate(args: argparse.Namespace) -> None:
    from ..evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(args.checkpoint, args.src, args.ref, args.output,
                                 _decode_config(args), lang=args.lang, device=args.device)
    print(json.dumps(result.as_dict(), indent=2))
    if args.output:
        say_wrote("evaluate", args.output)


def _translate(args: argparse.Namespace) -> None:
    from ..io import open_binary
    from .translate import translate_stream

    source = open_binary(args.input) if args.input else sys.stdin.buffer  # bytes: aiayn.io splits lines
    interactive = args.interactive or (args.input is None and sys.stdin.isatty())
    translate_stream(args.checkpoint, source, sys.stdout, _decode_config(args), device=args.device,
                     chunk=1 if interactive else args.chunk, prompt=interactive, name=args.input or "<stdin>")


def _demo(args: argparse.Namespace) -> None:
    from ..demo import format_report, run_demo

    report = run_demo(minutes=args.minutes, work=Path(args.work), out=Path(args.out), sets=args.set or [],
                      test_limit=args.test_limit, fresh=args.fresh)
    print(format_report(report))
    say_wrote("demo", args.work, args.out)


def _experiment(args: argparse.Namespace) -> None:
    from ..experiments import TRAINING, run_experiment
    from ..experiments.runner import read_budget

    budget = read_budget(args.budget or [])
    out = Path(args.out or f"runs/exp/{args.name}")
    inputs: dict = {}
    if args.name in TRAINING:
        from ..experiments.training import load_corpus

        inputs["corpus"] = load_corpus(Path(args.data), args.valid)
    elif args.name == "heads":
        from ..experiments.training import valid_paths

        if not args.checkpoint:
            raise ValueError("experiment heads needs --checkpoint (e.g. runs/demo/averaged)")
        inputs = {"checkpoint": Path(args.checkpoint), "valid": valid_paths(args.valid)}
    command = " ".join(["aiayn experiment", args.name, *(f"--budget {b}" for b in args.budget or []),
                        *([f"--checkpoint {args.checkpoint}"] if args.checkpoint else []), f"--out {out}"])
    results = run_experiment(args.name, out, budget, command=command, **inputs)
    print(f"{len(results['rows'])} rows -> {out / 'results.md'}, {out / 'results.json'}, "
          + ", ".join(results["plots"]))


def _serve(args: argparse.Namespace) -> None:
    try:
        from ..serve import Limits, run_server
    except ModuleNotFoundError as err:
        raise SystemExit(f"aiayn serve: needs {err.name}: pip install 'aiayn[serve]'") from None

    limits = Limits(max_chars=args.max_chars, max_sentences=args.max_sentences,
                    max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms)
    run_server(args.checkpoint, host=args.host, port=args.port, device=args.device, limits=limits)


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint or averaged directory")
    p.add_argument("--decode-preset", default="translation", choices=["translation", "parsing"])
    p.add_argument("--beam", type=int, help="beam size (translation preset: 4)")
    p.add_argument("--alpha", type=float, help="GNMT length penalty alpha (translation preset: 0.6)")
    p.add_argument("--device", default="cpu")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiayn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="presets and their parameter counts")
    p.add_argument("--presets", action="store_true", help="the Table 3 parameter-count table")
    p.set_defaults(func=_info)

    p = sub.add_parser("prepare", help="train the shared BPE vocabulary and binarise a corpus")
    p.add_argument("--out", required=True, help="dataset directory to write")
    p.add_argument("--bundled", action="store_true", help="the bundled English->Spanish Bible")
    p.add_argument("--wmt14", choices=["de-en", "fr-en"],
                   help="download WMT14 (English->German/French) with Hugging Face datasets (pip install -e '.[wmt]')")
    for split in ("train", "valid", "test"):
        p.add_argument(f"--{split}-src")
        p.add_argument(f"--{split}-tgt")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-len", type=int, default=256, help="skip pairs longer than this (subwords)")
    p.set_defaults(func=_prepare)

    p = sub.add_parser("train", help="train with the paper's recipe (torchrun for several processes)")
    p.add_argument("config", nargs="?", help="YAML/TOML/JSON file of TrainConfig keys, or a bundled recipe: wmt14-base")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. model.d_ff=1024")
    p.add_argument("--resume", default="auto",
                   help="checkpoint directory to resume from (default: latest in OUT, if any)")
    p.add_argument("--device", default="auto", help="cpu, cuda (default: cuda if available)")
    p.set_defaults(func=_train)

    p = sub.add_parser("average", help="average the last N checkpoints (paper: 5 base, 20 big)")
    p.add_argument("checkpoints", help="a run's checkpoints/ directory")
    p.add_argument("--last", type=int, default=5)
    p.add_argument("--choose-on", nargs=2, metavar=("SRC", "REF"),
                   help="average the last k <= LAST instead, k with the lowest perplexity of REF given SRC")
    p.add_argument("--out", required=True, help="a new directory, or a previous averaged checkpoint to replace")
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it is not a previous averaged checkpoint")
    p.set_defaults(func=_average)

    p = sub.add_parser("evaluate", help="translate a test set; SacreBLEU, paper BLEU, perplexity")
    _add_decode_args(p)
    p.add_argument("--src", required=True, help="source text (.gz allowed)")
    p.add_argument("--ref", required=True, help="reference text (.gz allowed)")
    p.add_argument("--output", help="file to write the hypotheses to")
    p.add_argument("--lang", default="de", help="target language for the Moses tokeniser")
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("translate", help="translate raw text, one line in -> one line out")
    _add_decode_args(p)
    p.add_argument("--input", help="a text file (default: stdin)")
    p.add_argument("--interactive", action="store_true", help="prompt and answer line by line")
    p.add_argument("--chunk", type=int, default=64, help="lines decoded together when reading a file")
    p.set_defaults(func=_translate)

    p = sub.add_parser("serve", help="an HTTP API with dynamic batching and a page showing the attention")
    p.add_argument("--checkpoint", required=True, help="checkpoint or averaged directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-batch-tokens", type=int, default=4000,
                   help="source tokens of the requests decoded together (0: each request alone)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a request waits for others to join it")
    p.add_argument("--max-chars", type=int, default=10_000, help="characters of text per request")
    p.add_argument("--max-sentences", type=int, default=64, help="sentences per request")
    p.set_defaults(func=_serve)

    p = sub.add_parser("diagnose", help="does a checkpoint read its source? perplexity with rotated sources, "
                                        "encoder collapse per layer")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True, help="source text, e.g. the validation split")
    p.add_argument("--ref", required=True, help="reference text")
    p.add_argument("--limit", type=int, help="the first N sentences only")
    p.set_defaults(func=_diagnose)

    p = sub.add_parser("demo", help="train + evaluate an English->Spanish translator on the bundled corpus")
    p.add_argument("--minutes", type=float, default=15.0, help="training budget (wall clock)")
    p.add_argument("--work", default="work/bible", help="where the prepared corpus goes")
    p.add_argument("--out", default="runs/demo", help="run directory")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="TrainConfig override")
    p.add_argument("--test-limit", type=int, help="evaluate on the first N test sentences only")
    p.add_argument("--fresh", action="store_true", help="delete the run directory first")
    p.set_defaults(func=_demo)

    p = sub.add_parser("experiment", help="the paper's experiments and its open questions, resumable, "
                                          "with tables and plots (docs/experiments.md)")
    from ..experiments import MODULES  # torch-free: the names only

    p.add_argument("name", choices=list(MODULES))
    p.add_argument("--budget", action="append", metavar="KEY=VALUE",
                   help="preset, updates, sentences, max_tokens, seconds, threads (experiments.runner.Budget)")
    p.add_argument("--out", help="results directory (default runs/exp/NAME); a rerun skips finished rows")
    p.add_argument("--data", default="work/bible", help="prepared dataset (the bundled corpus is prepared "
                                                        "there when missing)")
    p.add_argument("--valid", nargs=2, metavar=("SRC", "REF"),
                   help="raw validation text for BLEU (default: the bundled corpus's)")
    p.add_argument("--checkpoint", help="heads: the model to inspect")
    p.set_defaults(func=_experiment)

    from .parse import add_parse_commands  # light: heavy imports happen inside handlers

    add_parse_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as err:  # bad input, missing file, full disk: one clear line, no traceback
        print(f"aiayn {args.command}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
