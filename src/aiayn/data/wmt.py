"""WMT14 English-German and English-French (paper section 5.1) as plain parallel files.

Two routes, both writing ``{split}.{src}`` / ``{split}.{tgt}`` for ``prepare_corpus``:

* ``download_wmt14("de-en", "en", "de", out_dir)`` through Hugging Face ``datasets``
  (``pip install aiayn[wmt]``; imported only here): train, validation = newstest2013,
  test = newstest2014, the paper's dev and test sets.
* ``read_sgm`` for the official SGML test sets (``newstest2014-deen-src.en.sgm`` ...), with
  the same segment extraction as sacrebleu so that references match its BLEU.

Nothing here is imported by the rest of the package, so tests need neither network nor
``datasets``; they drive ``write_hf_split`` with a fake iterable of rows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import write_parallel
from .readers import iter_lines

WMT14_PAIRS = ("de-en", "fr-en")
HF_SPLITS = {"train": "train", "validation": "valid", "test": "test"}
_SEG = re.compile(r"<seg[^>]*>(.*)</seg>")


def read_sgm(path: str | os.PathLike) -> list[str]:
    """The segments of a WMT ``.sgm`` file in document order (text between ``<seg>`` tags)."""
    segments = []
    for line in iter_lines(path):
        m = _SEG.search(line)
        if m:
            segments.append(m[1].strip())
    if not segments:
        raise UserError(f"{path}: no <seg> elements found; is this a WMT .sgm file?")
    return segments


def sgm_pairs(src_sgm: str | os.PathLike, ref_sgm: str | os.PathLike) -> Iterator[tuple[str, str]]:
    src, ref = read_sgm(src_sgm), read_sgm(ref_sgm)
    if len(src) != len(ref):
        raise UserError(
            f"segment counts differ: {src_sgm} has {len(src)}, {ref_sgm} has {len(ref)}"
        )
    return zip(src, ref)


def hf_pairs(rows: Iterable[dict[str, Any]], src: str, tgt: str) -> Iterator[tuple[str, str]]:
    """(source, target) from rows shaped like HF ``wmt14``: ``{"translation": {lang: text}}``."""
    for row in rows:
        pair = row["translation"]
        yield pair[src], pair[tgt]


def write_hf_split(
    rows: Iterable[dict[str, Any]], src: str, tgt: str, out_dir: Path, split: str
) -> tuple[Path, Path, int]:
    out_dir.mkdir(parents=True, exist_ok=True)
    src_path, tgt_path = out_dir / f"{split}.{src}", out_dir / f"{split}.{tgt}"
    return src_path, tgt_path, write_parallel(hf_pairs(rows, src, tgt), src_path, tgt_path)


def download_wmt14(
    pair: str, src: str, tgt: str, out_dir: str | os.PathLike, dataset: str = "wmt/wmt14"
) -> dict[str, tuple[Path, Path]]:
    """Download WMT14 ``pair`` ("de-en" or "fr-en") and write plain files for each split.

    Needs network and ``datasets``; the EN-FR training set is 36M pairs (several GB).
    """
    if pair not in WMT14_PAIRS:
        raise UserError(f"unknown WMT14 pair {pair!r}; choose one of {WMT14_PAIRS}")
    if {src, tgt} != set(pair.split("-")):
        raise UserError(f"languages {src}->{tgt} do not match pair {pair}")
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise ImportError(
            "WMT download needs Hugging Face datasets: pip install 'aiayn[wmt]'"
        ) from e
    data = load_dataset(dataset, pair)
    paths = {}
    for hf_split, split in HF_SPLITS.items():
        src_path, tgt_path, _ = write_hf_split(data[hf_split], src, tgt, Path(out_dir), split)
        paths[split] = (src_path, tgt_path)
    return paths
