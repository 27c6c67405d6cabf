"""The machine: what the chip can do, the figures measured on it, and the faster kernels and
weight forms that compute the paper's functions on it, behind one door each way.

    cpu.py        the CPU's model and flags (no torch): its class, its description
    hardware.py   what the chip can do (native bf16), devices, oneDNN's primitive cache
    figures.py    the figures every ``auto`` decides from, per class of chip (figures.json)
    policy.py     what ``auto`` chooses from the chip and the figures
    kernels.py    the kernels the model declares replaceable (attention, dropout, key padding)
    precision.py  a model cast to bf16 for decoding
    packed.py     fp32/bf16 Linear weights packed once for oneDNN
    quantize.py   int8 weights (``--quantize int8``)
    workers.py    batches decoded side by side in forked CPU processes
    flops.py      the yardstick: training FLOPs, the matmul peak, MFU
    ready.py      the two doors: ``for_training(model, device)``, ``for_decoding(model, ...)``

The model (``aiayn.model``) computes what the paper says with PyTorch's own kernels; nothing
here changes its function, only its speed. The doors are importable from here
(``aiayn.runtime.for_decoding``); they load torch on first use, so that ``cpu`` and
``figures`` stay torch-free.
"""

from __future__ import annotations

from typing import Any

__all__ = ["for_decoding", "for_training"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'aiayn.runtime' has no attribute {name!r}")
    from . import ready

    return getattr(ready, name)
