"""The CPU's model and flags, read from ``/proc/cpuinfo`` without torch: the class of chip a
record is kept under (``aiayn.records``) and the description every speed figure names
(``aiayn.analysis.measure``). ``hardware`` asks torch the same question where it has it."""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# the flags that decide bf16 and int8 speed on x86, in the order a report lists them
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_model_and_flags(cpuinfo: Path = CPUINFO) -> tuple[str, set[str]]:
    """The CPU's model name and its flags, from /proc/cpuinfo where there is one."""
    model, flags = platform.processor() or platform.machine(), set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break  # every core lists the same flags
    return model, flags


def cpu_class(flags: set[str]) -> str:
    """The class ``aiayn.runtime.hardware`` names this CPU by, from its flags (without torch)."""
    if "amx_bf16" in flags:
        return "cpu-amx"
    if "avx512_bf16" in flags:
        return "cpu-avx512_bf16"
    return "cpu-no_bf16"


def cpu_description(cpuinfo: Path = CPUINFO) -> str:
    """``"AMD EPYC, flags: avx2"``: the CPU's model and the flags that decide bf16 / int8
    speed, as every speed figure in the docs names them (machines change between days)."""
    model, flags = cpu_model_and_flags(cpuinfo)
    present = [flag for flag in REPORTED_FLAGS if flag in flags]
    return f"{model}, flags: {', '.join(present) or 'none of ' + ', '.join(REPORTED_FLAGS)}"
