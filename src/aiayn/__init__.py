"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017), complete.

From Python (docs/python.md): ``aiayn.Translator`` translates and scores with a trained
checkpoint exactly as ``aiayn translate`` does; ``aiayn.prepare`` and ``aiayn.train_model`` are
``aiayn prepare`` and ``aiayn train``.

The top-level names are imported lazily, so that the torch-free parts can be used without
importing torch: ``aiayn.config``, ``aiayn.records``, ``aiayn.metrics``, ``aiayn.parsing`` (all but its
``pipeline``), ``aiayn.data`` (torch loads when ``collate`` first pads a batch) and the command
line's parser (``aiayn --help``). ``tests/test_torch_free.py`` checks each.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ModelConfig",
    "PRESETS",
    "Transformer",
    "count_parameters",
    "Translator",
    "Translation",
    "Candidate",
    "Piece",
    "prepare",
    "train_model",
]
__version__ = "0.1.0"

# name -> the module that defines it, imported on first use
_LAZY = {
    "ModelConfig": "config",
    "PRESETS": "config",
    "Transformer": "model",
    "count_parameters": "runtime.flops",
    "Translator": "translator",
    "Translation": "translator",
    "Candidate": "translator",
    "Piece": "translator",
    "prepare": "workflow",
    "train_model": "workflow",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_LAZY[name]}", __name__), name)
