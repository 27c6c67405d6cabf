"""The WSJ train/dev/test splits, and parallel text files for the translation pipeline.

Splits are by file, never by sentence, as in every WSJ parsing paper: sections 02-21 train,
22 dev, 23 test for the full treebank (Table 4's "WSJ only" setting). NLTK's 5% sample
(``wsj_0001.mrg`` .. ``wsj_0199.mrg``, from sections 00 and 01) has no such sections, so it
is cut by file number: 0001-0179 train, 0180-0189 dev, 0190-0199 test.

``write_tree_pairs`` turns trees into a source file (the words) and a target file (the
linearised tree), one sentence per line, so that vocabulary building, training and beam search
run on parsing exactly as on translation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from .. import files
from .linearize import Leaves, linearize, source_text
from .trees import Tree

__all__ = ["WsjSplit", "split_wsj_sample", "split_wsj", "write_tree_pairs"]

_SAMPLE_FILE = re.compile(r"wsj_(\d{4})\.mrg")


class WsjSplit(NamedTuple):
    """``.mrg`` files of each part, sorted."""

    train: list[Path]
    dev: list[Path]
    test: list[Path]


def split_wsj_sample(directory: str | Path) -> WsjSplit:
    """Split NLTK's WSJ sample (flat ``wsj_0001.mrg`` .. ``wsj_0199.mrg``) by file number."""
    numbered = sorted(
        (int(m.group(1)), path)
        for path in Path(directory).iterdir()
        if (m := _SAMPLE_FILE.fullmatch(path.name))
    )
    if not numbered:
        raise FileNotFoundError(f"no wsj_NNNN.mrg files in {directory}")
    return WsjSplit(
        train=[p for n, p in numbered if 1 <= n <= 179],
        dev=[p for n, p in numbered if 180 <= n <= 189],
        test=[p for n, p in numbered if 190 <= n <= 199],
    )


def _section(root: Path, section: int) -> list[Path]:
    folder = root / f"{section:02d}"
    files = sorted(folder.glob(f"wsj_{section:02d}[0-9][0-9].mrg"))
    if not files:
        raise FileNotFoundError(f"no wsj_{section:02d}xx.mrg files in {folder}")
    return files


def split_wsj(root: str | Path) -> WsjSplit:
    """The standard split of the full treebank, ``root/NN/wsj_NNxx.mrg``: 02-21 / 22 / 23."""
    root = Path(root)
    return WsjSplit(
        train=[p for s in range(2, 22) for p in _section(root, s)],
        dev=_section(root, 22),
        test=_section(root, 23),
    )


def write_tree_pairs(
    trees: Iterable[Tree], src_path: str | Path, tgt_path: str | Path, leaves: Leaves = "XX"
) -> int:
    """Write each tree's words to ``src_path`` and its linearisation to ``tgt_path``, one
    sentence a line (``aiayn.files.write_parallel``: atomic, aligned); returns the number of
    sentences. Trees should be ``preprocess``-ed."""
    return files.write_parallel(
        ((source_text(tree, leaves), " ".join(linearize(tree, leaves))) for tree in trees),
        src_path,
        tgt_path,
    )
