"""The package's shape (docs/layout.md): the library never imports the applications built on
it, and the layout page names every module there is."""

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "aiayn"
LAYOUT = Path(__file__).resolve().parents[1] / "docs" / "layout.md"

# a repository lint: `make lint` runs it (pytest -m lint), the main run of `make test` does not
pytestmark = pytest.mark.lint

# The layers, bottom up (as docs/layout.md draws them): a module may import its own layer and
# those below it, never one above.
LAYERS = [
    {
        "errors",
        "files",
        "digest",
        "hardware",
        "measured",
        "config",
        "model",
        "flops",
        "checkpoint",
        "data",
        "metrics",
    },
    {"train", "decode", "evaluate"},
    {"analysis", "demo", "serve", "export", "parsing", "experiments"},
    {"cli", "__main__"},
]


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "corpus/bible" not in str(p))


def _part(path: Path) -> str:
    """The top-level part of aiayn a file belongs to: 'data' for aiayn/data/vocab.py."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported_parts(path: Path) -> set[str]:
    """The top-level parts of aiayn that ``path`` imports (absolute or relative, lazy too)."""
    package = path.relative_to(SRC).with_suffix("").parts[:-1]
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = [*base, *(node.module.split(".") if node.module else [])]
                names = [a.name for a in node.names]
            else:
                target, names = (node.module or "").split("."), [a.name for a in node.names]
            if target[0] != "aiayn":
                continue
            if len(target) > 1:
                parts.add(target[1])
            else:  # from aiayn import x / from . import x (inside aiayn/)
                parts.update(names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                bits = alias.name.split(".")
                if bits[0] == "aiayn" and len(bits) > 1:
                    parts.add(bits[1])
    return parts


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_flow_from_the_command_line_to_the_library(path):
    part = _part(path)
    if part == "__init__":  # aiayn/__init__.py: lazy names of the foundations
        return
    layer = next((i for i, members in enumerate(LAYERS) if part in members), None)
    assert layer is not None, f"{part}: in no layer of this test (and of docs/layout.md)"
    above = set().union(*LAYERS[layer + 1 :])
    assert not (_imported_parts(path) & above), (part, _imported_parts(path) & above)


def test_the_layout_page_names_every_module():
    page = LAYOUT.read_text(encoding="utf-8")
    tree = page[page.index("```") : page.rindex("```")]
    named = set(re.findall(r"[\w.]+\.py|[\w-]+/", tree))
    for path in _modules():
        assert path.name in named, f"docs/layout.md does not name {path.relative_to(PACKAGE)}"
    for folder in {p.parent for p in _modules()} - {PACKAGE}:
        assert f"{folder.name}/" in named, f"docs/layout.md does not name {folder.name}/"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_over_60_lines(path):
    """A function that does not fit a screen does several jobs: each gets a name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, long


@pytest.mark.parametrize("path", sorted((PACKAGE / "train").glob("*.py")), ids=lambda p: p.name)
def test_the_training_library_does_not_import_evaluate(path):
    """evaluate is built on train and decode (eval_mode lives in decode): not the other way."""
    assert "evaluate" not in _imported_parts(path)
