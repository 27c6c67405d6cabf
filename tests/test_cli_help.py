"""`aiayn --help` shows example command lines: each must parse, and each file it reads must be
in the repository or written by an example above it (in the order a user would run them)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from aiayn.cli.main import build_parser
from aiayn.train import load_train_config

REPO_ROOT = Path(__file__).resolve().parent.parent

# a repository lint: `make lint` runs it (pytest -m lint), the main run of `make test` does not
pytestmark = pytest.mark.lint


def _examples() -> list[list[str]]:
    """The arguments after ``aiayn`` of every example line of the help text (its description:
    the sub-commands' own help follows it)."""
    parser = build_parser()
    assert parser.description in parser.format_help()
    examples = []
    for line in parser.description.splitlines():
        for command in line.split("|"):  # echo ... | aiayn translate ...
            words = shlex.split(command, comments=True)
            if "aiayn" in words:  # `aiayn ...` and `torchrun ... -m aiayn ...`
                examples.append(words[words.index("aiayn") + 1 :])
    return examples


def _reads_and_writes(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(paths the command reads, paths it creates) of parsed example arguments."""
    if args.command == "train":
        cfg = load_train_config(args.config, args.set or [])  # the file and every key are checked
        data = [s.partition("=")[2] for s in args.set or [] if s.startswith("data=")]
        return data, [cfg.out, f"{cfg.out}/checkpoints"]
    if args.command == "demo":
        return [], [args.work, args.out, f"{args.out}/averaged"]
    if args.command == "average":
        return [args.checkpoints], [args.out]
    reads = [getattr(args, name, None) for name in ("checkpoint", "src", "ref", "input")]
    paths = [q for p in reads if p for q in (p if isinstance(p, list) else [p])]  # --checkpoint A B
    return paths, [args.out] if getattr(args, "out", None) else []


def test_help_has_examples():
    commands = {argv[0] for argv in _examples()}
    assert {"demo", "prepare", "train", "average", "evaluate", "translate"} <= commands


def test_every_help_example_parses_and_reads_what_exists(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the examples are written for a source checkout
    parser = build_parser()
    written: set[str] = set()
    for argv in _examples():
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"`aiayn {shlex.join(argv)}` from `aiayn --help` does not parse")
        reads, writes = _reads_and_writes(args)
        for path in reads:
            assert path in written or Path(path).exists(), (
                f"`aiayn {shlex.join(argv)}` from `aiayn --help` reads {path}, which neither exists "
                "nor is written by an example above it"
            )
        written.update(writes)


def test_the_library_never_imports_the_command_line():
    """Imports flow cli -> library: a library module importing ``aiayn.cli`` would pull the
    parser into every import and make a cycle; only ``python -m aiayn`` (``__main__``) starts it."""
    import ast

    src = REPO_ROOT / "src" / "aiayn"
    offenders = []
    for path in src.rglob("*.py"):
        relative = path.relative_to(src)
        if relative.parts[0] == "cli" or relative == Path("__main__.py"):
            continue
        package = ["aiayn", *relative.parent.parts]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                names = [".".join([*base, *(node.module or "").split(".")]).strip(".")]
                if not node.module:
                    names = [".".join([*base, alias.name]) for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            offenders += [
                f"{relative}: {n}" for n in names if n == "aiayn.cli" or n.startswith("aiayn.cli.")
            ]
    assert not offenders, offenders
