"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017), complete.

The top-level names are imported lazily, so that the torch-free parts can be used without
importing torch: ``aiayn.config``, ``aiayn.metrics``, ``aiayn.parsing`` (all but its
``pipeline``), ``aiayn.data`` (torch loads when ``collate`` first pads a batch) and the command
line's parser (``aiayn --help``). ``tests/test_torch_free.py`` checks each.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ModelConfig", "PRESETS", "Transformer", "count_parameters"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("ModelConfig", "PRESETS"):
        from . import config

        return getattr(config, name)
    if name == "Transformer":
        from . import model

        return model.Transformer
    if name == "count_parameters":
        from . import flops

        return flops.count_parameters
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
