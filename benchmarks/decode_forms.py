"""The weights' forms for decoding on the CPU, end to end: which to ship (docs/decoding.md#forms).

    python benchmarks/decode_forms.py --checkpoint runs/demo/averaged --limit 200 --json out.json

Translates the first ``--limit`` verses of the bundled test split (beam 4, the paper's
translation preset, ``translate`` as ``aiayn translate`` calls it) with the same weights in
each form, ``--slice`` verses at a time: every form translates a slice before the next slice,
who goes first turning with each, so that load from other processes on a shared machine hits
the forms alike:

- ``packed``: fp32, Linear weights packed once for oneDNN (``aiayn.decode.packed``, private
  ops), what ``for_decoding`` gives today;
- ``plain``: fp32 as trained, every Linear through the public ``F.linear``;
- ``int8_torch_ao``: ``for_decoding(model, "int8")``, PyTorch's eager dynamic quantization
  (``torch.ao.quantization.quantize_dynamic``, deprecated in favour of torchao);
- ``int8_torchao``: torchao's eager ``quantize_`` with ``Int8DynamicActivationInt8WeightConfig``
  (int8 weights per output row, activations quantized per call), when torchao is installed.

Prints, per round, each form's seconds and its speed relative to ``packed`` (ratios within a
round are what to compare on a shared machine); then each form's SacreBLEU against the
references and how many outputs equal ``packed``'s. ``--json`` writes all of it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from aiayn.checkpoint import VOCAB, load_transformer  # noqa: E402
from aiayn.data import Vocab, bundled_corpus_paths  # noqa: E402
from aiayn.decode import DecodeConfig, SearchRequest, for_decoding, translate  # noqa: E402
from aiayn.files import read_lines  # noqa: E402
from aiayn.hardware import cpu_description  # noqa: E402


def torchao_int8(model: nn.Module) -> nn.Module:
    """torchao's eager CPU int8: dynamic int8 activations, int8 weights per output row."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(model.eval(), Int8DynamicActivationInt8WeightConfig())
    return model


def forms(checkpoint: str, only: list[str] | None) -> dict[str, nn.Module]:
    """Each form of the checkpoint's weights (those in ``only``, when given), loaded anew (no
    form shares a module)."""
    load = lambda: load_transformer(checkpoint)[0].eval()  # noqa: E731
    made: dict[str, Callable[[], nn.Module]] = {
        "packed": lambda: for_decoding(load()),
        "plain": load,
        "int8_torch_ao": lambda: for_decoding(load(), "int8"),
    }
    try:
        import torchao  # noqa: F401

        made["int8_torchao"] = lambda: torchao_int8(load())
    except ImportError:
        print("torchao is not installed: int8_torchao left out", file=sys.stderr)
    return {name: make() for name, make in made.items() if not only or name in only}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--limit", type=int, default=200, help="the first LIMIT test verses")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--slice", type=int, default=20, help="verses each form translates in turn (default: 20)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="+", help="these forms only (default: all)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    import sacrebleu

    torch.set_num_threads(args.threads)
    vocab = Vocab.load(os.path.join(args.checkpoint, VOCAB))
    src, ref = bundled_corpus_paths()["test"]
    lines, refs = read_lines(src)[: args.limit], read_lines(ref)[: args.limit]
    models = forms(args.checkpoint, args.only)
    request = SearchRequest(DecodeConfig.preset("translation"))
    print(f"CPU: {cpu_description()}; torch {torch.__version__}; {args.threads} thread(s)")
    print(
        f"{len(lines)} verses, beam {request.decode.beam}, forms: {', '.join(models)}", flush=True
    )
    names, rounds = list(models), []
    slices = [range(i, min(i + args.slice, len(lines))) for i in range(0, len(lines), args.slice)]
    for r in range(args.rounds):
        seconds, outputs = dict.fromkeys(names, 0.0), {name: [] for name in names}
        for j, part in enumerate(slices):
            k = (r * len(slices) + j) % len(names)  # who goes first turns with every slice
            for name in names[k:] + names[:k]:
                start = time.perf_counter()
                with torch.inference_mode():
                    out = translate(models[name], [lines[i] for i in part], vocab, request)
                seconds[name] += time.perf_counter() - start
                outputs[name] += out
        base = seconds.get("packed", next(iter(seconds.values())))
        rounds.append({k: {"s": seconds[k], "speed_vs_packed": base / seconds[k]} for k in names})
        shown = ", ".join(f"{k} {seconds[k]:.1f} s ({base / seconds[k]:.2f}x)" for k in names)
        print(f"round {r + 1}: {shown}", flush=True)
    first, same = outputs[names[0]], f"identical_to_{names[0]}"
    quality = {
        k: {
            "sacrebleu": sacrebleu.corpus_bleu(out, [refs]).score,
            same: sum(a == b for a, b in zip(out, first)),
        }
        for k, out in outputs.items()
    }
    for k, q in quality.items():
        print(f"{k}: SacreBLEU {q['sacrebleu']:.2f}, {q[same]} of {len(lines)} as {names[0]}'s")
    if args.json:
        record = {"cpu": cpu_description(), "torch": torch.__version__, "threads": args.threads}
        record |= {"verses": len(lines), "rounds": rounds, "quality": quality}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
