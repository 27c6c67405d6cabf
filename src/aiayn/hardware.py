"""What this machine's chip can do, asked in one place: whether bf16 arithmetic is native.

bf16 pays only where the chip computes in it natively: CUDA GPUs with bf16, and CPUs with
``avx512_bf16`` or AMX. Elsewhere (an AVX2-only CPU) PyTorch emulates it through fp32 and it runs
slower than fp32 itself, so ``amp: auto`` and ``translate --precision auto`` ask here and fall
back to fp32 without a word of configuration; the answer carries a reason that summaries,
reports and ``config.json`` repeat, so a reader knows why a run used what it used.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
# the flags that decide bf16 and int8 speed on x86, in the order a report lists them
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Bf16:
    """Whether bf16 is native on a device, and the phrase that says why."""

    native: bool
    reason: str


def bf16_support(device: torch.device) -> Bf16:
    """Native bf16 on ``device``: CUDA asks the driver, a CPU its instruction set (PyTorch's
    own cpuinfo probe, which works beyond Linux)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported():
            return Bf16(True, f"{name} computes in bf16")
        return Bf16(False, f"{name} has no bf16")
    if device.type == "cpu":
        if torch.cpu._is_amx_tile_supported():
            return Bf16(True, "the CPU has AMX (amx_bf16)")
        if torch.cpu._is_avx512_bf16_supported():
            return Bf16(True, "the CPU has avx512_bf16")
        capability = torch.backends.cpu.get_cpu_capability()
        return Bf16(False, f"the CPU has no native bf16 (no avx512_bf16 or AMX; {capability})")
    return Bf16(False, f"bf16 is not known to be native on {device.type}")


def cpu_description(cpuinfo: Path = CPUINFO) -> str:
    """``"AMD EPYC, flags: avx2"``: the CPU's model and the flags that decide bf16 / int8
    speed, as every speed figure in the docs names them (machines change between days)."""
    model, flags = platform.processor() or platform.machine(), set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break  # every core lists the same flags
    present = [flag for flag in REPORTED_FLAGS if flag in flags]
    return f"{model}, flags: {', '.join(present) or 'none of ' + ', '.join(REPORTED_FLAGS)}"
