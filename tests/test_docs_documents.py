"""docs/documents.md runs: its Python examples execute, its command lines parse."""

import re
import shlex
from pathlib import Path

import pytest

from aiayn.cli.main import build_parser

PAGE = Path(__file__).resolve().parents[1] / "docs" / "documents.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.M | re.S)


@pytest.mark.parametrize("block", _blocks("python"), ids=lambda b: b.splitlines()[0])
def test_the_pages_python_examples_run(block):
    exec(compile(block, str(PAGE), "exec"), {})


def test_the_pages_command_lines_parse():
    lines = [line for block in _blocks("sh") for line in block.splitlines() if line.strip()]
    assert len(lines) == 3
    parser = build_parser()
    for line in lines:
        argv = shlex.split(line.split(" > ")[0])[1:]
        assert parser.parse_args(argv).func.__name__ == "_translate"
