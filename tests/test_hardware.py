"""Which precision the chip runs natively, and how a report names the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from aiayn.errors import UserError
from aiayn.runtime import cpu, hardware, packed

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16

processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16
"""


def test_cpu_description_names_the_model_and_the_flags_that_decide_bf16_and_int8(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    assert cpu.cpu_description(cpuinfo) == (
        "AMD EPYC 9R14 96-Core Processor, flags: avx2, avx512f, avx512_vnni, avx512_bf16"
    )
    cpuinfo.write_text(CPUINFO.replace(" avx512f avx512bw avx512_vnni avx512_bf16", ""))
    assert cpu.cpu_description(cpuinfo).endswith(", flags: avx2")


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "native", "needle", "chip"),
    [
        (True, True, True, "AMX", "cpu-amx"),
        (False, True, True, "avx512_bf16", "cpu-avx512_bf16"),
        (False, False, False, "no native bf16", "cpu-no_bf16"),
    ],
)
def test_cpu_bf16_is_native_only_with_avx512_bf16_or_amx(
    monkeypatch, amx, avx512_bf16, native, needle, chip
):
    monkeypatch.delenv(hardware.ASSUME_BF16)  # the CPU's own answer
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    support = hardware.bf16_support(torch.device("cpu"))
    assert support.native is native and needle in support.reason and support.chip == chip


def test_the_assumed_answer_overrides_the_cpus_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setenv(hardware.ASSUME_BF16, "emulated")
    support = hardware.bf16_support(torch.device("cpu"))
    assert not support.native and support.chip == "cpu-no_bf16"
    assert "AIAYN_ASSUME_BF16=emulated" in support.reason
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setenv(hardware.ASSUME_BF16, "native")
    support = hardware.bf16_support(torch.device("cpu"))
    assert support.native and support.chip == "cpu-avx512_bf16"
    monkeypatch.setenv(hardware.ASSUME_BF16, "yes")
    with pytest.raises(UserError, match="AIAYN_ASSUME_BF16=yes: give one of native, emulated"):
        hardware.bf16_support(torch.device("cpu"))


def test_this_machines_answer_agrees_with_its_cpuinfo(monkeypatch):
    monkeypatch.delenv(hardware.ASSUME_BF16)
    flags = cpu.cpu_description()
    support = hardware.bf16_support(torch.device("cpu"))
    if cpu.CPUINFO.is_file():
        assert support.native == ("avx512_bf16" in flags or "amx_bf16" in flags)


_SWEEPS = """
import torch
from aiayn.runtime.packed import PackedLinear
from aiayn.runtime.hardware import keep_onednn_primitives
keep_onednn_primitives()
linear = PackedLinear(torch.nn.Linear(8, 8))
for sweep in range(2):  # each row count is a shape of its own: a primitive each
    for rows in range(1, ROWS + 1):
        linear(torch.randn(rows, 8))
"""


@pytest.mark.slow  # a process per preset: 6-7 s each
@pytest.mark.parametrize("preset", [None, "1024"])
def test_onednn_keeps_a_primitive_per_shape_unless_the_user_set_a_capacity(preset):
    # more shapes than oneDNN's default 1,024: a second sweep compiles none of them again,
    # but where the user set the capacity themselves, theirs holds (and evicts)
    if not packed.available():
        pytest.skip("this PyTorch has no oneDNN linear ops")
    rows = 1100
    env = {k: v for k, v in os.environ.items() if k != hardware.ONEDNN_CACHE}
    env |= {"ONEDNN_VERBOSE": "all"} | ({hardware.ONEDNN_CACHE: preset} if preset else {})
    code = _SWEEPS.replace("ROWS", str(rows))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    compiled = out.count("create:cache_miss")
    if preset is None:
        assert rows <= compiled < rows + 20  # the first sweep's, and a weight reorder or two
    else:
        assert compiled >= 2 * rows
