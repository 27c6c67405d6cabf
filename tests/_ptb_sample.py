"""Where the tests find treebanks: the tiny one committed under ``tests/fixtures/treebank``
(always there) and NLTK's WSJ sample (extra tests, skipped without it), each read once.

The WSJ sample is licensed, so it is never copied into the repository: set ``AIAYN_PTB_DIR``,
or keep it at ``../shared/data/ptb-wsj-sample`` next to the repository root.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from aiayn.parsing import Tree, WsjSplit, read_treebank, split_wsj_sample

REPO_ROOT = Path(__file__).resolve().parent.parent
PTB_DIR = Path(os.environ.get("AIAYN_PTB_DIR", REPO_ROOT.parent / "shared/data/ptb-wsj-sample"))
FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures" / "treebank"


def require_ptb_dir() -> Path:
    if not (PTB_DIR / "wsj_0001.mrg").is_file():
        pytest.skip(f"WSJ sample not found at {PTB_DIR} (set AIAYN_PTB_DIR)")
    return PTB_DIR


@functools.lru_cache(maxsize=2)
def _load(directory: Path) -> dict[str, list[Tree]]:
    split = split_wsj_sample(directory)
    return {name: read_treebank(files) for name, files in split._asdict().items()}


def sample_trees() -> dict[str, list[Tree]]:
    """Preprocessed trees of the WSJ sample by split name ("train", "dev", "test")."""
    return _load(require_ptb_dir())


def fixture_split() -> WsjSplit:
    """The ``.mrg`` files of the tiny test treebank, split as the WSJ sample is."""
    return split_wsj_sample(FIXTURE_DIR)


def fixture_trees() -> dict[str, list[Tree]]:
    """Preprocessed trees of the tiny test treebank by split name."""
    return _load(FIXTURE_DIR)
