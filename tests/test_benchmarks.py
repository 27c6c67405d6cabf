"""The benchmark suite (benchmarks/, run by benchmarks/run_all.py) as a user runs it: every
command on tiny shapes writes records that aiayn.records reads, what the machine lacks is
skipped with the reason; and the suite stays a suite that no test imports."""

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from aiayn.records import load_records
from aiayn.runtime import hardware

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
    )


@pytest.mark.slow
def test_the_suite_on_tiny_shapes_writes_a_record_per_topic(tmp_path):
    records = tmp_path / "records"
    done = run("run_all.py", "--check", "--only", "train,decode,prepare", "--record", str(records))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    written = load_records(records)  # each checked: keys, types, topic, class, date
    assert sorted(r.topic for r in written) == ["data", "decoding", "training"]
    for record in written:
        assert record.command.startswith("benchmarks/") and f"--record {records}" in record.command
        assert record.machine_class == hardware.bf16_support(torch.device("cpu")).chip
    training = next(r for r in written if r.topic == "training")
    assert training.what.startswith("training step, d32 1+1, fp32")
    assert training.figures["ours tokens/s"] > 0


def test_the_suite_skips_what_this_machine_lacks_and_says_why(tmp_path):
    records, absent = tmp_path / "records", tmp_path / "no-model"
    only = "serve,engine,fairseq,marian,train-bf16"
    args = ["--only", only, "--checkpoint", str(absent), "--record", str(records)]
    done = run("run_all.py", *args, **{hardware.ASSUME_BF16: "emulated"})
    assert done.returncode == 0, done.stderr
    no_bf16 = hardware.bf16_support(torch.device("cpu")).reason  # conftest: an emulating CPU
    assert done.stdout.splitlines() == [
        f"== train-bf16: skipped: {no_bf16}",
        f"== engine: skipped: no demo model at {absent} (make demo, or --checkpoint)",
        f"== serve: skipped: no demo model at {absent} (make demo, or --checkpoint)",
        "== fairseq: skipped: no --fairseq-python (demo_vs_fairseq.py's docstring makes one)",
        "== marian: skipped: no --marian (demo_vs_marian.py's docstring makes one)",
    ]
    assert list(records.iterdir()) == []  # nothing measured, nothing recorded


def test_the_suite_refuses_an_unknown_topic():
    done = run("run_all.py", "--only", "train,gpu")
    assert done.returncode == 2 and "--only: unknown gpu; choose from train," in done.stderr


def test_bf16_training_stops_on_a_cpu_without_native_bf16():
    done = run("train_throughput.py", "--configs", "tiny", "--bf16", AIAYN_ASSUME_BF16="emulated")
    assert done.returncode == 1 and "tokens/s" not in done.stdout
    assert done.stderr.startswith("train_throughput --bf16: the CPU has no native bf16")


@pytest.mark.lint
def test_the_suite_stays_a_handful_of_scripts():
    """A handful of scripts; their length is a conversation (a warning), not a target."""
    files = sorted(p for p in BENCHMARKS.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)
    assert len(files) <= 11, [p.name for p in files]
    if lines > 3400:
        warnings.warn(f"benchmarks/ holds {lines} lines: time to ask what can go", stacklevel=1)


@pytest.mark.lint
@pytest.mark.parametrize("test", sorted(Path(__file__).parent.glob("*.py")), ids=lambda p: p.name)
def test_no_test_imports_a_benchmark_script(test):
    """A test runs a benchmark as a user does (a subprocess), so the suite can change freely."""
    scripts, source = {p.stem for p in BENCHMARKS.glob("*.py")}, test.read_text(encoding="utf-8")
    imported, loaders = set(), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Expr | ast.Assign):  # benchmarks/ on sys.path, or loaded
            text = ast.get_source_segment(source, node) or ""
            if "benchmarks" in text and ("sys.path" in text or "spec_from_file" in text):
                loaders.append(text)
    assert not imported & scripts and not loaders, (imported & scripts, loaders)
