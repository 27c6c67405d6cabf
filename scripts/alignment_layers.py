"""Which decoder layer's attention aligns best: AER of each layer on the hand-aligned verse pairs
of tests/fixtures/alignments (each reference forced through the decoder), for one checkpoint.

    python scripts/alignment_layers.py runs/demo/averaged

The figures measured with it are in docs/decoding.md (``--alignments``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.checkpoint import load_translator
from aiayn.decode.align import alignment_error_rate, cross_attention, pharaoh
from aiayn.files import read_lines

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "alignments"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    args = parser.parse_args()
    en, es, gold_lines = (read_lines(FIXTURE / n) for n in ("en.txt", "es.txt", "gold.txt"))
    gold = [[tuple(map(int, p.split("-"))) for p in line.split()] for line in gold_lines]
    model, vocab = load_translator(args.checkpoint)
    for layer in range(model.cfg.N_dec):
        predicted = []
        for source, reference in zip(en, es, strict=True):
            src = vocab.encode_source(source, model.cfg.max_len)
            tgt = vocab.encode_target(reference, model.cfg.max_len)
            attn = cross_attention(model, src, tgt, layer)
            pieces = [vocab.id_to_piece(i) for i in src[:-1]], [vocab.id_to_piece(i) for i in tgt]
            predicted.append(pharaoh(attn, *pieces))
        print(
            f"layer {layer}: AER {alignment_error_rate(predicted, gold):.3f} on {len(gold)} pairs"
        )


if __name__ == "__main__":
    main()
