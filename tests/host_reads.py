"""Counting the reads of tensor values on the host: each one a device-to-host sync on a GPU.

``HostReads`` is a ``TorchDispatchMode`` that sees every ATen op a block of code runs, on any
device, and counts those that need a tensor's values on the host: ``item``/``bool``/``int``
(``_local_scalar_dense``), ``nonzero`` and what calls it (boolean-mask indexing,
``masked_select``), copies from a device to the CPU; plus ``Tensor.tolist``/``numpy``/``cpu``,
which read without an op. Each read is put down to the innermost function of ``aiayn`` that
made it ("decode/beam.py:finish"), so a test can pin the reads per step and a new one shows
where it came from. On a CPU it counts the reads that would wait for a GPU there; copies *to*
a device (blocking ones sync too) only a GPU shows: ``torch.cuda.set_sync_debug_mode``.

    with HostReads() as reads:
        trainer.train_update(batches)
    reads.sites  # Counter({"train/trainer.py:train_update": 1, "model.py:forward": 1, ...})

Used by ``tests/test_host_reads.py``, which pins the counts, and ``scripts/gpu_check.py``.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import aiayn

aten = torch.ops.aten
# ops whose output size or value needs the data on the host
READING_OPS = {
    aten._local_scalar_dense.default,  # item(), bool(), int(), float()
    aten.nonzero.default,
    aten.masked_select.default,
    aten.repeat_interleave.Tensor,
    aten._unique2.default,
    aten.unique_consecutive.default,
}
# ops that read a boolean index on the host (its nonzero() is inside the kernel)
INDEXING_OPS = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}
READING_METHODS = ("tolist", "numpy", "cpu")
PACKAGE = Path(aiayn.__file__).resolve().parent


class HostReads(TorchDispatchMode):
    """Counts host reads by the aiayn function that made them; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[str] = Counter()
        self._inside_method = 0  # a patched method's own copy is not counted twice
        self._saved: dict[str, Any] = {}

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def __enter__(self) -> HostReads:
        for name in READING_METHODS:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counted(name, self._saved[name]))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        super().__exit__(*exc)

    def _counted(self, name: str, method: Any) -> Any:
        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.sites[site()] += 1
            self._inside_method += 1
            try:
                return method(tensor, *args, **kwargs)
            finally:
                self._inside_method -= 1

        return read

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if not self._inside_method and reads_on_host(func, args, kwargs):
            self.sites[site()] += 1
        return func(*args, **kwargs)


def reads_on_host(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether the op ``func`` on ``args`` needs tensor values on the host."""
    if func in READING_OPS:
        return True
    if func in INDEXING_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)
    if func in (aten._to_copy.default, aten.copy_.default):
        source = args[1] if func is aten.copy_.default else args[0]
        target = args[0].device if func is aten.copy_.default else kwargs.get("device")
        return source.device.type != "cpu" and target is not None and target.type == "cpu"
    return False


def site() -> str:
    """``"decode/beam.py:finish"``: the innermost function of the aiayn package on the stack
    (``"elsewhere"`` when none is, e.g. a read in the test itself)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = in_package(frame.f_code.co_filename)
        if module is not None:
            return f"{module}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "elsewhere"


@functools.cache
def in_package(filename: str) -> str | None:
    """``"decode/beam.py"`` for a file of the aiayn package, however its path was spelled
    (``scripts/../src/aiayn/...``); None for any other file."""
    path = Path(filename).resolve()
    return path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else None
