"""The longest functions and modules of the package, for review: `make lint` prints them.

A size limit that fails the build becomes a target (code squeezed under it by merging comments
reads worse than code a little over it). This list starts a conversation instead: whatever
passes the review sizes is named as a warning, longest first, and the build goes on.

    python scripts/dev/longest.py              # src/aiayn, the 10 longest of each
    python scripts/dev/longest.py --top 20 --function-lines 50 path/to/package
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sized:
    """A function or module and its length in lines."""

    where: str
    lines: int


def functions(package: Path) -> list[Sized]:
    """Every function and method under ``package``, longest first."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                where = f"{path.relative_to(package.parent)}:{node.lineno} {node.name}"
                found.append(Sized(where, node.end_lineno - node.lineno + 1))
    return sorted(found, key=lambda s: (-s.lines, s.where))


def modules(package: Path) -> list[Sized]:
    """Every module under ``package``, longest first."""
    found = [
        Sized(str(p.relative_to(package.parent)), len(p.read_text(encoding="utf-8").splitlines()))
        for p in sorted(package.rglob("*.py"))
    ]
    return sorted(found, key=lambda s: (-s.lines, s.where))


def report(sized: list[Sized], *, kind: str, review: int, top: int) -> list[str]:
    """The ``top`` longest as lines, each over ``review`` marked as a warning to look at."""
    lines = [f"the {top} longest {kind} (review past {review} lines):"]
    for s in sized[:top]:
        mark = "warning: " if s.lines > review else ""
        lines.append(f"  {mark}{s.lines:5d}  {s.where}")
    over = sum(s.lines > review for s in sized)
    lines.append(f"  {over} {kind} past {review} lines")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", type=Path, default=ROOT / "src" / "aiayn")
    parser.add_argument("--top", type=int, default=10, help="how many of each to list")
    parser.add_argument("--function-lines", type=int, default=60, help="a function's review size")
    parser.add_argument("--module-lines", type=int, default=500, help="a module's review size")
    args = parser.parse_args(argv)
    if not args.package.is_dir():
        parser.error(f"{args.package}: not a directory")
    out = report(
        functions(args.package), kind="functions", review=args.function_lines, top=args.top
    )
    out += report(modules(args.package), kind="modules", review=args.module_lines, top=args.top)
    print("\n".join(out))


if __name__ == "__main__":
    main()
