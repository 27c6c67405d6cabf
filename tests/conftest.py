"""Shared fixtures: a small prepared slice of the bundled corpus for training tests, and the
CPU's bf16 answer and the table of measured figures pinned so that no result depends on the CPU
that runs the suite or on what ``aiayn measure`` wrote there."""

import os
from pathlib import Path

import pytest
import torch

from aiayn.data.prepare import prepare_bundled_slice
from aiayn.runtime import figures as measured
from aiayn.runtime import hardware

# Every test sees a CPU without native bf16 (so every `auto` is fp32 and eager) unless it asks for
# `bf16_answer`, which runs it under both answers; `AIAYN_ASSUME_BF16=native make test` runs the
# whole suite as a native-bf16 CPU would.
os.environ.setdefault(hardware.ASSUME_BF16, "emulated")


@pytest.fixture(scope="session", autouse=True)
def no_user_table(tmp_path_factory):
    """This machine's own figures (``aiayn measure``) unread: every ``auto`` decides from the
    package's table, or from the one a test writes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(measured.USER_TABLE, str(tmp_path_factory.mktemp("user") / "measured.json"))
        yield


@pytest.fixture(params=hardware.ASSUMED)
def bf16_answer(request, monkeypatch) -> str:
    """The CPU's bf16 answer, "native" then "emulated", whatever this machine has: a test of what
    depends on it runs under both, so a failure only a Zen 4 or AMX CPU would show appears on an
    AVX2 machine too."""
    monkeypatch.setenv(hardware.ASSUME_BF16, request.param)
    return request.param


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """400 training pairs (and 40 valid/test) of the Bible, 300-piece vocabulary, prepared."""
    root = tmp_path_factory.mktemp("tiny_corpus")
    return prepare_bundled_slice(root, {"train": 400, "valid": 40, "test": 40}, 300, 48)


@pytest.fixture(scope="session")
def tiny_run(tiny_corpus, tmp_path_factory) -> Path:
    """A run directory of 3 one-update checkpoints of a 1+1-layer model on ``tiny_corpus``.

    Read-only for tests: copy a checkpoint before changing it.
    """
    from aiayn.train import TrainConfig
    from aiayn.train.trainer import Trainer

    out = tmp_path_factory.mktemp("tiny_run")
    cfg = TrainConfig(
        data=str(tiny_corpus),
        out=str(out),
        preset="tiny",
        model={"N_enc": 1, "N_dec": 1, "d_model": 32, "d_ff": 64, "h": 2},
        max_src_tokens=400,
        max_tgt_tokens=400,
        warmup=10,
        max_updates=3,
        save_every_updates=1,
        save_every_minutes=None,
        validate=False,
        num_threads=1,
        log_every=1,
        amp="none",
    )
    Trainer(cfg).run(resume=None)
    return out


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny-model tests (the CLI and server ones): on a
    busy 2-core machine a second thread only adds waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_terminal_summary(terminalreporter) -> None:
    """How many tests passed under each of the CPU's bf16 answers: CI's log shows both ran."""
    passed = terminalreporter.stats.get("passed", [])
    counts = {answer: 0 for answer in hardware.ASSUMED}
    for report in passed:
        ids = report.nodeid.partition("[")[2].rstrip("]").split("-")  # test[native-True]
        for answer in hardware.ASSUMED:
            counts[answer] += answer in ids
    said = ", ".join(f"{n} passed as {answer}" for answer, n in counts.items())
    terminalreporter.write_line(f"the CPU's bf16 answers (bf16_answer): {said}")


# The end-to-end modules (the demo, training to a learning goal, the benchmark and peer scripts,
# the wheel, the GPU check on the CPU): most of the suite's minutes. `make test-fast` leaves
# them out with the tests marked slow; `make test` runs everything.
SLOW_MODULES = {
    "test_demo.py",
    "test_learning.py",
    "test_learning_gate.py",
    "test_peers_script.py",
    "test_marian_benchmark.py",
    "test_benchmarks.py",
    "test_gpu_check.py",
    "test_experiments.py",
    "test_package.py",
}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
