"""``aiayn parse prepare|train|evaluate|parse``: constituency parsing as translation (Table 4)."""

from __future__ import annotations

import argparse


def add_parse_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse", help="constituency parsing on Penn Treebank files (Table 4)")
    p.add_subparsers(dest="parse_command", required=True)
