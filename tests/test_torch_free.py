"""The modules documented as torch-free load without torch (``aiayn/__init__.py`` lists them).

One fresh interpreter (in this process torch is long loaded) imports them one after another
under an import hook that refuses torch and records who asked: a module that imports torch,
even inside ``try``, is reported, and the refusal keeps torch out for the modules after it.
Every ``aiayn`` module is forgotten between two checks, so each starts from its package.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# a repository lint: `make lint` runs it (pytest -m lint), the main run of `make test` does not
pytestmark = pytest.mark.lint

TORCH_FREE = [
    "aiayn",
    "aiayn.config",
    "aiayn.errors",
    "aiayn.workflow",
    "aiayn.files",
    "aiayn.records",
    "aiayn.runtime.cpu",
    "aiayn.metrics",
    "aiayn.metrics.significance",
    "aiayn.analysis.compare",
    "aiayn.parsing",
    "aiayn.parsing.constraint",
    "aiayn.parsing.wsj",
    "aiayn.parsing.evalb",
    "aiayn.parsing.linearize",
    "aiayn.parsing.trees",
    "aiayn.data",
    "aiayn.data.readers",
    "aiayn.data.vocab",
    "aiayn.data.moses_bpe",
    "aiayn.data.collate",
    "aiayn.data.lexical",
    "aiayn.text",
    "aiayn.text.segment",
    "aiayn.text.document",
    "aiayn.text.placeholders",
    "aiayn.text.glossary",
    "aiayn.text.markup",
]
# Modules that do need torch: the hook must report them, or the check proves nothing.
NEEDS_TORCH = ["aiayn.model", "aiayn.parsing.pipeline"]
# `aiayn --help` builds every sub-command's parser; handlers import the library lazily.
HELP = "aiayn --help"

_PROBE = (
    """
import importlib, importlib.abc, json, sys

asked, current = {}, None

class RefuseTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            asked[current] = name
            raise ImportError(f"{current} imports {name}")
        return None

sys.meta_path.insert(0, RefuseTorch())
for current in json.loads(sys.argv[1]):
    try:
        if current == HELP:
            from aiayn.cli.main import build_parser
            build_parser().format_help()
        else:
            importlib.import_module(current)
    except ImportError:
        pass
    for name in [m for m in sys.modules if m.split(".")[0] == "aiayn"]:
        del sys.modules[name]
print(json.dumps(asked))
"""
).replace("HELP", repr(HELP))


@pytest.fixture(scope="module")
def torch_imports() -> dict[str, str]:
    """{module: the torch module it asked for}, for every module that asked."""
    names = [*TORCH_FREE, HELP, *NEEDS_TORCH]  # the torch users last: they load shared modules
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(names)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("module", [*TORCH_FREE, HELP])
def test_imports_without_torch(module: str, torch_imports: dict[str, str]) -> None:
    assert module not in torch_imports, f"{module} imports {torch_imports[module]}"


@pytest.mark.parametrize("module", NEEDS_TORCH)
def test_the_hook_sees_torch(module: str, torch_imports: dict[str, str]) -> None:
    assert torch_imports.get(module) == "torch"
