"""benchmarks/bf16_training.py: the one command that measures bf16 training against fp32 (ours and
the peers), checked on tiny shapes so that it never rots; it stops on a CPU without native bf16."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from aiayn import hardware
from aiayn.policy import resolve_attention

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(BENCHMARKS))  # it imports train_throughput and measure_auto
    try:
        spec = importlib.util.spec_from_file_location(
            "bf16_training", BENCHMARKS / "bf16_training.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_it_stops_on_a_cpu_without_native_bf16(script, monkeypatch, capsys):
    monkeypatch.setenv(hardware.ASSUME_BF16, "emulated")
    with pytest.raises(SystemExit, match="^bf16_training: the CPU has no native bf16.*emulates"):
        script.main(["--quick"])
    assert "tokens/s" not in capsys.readouterr().out  # nothing measured


def test_quick_reports_ours_and_a_peer_in_both_precisions_and_the_goals(
    script, tiny_corpus, monkeypatch, capsys
):
    pytest.importorskip("transformers")  # the default peers; torch.nn is always there
    monkeypatch.setenv(hardware.ASSUME_BF16, "native")
    tiny = ["--config", "tiny", "--preset", "tiny", "--data", str(tiny_corpus)]
    script.main(
        ["--quick", "--reps", "1", "--steps", "1", "--updates", "2", "--threads", "1", *tiny]
    )
    out = capsys.readouterr().out
    for system in ("ours", "torch.nn", "hf-marian"):
        assert re.search(
            rf"^\| {re.escape(system)} \| [\d,]+ / [\d,]+ \| [\d,]+ / [\d,]+ \| ", out, re.M
        )
    assert re.search(r"demo recipe, 2 updates a run: fp32 [\d,]+, bf16 [\d,]+ tokens/s", out)
    # the attention path of the bf16 run, from its summary: the one the CPU's class chose
    assert resolve_attention("bf16", torch.device("cpu")) in out
    goals = re.findall(r"^  (?:met|NOT met): (.*)$", out, re.M)
    assert [g.split(":")[0] for g in goals] == [
        "ours bf16 / fp32, step (best reps)",
        "ours bf16 / fp32, demo recipe",
        "valid perplexity bf16 against fp32",
        goals[3].split(":")[0],
    ] and goals[3].startswith("ours bf16 / fastest peer (")
