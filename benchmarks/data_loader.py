"""Data pipeline timings on the bundled Bible corpus (2 CPU cores: prepare ~7 s, ~3 ms a batch).

    python benchmarks/data_loader.py [--vocab-size 8000] [--tokens 4096] [--batches 500]

Times ``prepare_corpus`` (vocabulary training + binarisation of all splits) and then the
loader per batch (sampler + collate) at the given source and target token budgets.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from itertools import islice

from aiayn.data import (
    TokenBudgetSampler,
    TokenDataset,
    bundled_corpus_paths,
    collate,
    prepare_corpus,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument(
        "--tokens", type=int, default=4096, help="budget per side, padding included"
    )
    parser.add_argument("--batches", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        summary = prepare_corpus(bundled_corpus_paths(), out, vocab_size=args.vocab_size)
        secs = summary["seconds"]
        train = summary["splits"]["train"]
        print(
            f"prepare: {secs['total']:.2f} s (vocab {secs['vocab']:.2f} s), "
            f"{train['pairs']} train pairs, {train['src_tokens'] + train['tgt_tokens']} subwords"
        )
        ds = TokenDataset(out, "train")
        sampler = TokenBudgetSampler(ds.src_lens, ds.tgt_lens, args.tokens, args.tokens, seed=1)
        first = time.perf_counter()
        batches = iter(sampler)
        next(batches)  # the epoch's batches are cut on first use
        setup = time.perf_counter() - first
        start = time.perf_counter()
        for indices in islice(batches, args.batches):
            collate(ds, indices)
        per_batch = (time.perf_counter() - start) / args.batches
        st = sampler.stats()
        print(f"sampler epoch set-up: {setup * 1e3:.1f} ms for {st['batches']} batches")
        print(
            f"loader: {per_batch * 1e3:.2f} ms per batch (sampler + collate), "
            f"{st['mean_pairs']:.0f} pairs, {st['mean_src_tokens_padded']:.0f} src + "
            f"{st['mean_tgt_tokens_padded']:.0f} tgt padded tokens, "
            f"padding {100 * st['padding_fraction']:.1f}%"
        )


if __name__ == "__main__":
    main()
