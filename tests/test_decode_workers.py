"""``--workers``: batches decoded side by side in forked processes give one process's outputs."""

import argparse
import importlib
import json
import os
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
import torch
from _cli import run_cli
from _decode_helpers import hypotheses

from aiayn.checkpoint import latest_checkpoint, load_translator
from aiayn.cli.decoding import open_translator, workers_arg
from aiayn.cli.main import build_parser
from aiayn.decode import Batching, DecodeConfig, SampleConfig, SearchRequest, decode_ids
from aiayn.errors import UserError
from aiayn.runtime import workers as workers_module
from aiayn.runtime.workers import MAX_AUTO_WORKERS, auto_workers, resolve_workers, run_batches

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_and_sources(tiny_run):
    model, vocab = load_translator(latest_checkpoint(tiny_run / "checkpoints"))
    lines = [
        "In the beginning God created the heaven and the earth.",
        "And God said, Let there be light: and there was light.",
        "light",
        "And the evening and the morning were the first day.",
        "",
        "And God called the firmament Heaven.",
        "And God saw that it was good, and the earth brought forth grass.",
        "Let the waters under the heaven be gathered together unto one place",
        "day",
    ]
    return model, [vocab.encode_source(line) if line else [] for line in lines]


@pytest.mark.parametrize(
    "options",
    [
        dict(config=DecodeConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=5)),
        dict(
            config=DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5),
            sampling=SampleConfig(samples=2, top_k=5, seed=3),
        ),
    ],
    ids=["beam-nbest", "sampling"],
)
def test_two_workers_give_the_outputs_of_one_process(model_and_sources, options):
    model, sources = model_and_sources
    config = options.pop("config")
    one = decode_ids(model, sources, SearchRequest(config, batching=Batching(2), **options))
    two = decode_ids(
        model, sources, SearchRequest(config, batching=Batching(2, workers=2), **options)
    )
    assert hypotheses(two) == hypotheses(one)
    assert two[4] == [] and all(two[i] for i in range(len(sources)) if sources[i])


def test_batches_run_in_other_processes_each_once():
    here = os.getpid()
    torch.set_num_threads(2)
    try:
        job = lambda i: (i * i, os.getpid(), torch.get_num_threads())  # noqa: E731
        done = list(run_batches(job, 7, workers=2))
    finally:
        torch.set_num_threads(1)  # the module's one_thread
    assert sorted(i for i, _ in done) == list(range(7))
    assert all(square == i * i for i, (square, _, _) in done)
    assert all(pid != here for _, (_, pid, _) in done)
    assert {threads for _, (_, _, threads) in done} == {1}  # the parent's two, one per worker


def test_a_process_takes_two_batches_at_least():
    here = os.getpid()
    torch.set_num_threads(4)
    try:
        job = lambda i: (os.getpid(), torch.get_num_threads())  # noqa: E731
        three = dict(run_batches(job, 3, workers=4))  # one process: here, with all 4 threads
        five = dict(run_batches(job, 5, workers=4))  # two processes, 2 threads each
    finally:
        torch.set_num_threads(1)  # the module's one_thread
    assert set(three.values()) == {(here, 4)}
    assert {threads for _, threads in five.values()} == {2}
    assert here not in {pid for pid, _ in five.values()} and len(five) == 5


def test_a_workers_error_reaches_the_caller():
    def decode_batch(i):
        if i == 3:
            raise ValueError("batch 3 is bad")
        return i

    with pytest.raises(ValueError, match="batch 3 is bad"):
        list(run_batches(decode_batch, 5, workers=2))


def test_a_worker_that_dies_is_an_error_not_a_hang():
    def decode_batch(i):
        if i == 2:
            os._exit(1)  # as the kernel's out-of-memory killer would end it
        return i

    with pytest.raises(BrokenProcessPool):
        list(run_batches(decode_batch, 6, workers=2))


def test_workers_are_cpu_processes(model_and_sources):
    model, sources = model_and_sources
    with pytest.raises(ValueError, match="workers are CPU processes"):
        decode_ids(model, sources, SearchRequest(batching=Batching(workers=2), device="cuda"))
    with pytest.raises(ValueError, match="workers must be at least 1"):
        list(run_batches(lambda i: i, 3, workers=0))


