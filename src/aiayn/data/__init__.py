"""Data pipeline: raw parallel text -> shared BPE vocabulary -> memory-mapped token arrays ->
token-budget batches -> padded tensors. Never imports the model.

Typical use::

    from aiayn.data import bundled_corpus_paths, prepare_corpus, TokenDataset, ...
    prepare_corpus(bundled_corpus_paths(), "work/bible", vocab_size=8000)
    train = TokenDataset("work/bible", "train")
    sampler = TokenBudgetSampler(train.src_lens, train.tgt_lens, 4096, 4096, seed=1)
    for indices in sampler:
        batch = collate(train, indices).to(device)
"""

from .batching import TokenBudgetSampler
from .binarize import TokenDataset, check_vocab, read_meta
from .collate import Batch, collate
from .prepare import bundled_corpus_paths, prepare_bundled, prepare_corpus
from .readers import ReadStats, iter_parallel, iter_tsv, read_parallel, read_tsv
from .vocab import Vocab

__all__ = [
    "Batch",
    "ReadStats",
    "TokenBudgetSampler",
    "TokenDataset",
    "Vocab",
    "bundled_corpus_paths",
    "check_vocab",
    "collate",
    "iter_parallel",
    "iter_tsv",
    "prepare_bundled",
    "prepare_corpus",
    "read_meta",
    "read_parallel",
    "read_tsv",
]
