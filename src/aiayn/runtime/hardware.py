"""What this machine's chip can do, asked in one place: whether bf16 arithmetic is native.

bf16 can pay only where the chip computes in it natively: CUDA GPUs with bf16, and CPUs with
``avx512_bf16`` or AMX. Elsewhere (an AVX2-only CPU) PyTorch emulates it through fp32 and it runs
slower than fp32 itself. Whether it *does* pay on a native chip is a measured figure
(``aiayn.measured``); the answer here names the chip's class that those figures are kept by, and
carries a reason that summaries, reports and ``config.json`` repeat.

``AIAYN_ASSUME_BF16=native|emulated`` overrides the CPU's answer, for tests and CI only: the
suite runs the hardware-dependent tests under both answers on whatever CPU it has, so a failure
that only a Zen 4 or an AMX CPU would show appears on an AVX2 machine too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..errors import UserError

# oneDNN keeps this many compiled primitives (its default is 1,024): see keep_onednn_primitives
ONEDNN_CACHE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_PRIMITIVES = 4096

ASSUME_BF16 = "AIAYN_ASSUME_BF16"  # native | emulated: the CPU's answer, for tests and CI
ASSUMED = ("native", "emulated")


@dataclass(frozen=True)
class Bf16:
    """Whether bf16 is native on a device, the phrase that says why, and the chip's class: the
    key its measured figures are kept under (``aiayn.measured``)."""

    native: bool
    reason: str
    chip: str  # "cpu-amx", "cpu-avx512_bf16", "cpu-no_bf16", "cuda", ...


def resolve_device(name: str) -> str:
    """``--device`` (or ``Translator(device=...)``) as torch takes it ("auto": cuda where there
    is one, else cpu), or a one-line ``UserError``: torch names a device it cannot use in a
    traceback from deep inside loading a checkpoint or starting a run."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"--device {name}: not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cpu" or (device.type == "mps" and torch.backends.mps.is_available()):
        return name
    if device.type != "cuda":
        raise UserError(f"--device {name}: not available here; use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine; use cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UserError(f"--device {name}: this machine has {count} CUDA devices (0-{count - 1})")
    return name


def bf16_support(device: torch.device) -> Bf16:
    """Native bf16 on ``device``: CUDA asks the driver, a CPU its instruction set (PyTorch's
    own cpuinfo probe, which works beyond Linux) unless ``AIAYN_ASSUME_BF16`` says otherwise."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported():
            return Bf16(True, f"{name} computes in bf16", "cuda")
        return Bf16(False, f"{name} has no bf16", "cuda")
    if device.type == "cpu":
        return _assumed_cpu() or _detected_cpu()
    return Bf16(False, f"bf16 is not known to be native on {device.type}", device.type)


def _assumed_cpu() -> Bf16 | None:
    assumed = os.environ.get(ASSUME_BF16, "")
    if not assumed:
        return None
    if assumed not in ASSUMED:
        raise UserError(f"{ASSUME_BF16}={assumed}: give one of {', '.join(ASSUMED)}")
    if assumed == "native":
        return Bf16(True, f"the CPU has avx512_bf16 ({ASSUME_BF16}=native)", "cpu-avx512_bf16")
    return Bf16(False, f"the CPU has no native bf16 ({ASSUME_BF16}=emulated)", "cpu-no_bf16")


def _detected_cpu() -> Bf16:
    if torch.cpu._is_amx_tile_supported():
        return Bf16(True, "the CPU has AMX (amx_bf16)", "cpu-amx")
    if torch.cpu._is_avx512_bf16_supported():
        return Bf16(True, "the CPU has avx512_bf16", "cpu-avx512_bf16")
    capability = torch.backends.cpu.get_cpu_capability()
    reason = f"the CPU has no native bf16 (no avx512_bf16 or AMX; {capability})"
    return Bf16(False, reason, "cpu-no_bf16")


def keep_onednn_primitives(capacity: int = ONEDNN_PRIMITIVES) -> None:
    """Let oneDNN keep ``capacity`` compiled primitives (kernels for one op at one shape) instead
    of its default 1,024, unless the user set ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` themselves.

    bf16 matmuls on the CPU and the packed decode linears are oneDNN's, and it compiles a
    primitive for each new shape. A token-budget batch has a shape of its own (B x T varies from
    batch to batch): at 1,024 the cache evicts the demo's shapes before the next epoch brings them
    back, so bf16 training compiles in every update for the whole run; a larger cache compiles
    less with every epoch, for memory (measured in docs/training.md, "oneDNN's primitive
    cache"). oneDNN reads the capacity when it creates its first primitive, so call this before
    any oneDNN op; later it changes nothing."""
    os.environ.setdefault(ONEDNN_CACHE, str(capacity))
