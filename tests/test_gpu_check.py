"""scripts/gpu_check.py in its CPU mode, the same code as on a GPU on tiny shapes, run here
so that the GPU check never rots: every section runs, and its JSON holds the assertions."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.errors import UserError

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import gpu_check  # noqa: E402


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("gpu_check") / "check"
    command = [sys.executable, str(SCRIPTS / "gpu_check.py"), "--device", "cpu"]
    result = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True)
    return result, out


@pytest.mark.slow
def test_the_cpu_check_runs_every_section_and_its_checks_hold(cpu_check):
    result, out = cpu_check
    report = json.loads((out / "gpu_check.json").read_text())
    failed = {name: s["error"] for name, s in report["sections"].items() if not s["ok"]}
    assert not failed and result.returncode == 0, (failed, result.stderr[-3000:])
    assert list(report["sections"]) == ["data", *gpu_check.SECTIONS]
    assert report["checks"] == {
        "every_section_ok": True,
        "resume_bit_exact": True,
        "sdpa_backend_reported": True,
        "syncs_counted": True,
        "torchrun_equals_update_freq": True,
    }
    table = (out / "gpu_check.md").read_text()
    assert (
        table.strip() in result.stdout
        and "| resume | killed at update 3, resumed: bit-exact" in table
    )


@pytest.mark.slow
def test_the_cpu_check_reports_what_ran(cpu_check):
    sections = json.loads((cpu_check[1] / "gpu_check.json").read_text())["sections"]
    for precision in ("fp32", "bf16"):  # seen run, and each backend tried alone
        sdpa = sections["sdpa"][precision]
        assert set(sdpa["default"]) == {"flash (CPU)"}
        assert sdpa["alone"]["math"] == "ok" and sdpa["alone"]["flash"] == "ok"
        assert sdpa["alone"]["memory-efficient"].startswith("fails: ")
    fp32 = [row for row in sections["train"]["rows"] if row["precision"] == "fp32"]
    assert fp32[0]["tokens_per_s"] > 0 and 0 < fp32[0]["mfu_measured"] < 1
    assert "mfu_spec" not in fp32[0]  # a CPU has no datasheet row
    torchrun = sections["torchrun"]
    assert (torchrun["processes"], torchrun["backend"]) == (2, "gloo")
    assert torchrun["update_freq"] == {"single": 2, "ddp": 1}
    ours = {row["batch"]: row for row in sections["decode"]["rows"] if row["system"] == "aiayn"}
    assert set(ours) == {1, 64} and all(row["tokens_per_s"] > 0 for row in ours.values())
    syncs = sections["syncs"]  # the figures tests/test_host_reads.py pins, by site
    assert syncs["train_update"]["host_reads"] == 9
    assert syncs["beam_step"]["host_reads"] == 2
    # finish, _leave, the banks' five and the two state reads: 1 + 1 + 5 + 2
    assert syncs["beam_step_constrained"]["host_reads"] == 9
    assert sections["demo"]["skipped"].startswith("--demo-minutes 0")


@pytest.mark.parametrize(
    "device, precision, matmuls, row",
    [
        ("NVIDIA H200", "bf16", "highest", ("bf16", 989.5e12)),
        ("NVIDIA H200 NVL", "bf16", "highest", ("bf16", 835e12)),  # not the SXM part's
        ("NVIDIA H100 80GB HBM3", "fp32", "highest", ("fp32", 67e12)),
        ("NVIDIA H100 PCIe", "fp32", "high", ("tf32", 378e12)),  # tf32 matmuls allowed
        ("NVIDIA A100-SXM4-80GB", "fp16", "highest", ("fp16", 312e12)),
        ("Tesla T4", "fp16", "highest", None),
    ],
)
def test_mfu_is_read_against_the_datasheet_row_of_the_device(device, precision, matmuls, row):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(matmuls)
    try:
        assert gpu_check.spec_peak(device, precision) == row
    finally:
        torch.set_float32_matmul_precision(before)


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    def broken(check):
        raise RuntimeError("the device fell over")

    monkeypatch.setitem(gpu_check.SECTIONS, "environment", broken)
    out = tmp_path / "check"
    argv = ["--device", "cpu", "--out", str(out), "--sections", "environment,syncs"]
    threads = torch.get_num_threads()
    try:
        assert gpu_check.main(argv) == 1
    finally:
        torch.set_num_threads(threads)  # the trainer of the syncs section set its own
    report = json.loads((out / "gpu_check.json").read_text())
    environment, syncs = report["sections"]["environment"], report["sections"]["syncs"]
    assert not environment["ok"] and "Traceback" in environment["error"]
    assert environment["error"].strip().endswith("RuntimeError: the device fell over")
    assert syncs["ok"] and syncs["beam_step"]["host_reads"] == 2
    assert (
        report["checks"]["every_section_ok"] is False
        and report["checks"]["resume_bit_exact"] is None
    )


def test_an_out_it_did_not_make_is_refused_and_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(
        UserError, match=f"--out {tmp_path}: exists and gpu_check.py did not make it"
    ):
        gpu_check.main(["--device", "cpu", "--out", str(tmp_path)])
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