def test_translate_with_two_workers_prints_what_one_prints(tiny_run, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_text("In the beginning\n\nAnd God said\nlight\nAnd the earth was without form\n")
    argv = ("translate", "--checkpoint", ckpt, "--input", src, "--batch-size", 1)
    code1, one, _ = run_cli(capsys, *argv)
    code2, two, err = run_cli(capsys, *argv, "--workers", 2)
    assert code1 == code2 == 0, err
    assert two == one and len(two.splitlines()) == 5


def test_workers_on_a_gpu_are_refused_by_name():
    with pytest.raises(UserError, match="--workers are CPU processes: --device cuda:0 decodes"):
        resolve_workers(2, "cuda:0")
    assert resolve_workers(1, "cuda:0") == 1


@pytest.fixture
def asked(monkeypatch) -> list[int]:
    """The ``workers`` that each corpus search of the test was given, in order."""
    calls = []

    def spy(decode_batch, n, *, workers=1):
        calls.append(workers)
        return workers_module.run_batches(decode_batch, n, workers=workers)

    # the module, not the function that aiayn.decode re-exports under its name
    monkeypatch.setattr(importlib.import_module("aiayn.decode.translate"), "run_batches", spy)
    return calls


def five_lines(tmp_path: Path) -> Path:
    """A source file of five lines (one empty): several batches at --batch-size 1."""
    src = tmp_path / "src.txt"
    src.write_text("In the beginning\nAnd God said\nlight\n\nAnd the earth was without form\n")
    return src


def test_evaluate_with_two_workers_writes_what_one_writes(tiny_run, tmp_path, capsys, asked):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = five_lines(tmp_path)
    scores = []
    for workers in (1, 2):
        hyp = tmp_path / f"hyp{workers}.txt"
        argv = ("evaluate", "--checkpoint", ckpt, "--src", src, "--ref", src, "--output", hyp)
        code, out, err = run_cli(capsys, *argv, "--batch-size", 1, "--workers", workers)
        assert code == 0, err
        scores.append(json.loads(out)["sacrebleu"])
    assert (tmp_path / "hyp2.txt").read_text() == (tmp_path / "hyp1.txt").read_text()
    assert scores[0] == scores[1]
    assert set(asked) == {1, 2}  # --workers reached the search


def test_auto_is_a_process_per_thread_on_the_cpu_and_one_on_a_gpu(monkeypatch):
    for threads, expected in ((1, 1), (3, 3), (64, MAX_AUTO_WORKERS)):
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        assert auto_workers("cpu") == expected
        assert resolve_workers("auto", "cpu") == expected
    assert auto_workers("cuda:0") == 1
    assert resolve_workers("auto", "cuda:0") == 1  # auto on a GPU is not refused
    score = build_parser().parse_args(["score", "--checkpoint", "x"])  # no --workers: one
    assert open_translator(score, "score").workers == 1
    assert workers_arg("auto") == "auto" and workers_arg("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="a number of processes or auto, not 'x'"):
        workers_arg("x")


def test_evaluate_without_workers_decodes_a_process_per_thread(tiny_run, tmp_path, capsys, asked):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = five_lines(tmp_path)
    torch.set_num_threads(2)  # the one_thread fixture puts 1 back
    outputs = []
    for extra in ((), ("--workers", 1)):
        hyp = tmp_path / f"hyp{len(outputs)}.txt"
        argv = ("evaluate", "--checkpoint", ckpt, "--src", src, "--ref", src, "--output", hyp)
        code, _, err = run_cli(capsys, *argv, "--batch-size", 1, *extra)
        assert code == 0, err
        outputs.append(hyp.read_text())
    assert asked == [2, 1]  # the default reached the search as two processes
    assert outputs[0] == outputs[1]
    code, _, err = run_cli(capsys, "evaluate", "--checkpoint", ckpt, "--src", src, "--ref", src,
                           "--workers", "many")  # fmt: skip
    assert code == 2 and "--workers: a number of processes or auto, not 'many'" in err
