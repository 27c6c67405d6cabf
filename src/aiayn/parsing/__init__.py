"""Constituency parsing as sequence transduction (the paper's Table 4): Penn Treebank trees,
their linearisation for the Transformer, and EVALB scoring. Pure Python, no torch.

``aiayn.parsing.pipeline`` (prepare a treebank, evaluate and run a parser) drives the model and
so needs torch; import it by name: this package does not, so that trees, linearisation and
EVALB load without torch (``tests/test_torch_free.py``)."""

from .evalb import COLLINS, EvalbAborted, EvalbParams, EvalbResult, evalb_score
from .linearize import (
    Leaves,
    delinearize,
    index_token,
    is_bracket,
    linearize,
    source_line,
    source_text,
)
from .trees import (
    Leaf,
    Tree,
    TreeSyntaxError,
    parse_trees,
    preprocess,
    read_mrg,
    read_tree_lines,
    read_treebank,
    to_bracketed,
    write_tree_lines,
)
from .wsj import WsjSplit, split_wsj, split_wsj_sample, write_tree_pairs

__all__ = [
    "WsjSplit",
    "split_wsj",
    "split_wsj_sample",
    "write_tree_pairs",
    "COLLINS",
    "EvalbAborted",
    "EvalbParams",
    "EvalbResult",
    "evalb_score",
    "Leaves",
    "delinearize",
    "index_token",
    "is_bracket",
    "linearize",
    "source_line",
    "source_text",
    "Leaf",
    "Tree",
    "TreeSyntaxError",
    "parse_trees",
    "preprocess",
    "read_tree_lines",
    "read_mrg",
    "read_treebank",
    "to_bracketed",
    "write_tree_lines",
]
