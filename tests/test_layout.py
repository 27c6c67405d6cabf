"""The package's shape (docs/layout.md): the library never imports the applications built on
it, and the layout page names every module there is."""

import ast
import importlib.util
import re
import sys
import warnings
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
        "records",
        "digest",
        "config",
        "model",
        "runtime",
        "checkpoint",
        "averaging",
        "data",
        "metrics",
    },
    {"train", "decode", "evaluate", "text"},
    {
        "analysis",
        "demo",
        "distill",
        "serve",
        "export",
        "parsing",
        "experiments",
        "translator",
        "workflow",
    },
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


def _longest():
    """scripts/dev/longest.py, the review list `make lint` prints, loaded as a module."""
    path = SRC.parent / "scripts" / "dev" / "longest.py"
    spec = importlib.util.spec_from_file_location("longest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["longest"] = module  # its dataclass looks its module up while being defined
    spec.loader.exec_module(module)
    return module


def test_the_review_list_names_what_passes_the_review_size_longest_first(tmp_path, capsys):
    """Sizes are warnings to look at, not caps: the list must still find the long ones."""
    package = tmp_path / "pkg"
    package.mkdir()
    body = [f"    x{i} = {i}" for i in range(70)]
    (package / "a.py").write_text(
        "\n".join(["def long():", *body, "", "", "def short():", "    return 1", ""])
    )
    (package / "b.py").write_text("\n".join(["def middling():", *body[:30], ""]))
    longest = _longest()
    assert [(s.where, s.lines) for s in longest.functions(package)] == [
        ("pkg/a.py:1 long", 71),
        ("pkg/b.py:1 middling", 31),
        ("pkg/a.py:74 short", 2),
    ]
    longest.main([str(package), "--top", "2", "--function-lines", "60", "--module-lines", "50"])
    out = capsys.readouterr().out.splitlines()
    assert out[1:4] == [
        "  warning:    71  pkg/a.py:1 long",
        "     31  pkg/b.py:1 middling",
        "  1 functions past 60 lines",
    ]
    assert out[5:8] == [
        "  warning:    75  pkg/a.py",
        "     31  pkg/b.py",
        "  1 modules past 50 lines",
    ]


@pytest.mark.parametrize("path", sorted((PACKAGE / "train").glob("*.py")), ids=lambda p: p.name)
def test_the_training_library_does_not_import_evaluate(path):
    """evaluate is built on train and decode (eval_mode lives in decode): not the other way."""
    assert "evaluate" not in _imported_parts(path)


def _module_name(path: Path) -> str:
    """aiayn/decode/beam.py -> "aiayn.decode.beam"; a package's __init__.py -> the package."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """The aiayn modules ``path`` imports when it is imported: its module-level imports (not
    those inside functions, nor under ``if TYPE_CHECKING``), each resolved to a module of
    ``known`` (``from .x import y``: the module x.y if there is one, else x)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def statements(body):
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.If | ast.Try):
                yield from statements(node.body + node.orelse)
                if isinstance(node, ast.Try):
                    yield from statements([s for h in node.handlers for s in h.body])
            else:
                yield node

    for node in statements(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = (
                ".".join(base + ([node.module] if node.module else []))
                if node.level
                else node.module
            )
            targets = [f"{module}.{alias.name}" for alias in node.names] + [module or ""]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                break
    return found


def _import_cycles() -> list[list[str]]:
    """Every cycle among the package's module-level imports (one path each, by DFS)."""
    paths = {_module_name(p): p for p in _modules()}
    graph = {m: sorted(_top_level_imports(p, set(paths))) for m, p in paths.items()}
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in graph[module]:
            if state.get(other) == 1:
                cycles.append(path[path.index(other) :] + [other])
            elif other not in state:
                visit(other, [*path, other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_the_package_has_no_import_circle():
    assert _import_cycles() == []


def test_the_import_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    """The finder itself: two modules that import each other are a circle."""
    package = tmp_path / "aiayn"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("import aiayn.a\n\ndef later():\n    from . import c\n")
    (package / "c.py").write_text("from . import b\n")  # b imports c only inside a function
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    assert _import_cycles() == [["aiayn.a", "aiayn.b", "aiayn.a"]]


MODEL = PACKAGE / "model.py"
# past this many lines model.py may no longer read in one sitting: a reason to talk about its
# shape, reported as a warning, not a cap that code is squeezed under
MODEL_REVIEW_LINES = 500


def test_the_model_reads_in_one_sitting_and_imports_only_torch_and_its_config():
    lines = len(MODEL.read_text(encoding="utf-8").splitlines())
    if lines > MODEL_REVIEW_LINES:
        warnings.warn(f"model.py is {lines} lines (review past {MODEL_REVIEW_LINES})", stacklevel=1)
    imported = set()
    for node in ast.walk(ast.parse(MODEL.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or "").split(".")[0])
    assert imported <= {"__future__", "math", "collections", "dataclasses", "torch", ".config"}


def _private_methods_of_the_model() -> set[str]:
    """The names of model.py's private methods (``_sublayers``, ...), dunders aside."""
    tree = ast.parse(MODEL.read_text(encoding="utf-8"))
    return {
        node.name
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("_")
        and not node.name.startswith("__")
    }


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_outside_the_model_calls_its_private_methods(path):
    """What another package needs from the model is public API with a docstring (the decode
    step runs ``DecoderLayer.sublayers``, ``MultiHeadAttention.concat_heads``)."""
    if path == MODEL:
        return
    private = _private_methods_of_the_model()
    calls = [
        f"{ast.unparse(node.func)} (line {node.lineno})"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in private
        and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
    ]
    assert not calls, calls
