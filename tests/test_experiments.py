"""`aiayn experiment`: each experiment on a tiny budget (rows, columns, finite numbers, plots),
reruns that skip finished rows, and the measurements' own arithmetic pinned by hand."""

import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from _cli import run_cli
from _pictures import assert_picture, catch_figures

from aiayn.config import ModelConfig
from aiayn.data import TokenDataset
from aiayn.decode import DecodeConfig, SearchRequest
from aiayn.errors import UserError
from aiayn.experiments import run_experiment, table1, table3, training
from aiayn.experiments.heads import head_statistics, is_punctuation
from aiayn.experiments.inputs import Corpus, valid_paths
from aiayn.experiments.runner import Budget, Experiment, Row, read_budget, run_rows
from aiayn.model import Transformer

TINY = ["preset=tiny", "updates=2", "sentences=3", "max_tokens=400", "threads=1"]


@pytest.fixture(autouse=True)
def quick_rows(monkeypatch):
    """Two thirds of a tiny row went to beam search running to input + 50 tokens (an untrained
    model never says eos): a smoke run decodes 3 tokens."""
    monkeypatch.setattr(
        training,
        "SearchRequest",
        functools.partial(SearchRequest, DecodeConfig(max_len_a=0.0, max_len_b=3)),
    )


@pytest.fixture(scope="module")
def corpus(tiny_corpus):
    root = tiny_corpus.parent
    return Corpus(tiny_corpus, (root / "valid.en", root / "valid.es"))


def _forbid(monkeypatch, module, name):
    def fail(*args, **kwargs):
        raise AssertionError(f"{name} ran again for a finished row")

    monkeypatch.setattr(module, name, fail)


def _finite(values):
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


# --- the runner ------------------------------------------------------------------------------


def _counting(out, calls, names=("a", "b", "c"), stop_at=None):
    def run(name):
        def go():
            if name == stop_at:
                return None
            calls.append(name)
            return {"value": float(len(calls))}

        return go

    return Experiment(
        name="toy",
        rows=[Row(n, run(n)) for n in names],
        report=lambda rows: f"{len(rows)} rows",
        plot=lambda rows, out: [],
        budget_keys=("updates",),
    )


def test_runner_stops_when_a_row_is_out_of_budget_and_resumes_the_rest(tmp_path):
    calls = []
    first = run_rows(_counting(tmp_path, calls, stop_at="b"), Budget(), tmp_path)
    assert [r["name"] for r in first["rows"]] == ["a"] and calls == ["a"]
    again = run_rows(_counting(tmp_path, calls), Budget(), tmp_path)
    assert [r["name"] for r in again["rows"]] == ["a", "b", "c"] and calls == ["a", "b", "c"]
    assert again["rows"][0]["value"] == 1.0  # kept from the first run, not recomputed
    assert "3 of 3 rows" in (tmp_path / "results.md").read_text()


def test_runner_skips_a_row_another_process_holds(tmp_path):
    import fcntl
    import os

    (tmp_path / "locks").mkdir()
    fd = os.open(tmp_path / "locks" / "b", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process is training row b
    calls = []
    try:
        first = run_rows(_counting(tmp_path, calls), Budget(), tmp_path)
    finally:
        os.close(fd)
    assert [r["name"] for r in first["rows"]] == ["a", "c"] and calls == ["a", "c"]
    again = run_rows(_counting(tmp_path, calls), Budget(), tmp_path)  # b's process died: b is free
    assert [r["name"] for r in again["rows"]] == ["a", "b", "c"] and calls == ["a", "c", "b"]


def test_two_runs_fill_one_table_without_recomputing_or_losing_rows(tmp_path):
    """While this run trains row a, a second run of the same command (here: started from inside
    row a) takes b and c; the first then finds them finished, and results.json holds all three."""
    calls = []

    def row(name):
        def go():
            if name == "a":
                run_rows(_counting(tmp_path, calls), Budget(), tmp_path)  # the second process
            calls.append(name)
            return {"by": "first" if name == "a" else "?"}

        return go

    first = Experiment(
        name="toy",
        rows=[Row(n, row(n)) for n in "abc"],
        report=lambda rows: f"{len(rows)} rows",
        plot=lambda rows, out: [],
        budget_keys=("updates",),
    )
    result = run_rows(first, Budget(), tmp_path)
    assert calls == ["b", "c", "a"]  # each row computed once, b and c by the second run
    assert [(r["name"], r.get("by")) for r in result["rows"]] == [
        ("a", "first"),
        ("b", None),
        ("c", None),
    ]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [r["name"] for r in saved["rows"]] == ["a", "b", "c"]
    assert "3 of 3 rows" in (tmp_path / "results.md").read_text()


def test_report_only_writes_the_finished_rows_and_runs_none(tmp_path):
    calls = []
    run_rows(
        _counting(tmp_path, calls, stop_at="b"), Budget(), tmp_path
    )  # a finished, b and c left
    (tmp_path / "results.md").unlink()
    result = run_rows(_counting(tmp_path, calls), Budget(), tmp_path, report_only=True)
    assert calls == ["a"] and [r["name"] for r in result["rows"]] == ["a"]
    assert "1 of 3 rows." in (tmp_path / "results.md").read_text()


def test_runner_writes_a_report_when_no_row_fits(tmp_path):
    result = run_rows(_counting(tmp_path, [], stop_at="a"), Budget(), tmp_path)
    assert (
        result["rows"] == []
        and "No row fitted in the budget yet." in (tmp_path / "results.md").read_text()
    )


def test_runner_refuses_results_of_another_budget_or_experiment(tmp_path):
    run_rows(_counting(tmp_path, []), Budget(updates=5), tmp_path)
    with pytest.raises(ValueError, match=r"results.json was measured with budget \{'updates': 5\}"):
        run_rows(_counting(tmp_path, []), Budget(updates=6), tmp_path)
    other = _counting(tmp_path, [])
    other.name = "other"
    with pytest.raises(ValueError, match="holds experiment 'toy'"):
        run_rows(other, Budget(updates=5), tmp_path)


# --- seeds ------------------------------------------------------------------------------------


def _seeded(calls, names=("base", "change"), scores=None):
    """A toy experiment whose rows can be reseeded: row NAME with seed offset k measures
    ``scores[NAME][k]`` (a dev perplexity and a BLEU)."""
    scores = scores or {
        "base": [(10.0, 20.0), (12.0, 21.0), (14.0, 19.0), (11.0, 20.0)],
        "change": [(11.0, 22.0), (14.0, 23.0), (15.0, 22.5), (12.0, 21.0)],
    }

    def run(name, k):
        def go():
            calls.append((name, k))
            ppl, bleu = scores[name][k]
            return {"valid_ppl": ppl, "bleu": bleu}

        return go

    return Experiment(
        name="toy",
        rows=[Row(n, run(n, 0), reseed=functools.partial(run, n)) for n in names],
        report=lambda rows: "rows: " + ", ".join(r["name"] for r in rows),
        plot=lambda rows, out: [],
        budget_keys=("updates",),
    )


def test_seeds_run_each_row_n_times_and_test_it_against_the_base_row(tmp_path):
    calls = []
    result = run_rows(_seeded(calls), Budget(), tmp_path, seeds=3)
    assert [r["name"] for r in result["rows"]] == [
        "base", "base seed+1", "base seed+2", "change", "change seed+1", "change seed+2",
    ]  # fmt: skip
    assert [r.get("repeat_of") for r in result["rows"]] == [
        None,
        "base",
        "base",
        None,
        *["change"] * 2,
    ]
    base, change = result["seeds"]
    assert base["runs"] == 3 and base["valid_ppl"]["mean"] == 12.0
    assert base["valid_ppl"]["sd"] == pytest.approx(2.0)  # sample sd of 10, 12, 14
    assert "diff" not in base["valid_ppl"]  # the baseline is not tested against itself
    # change - base with the same seed: ppl 1, 2, 1 (all one way: p = 2/8); BLEU 2, 2, 3.5
    assert change["valid_ppl"]["diff"] == pytest.approx(4 / 3) and change["valid_ppl"]["p"] == 0.25
    assert change["bleu"]["diff"] == pytest.approx(2.5) and change["valid_ppl"]["pairs"] == 3
    table = (tmp_path / "results.md").read_text()
    assert "rows: base, change" in table  # the experiment's own report: each row's first run
    assert "2 of 2 rows, and 4 repeats with other seeds" in table
    assert "| change | 3 | 13.3 ± 2.1 | +1.33 (p = 0.25, 3 pairs) |" in table


def test_seeds_resume_add_and_survive_a_rerun_with_fewer(tmp_path):
    calls = []
    run_rows(_seeded(calls), Budget(), tmp_path, seeds=2)
    fewer = run_rows(_seeded(calls), Budget(), tmp_path)  # no --seeds: the repeats are kept
    assert len(calls) == 4 and len(fewer["rows"]) == 4 and fewer["seeds"][1]["runs"] == 2
    more = run_rows(_seeded(calls), Budget(), tmp_path, seeds=4)
    assert calls[4:] == [("base", 2), ("base", 3), ("change", 2), ("change", 3)]  # only the new
    assert [e["runs"] for e in more["seeds"]] == [4, 4]
    assert more["seeds"][1]["valid_ppl"]["p"] == 2 / 16  # 1 2 1 1: every seed one way


def test_seeds_pair_runs_by_the_seed_they_trained_with():
    """table3's base-seed2 fixes its seed (2) and runs once: it pairs with the base's run of
    seed 2, not with the base's first run."""
    from aiayn.experiments.seeds import seeds_summary

    rows = [
        {"name": "base", "seed": 1, "valid_ppl": 10.0},
        {"name": "base seed+1", "repeat_of": "base", "repeat": 1, "seed": 2, "valid_ppl": 12.0},
        {"name": "base-seed2", "seed": 2, "valid_ppl": 12.5},
    ]
    _, fixed = seeds_summary(rows, "base")
    assert fixed["valid_ppl"]["pairs"] == 1 and fixed["valid_ppl"]["diff"] == 0.5
    assert fixed["valid_ppl"]["sd"] is None and "bleu" not in fixed


def test_seeds_need_a_row_that_can_be_reseeded(tmp_path):
    with pytest.raises(UserError, match="has no row to repeat"):
        run_rows(_counting(tmp_path, []), Budget(), tmp_path, seeds=2)
    with pytest.raises(UserError, match="--seeds must be >= 1"):
        run_rows(_seeded([]), Budget(), tmp_path, seeds=0)


def test_a_training_row_reseeded_trains_with_the_next_seed(corpus, tmp_path):
    rows = training.variant_rows(tmp_path, read_budget(TINY), corpus, {"base": ({}, {})})
    toy = training.training_experiment(
        "toy", rows, corpus=corpus, report=lambda rows: "", plot=lambda rows, out: []
    )
    result = run_rows(toy, read_budget(TINY), tmp_path, seeds=2)
    first, again = result["rows"]
    assert (first["seed"], again["seed"]) == (1, 2)  # the demo recipe's seed, then + 1
    assert again["valid_ppl"] != first["valid_ppl"]  # another initialisation and batch order
    assert again["checkpoint"].startswith(str(tmp_path / "rows" / "base seed+1"))
    fixed = training.variant_rows(tmp_path, read_budget(TINY), corpus, {"s": ({}, {"seed": 5})})
    assert fixed[0].reseed is None  # a row that sets its own seed runs once


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["table1", "--seeds", "2"],
            "--seeds repeats training rows; experiment table1 trains nothing",
        ),
        (["scaling", "--seeds", "0"], "--seeds must be >= 1, got 0"),
    ],
)
def test_cli_refuses_seeds_it_cannot_run_in_one_line(tmp_path, argv, message):
    result = subprocess.run(
        [sys.executable, "-m", "aiayn", "experiment", *argv, "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"aiayn experiment: error: {message}")
    assert not (tmp_path / "x").exists()


def test_bundled_validation_text_is_recorded_by_name_not_install_path(tmp_path):
    """A table measured with one install must continue from another checkout or venv, where
    the bundled files sit elsewhere; user-given files are recorded by their paths."""
    from aiayn.data import bundled_corpus_paths

    bundled = valid_paths(None)
    assert bundled == bundled_corpus_paths()["valid"]
    assert Corpus(tmp_path, bundled).record() == {"data": str(tmp_path), "valid": "bundled"}
    copies = (tmp_path / "v.en.gz", tmp_path / "v.es.gz")
    for source, copy in zip(bundled, copies):
        copy.write_bytes(source.read_bytes())
    assert Corpus(tmp_path, copies).record()["valid"] == [str(p) for p in copies]


def test_budget_is_typed_and_checked():
    assert read_budget(["updates=7", "preset=tiny", "seconds=2.5"]) == Budget(
        updates=7, preset="tiny", seconds=2.5
    )
    with pytest.raises(ValueError, match="unknown key 'update'"):
        read_budget(["update=7"])
    with pytest.raises(ValueError, match="updates must be >= 1"):
        read_budget(["updates=0"])


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
def test_budget_seconds_must_be_a_finite_positive_number(value):
    message = f"--budget: seconds must be a positive, finite number, got {float(value)}"
    with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
        read_budget([f"seconds={value}"])


def test_cli_reports_a_bad_budget_in_one_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "experiment",
            "table1",
            "--budget",
            "secs=3",
            "--out",
            str(tmp_path / "t1"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "aiayn experiment: error: --budget: unknown key 'secs'; valid keys: "
        "['max_tokens', 'preset', 'seconds', 'sentences', 'threads', 'updates']"
    ]
    assert not (tmp_path / "t1").exists()


def test_cli_report_only_on_an_empty_table_is_one_line_and_writes_nothing(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "experiment",
            "table3",
            "--report-only",
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "t3"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"aiayn experiment: error: {tmp_path / 't3' / 'results.json'} does not exist: "
        "no row of table3 has been measured there"
    ]
    assert not (tmp_path / "t3").exists() and not (tmp_path / "data").exists()


def test_cli_report_only_prepares_no_corpus_and_names_a_wrong_data_dir(tmp_path):
    """A report of a table measured on another --data is refused in one line, before the
    corpus would be prepared into the wrong directory."""
    (tmp_path / "t3").mkdir()
    budget = {"preset": "demo", "updates": 1000, "sentences": 200, "max_tokens": 1024}
    (tmp_path / "t3" / "results.json").write_text(
        json.dumps(
            {
                "experiment": "table3",
                "budget": budget,
                "inputs": {"data": "work/bible", "valid": "bundled"},
                "rows": [],
            }
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "experiment",
            "table3",
            "--report-only",
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "t3"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        f"aiayn experiment: error: {tmp_path / 't3' / 'results.json'} was measured with inputs"
    )
    assert str(tmp_path / "data") in line
    assert not (tmp_path / "data").exists()


# --- table1 -------------------------------------------------------------------------------------


def test_banded_restricted_attention_equals_the_masked_one():
    layers = table1.build_layers()
    x = torch.randn(2, 40, table1.D)
    with torch.no_grad():
        masked, banded = layers["restricted (mask)"](x), layers["restricted (banded)"](x)
        full = layers["self-attention"](x)
    torch.testing.assert_close(banded, masked, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(masked, full, atol=1e-3)  # the window does restrict


def test_peak_bytes_counts_the_live_tensors_of_a_forward():
    layer = torch.nn.Linear(512, 1024)
    peak = table1.peak_bytes(layer, torch.randn(1, 100, 512))
    assert peak == 100 * 1024 * 4  # the output is the only new tensor


@pytest.mark.parametrize(
    "kind, n, sequential, path",
    [
        ("self-attention", 1024, 1, 1),
        ("recurrent (LSTM)", 1024, 1024, 1023),
        ("convolutional", 27, 1, 3),
        ("convolutional", 28, 1, 4),
        ("restricted (banded)", 33, 1, 2),
    ],
)
def test_table1_sequential_operations_and_path_lengths(kind, n, sequential, path):
    assert table1.sequential_ops(kind, n) == sequential and table1.max_path_length(kind, n) == path


def test_crossover_interpolates_log_log():
    rows = [
        {"n": n, "layers": {"a": {"ms": a}, "b": {"ms": b}}}
        for n, a, b in ((256, 1.0, 2.0), (512, 4.0, 2.0))
    ]
    assert table1.crossover(rows, "a", "b") == pytest.approx(
        256 * 2**0.5
    )  # ratio 1/2 -> 2, crosses midway
    assert table1.crossover(rows[:1], "a", "b") is None


def test_table1_smoke_and_rerun(tmp_path, monkeypatch):
    figures = catch_figures(monkeypatch)
    budget = read_budget(["threads=1", "seconds=60"])
    result = run_rows(table1.plan(budget, tmp_path, lengths=[16, 32]), budget, tmp_path)
    assert [r["n"] for r in result["rows"]] == [16, 32]
    for row in result["rows"]:
        assert list(row["layers"]) == table1.KINDS
        assert _finite(v for layer in row["layers"].values() for v in layer.values())
        assert all(layer["ms"] > 0 and layer["peak_mb"] > 0 for layer in row["layers"].values())
    text = (tmp_path / "results.md").read_text()
    assert "| n | " + " | ".join(table1.KINDS) + " |" in text and "| 32 | " in text
    # the plot: each layer's time and memory against n, as measured
    time_ax, memory_ax = figures["table1.png"].axes
    for kind, times, memory in zip(table1.KINDS, time_ax.lines, memory_ax.lines):
        assert list(times.get_xdata()) == [16, 32] and times.get_label() == kind
        assert list(times.get_ydata()) == [r["layers"][kind]["ms"] for r in result["rows"]]
        mb = [max(r["layers"][kind]["peak_mb"], 1e-3) for r in result["rows"]]
        assert list(memory.get_ydata()) == mb
    assert_picture(tmp_path / "table1.png")
    _forbid(monkeypatch, table1, "measure")
    again = run_rows(table1.plan(budget, tmp_path, lengths=[16, 32]), budget, tmp_path)
    assert again["rows"] == result["rows"]


# --- training experiments --------------------------------------------------------------------------


def test_table3_rows_scale_the_papers_changes():
    got = table3.changes(ModelConfig.preset("demo"))
    assert list(got) == list(table3.PAPER)
    assert got["A-h1"][0] == {"h": 1, "d_k": 256, "d_v": 256} and got["A-h32"][0] == {
        "h": 16,
        "d_k": 16,
        "d_v": 16,
    }
    assert got["B-dk16"][0] == {"d_k": 16, "d_v": 64}
    assert [got[f"C-N{n}"][0]["N_enc"] for n in (2, 4, 8)] == [1, 2, 4]
    assert got["C-d1024"][0] == {"d_model": 512, "d_k": 128, "d_v": 128} and got["D-ls0.2"] == (
        {},
        {"eps_ls": 0.2},
    )


@pytest.mark.parametrize(
    "ours, base, paper, paper_base, lower, expected",
    [
        (5.0, 4.0, 5.29, 4.92, True, "worse/worse ✓"),
        (3.0, 4.0, 5.29, 4.92, True, "better/worse ✗"),
        (20.0, 21.0, 25.8, 25.8, False, "worse/same"),
        (22.0, 21.0, 26.0, 25.8, False, "better/better ✓"),
    ],
)
def test_table3_direction(ours, base, paper, paper_base, lower, expected):
    assert table3.direction(ours, base, paper, paper_base, lower) == expected


def test_table3_direction_within_seed_noise_is_same():
    assert table3.direction(4.4, 4.0, 5.29, 4.92, True, noise=0.5) == "same/worse"
    assert table3.direction(4.6, 4.0, 5.29, 4.92, True, noise=0.5) == "worse/worse ✓"


def _row(name, ppl, bleu, **variant):
    return {
        "name": name,
        "valid_ppl": ppl,
        "bleu": bleu,
        "params": 7.5e6,
        "tokens_per_s": 1e3,
        "variant": variant,
    }


def test_table3_report_judges_rows_against_the_seed_noise():
    rows = [
        _row("base", 40.0, 10.0),
        _row(table3.SEED_ROW, 42.0, 11.0, seed=2),
        _row("A-h1", 41.0, 12.0, h=1),
        _row("C-N2", 50.0, 8.0, N_enc=1, N_dec=1),
        _row("D-ls0.0", 30.0, 9.5),
    ]
    text = table3.report(rows)
    assert "differ by 2.00 in perplexity and 1.00 BLEU" in text
    assert (
        "| A-h1 |" in text and "| same/worse | better/worse ✗ |" in text
    )  # PPL +1 < 2; BLEU +2 > 1
    assert "| C-N2 |" in text and "| worse/worse ✓ | worse/worse ✓ |" in text
    assert "| D-ls0.0 |" in text and "| better/better ✓ | same/worse |" in text
    assert f"| {table3.SEED_ROW} | (not in the paper" in text and "| - | - |" in text
    assert "paper's way in 2, the other way in 0, and by less than the seed noise in 1" in text
    assert "not measured yet" in table3.report([rows[0], *rows[2:]])


@pytest.mark.slow
def test_table3_smoke_and_rerun(corpus, tmp_path, monkeypatch):
    figures = catch_figures(monkeypatch)
    budget = read_budget(TINY)
    result = run_experiment("table3", tmp_path, budget, corpus=corpus)
    rows = result["rows"]
    # C-N4 scales to C-N2's one layer at preset tiny: left out (a warning says so)
    expected = ["base", table3.SEED_ROW, *(n for n in list(table3.PAPER)[1:] if n != "C-N4")]
    assert [r["name"] for r in rows] == expected
    assert rows[1]["variant"]["seed"] == 2 and rows[1]["valid_ppl"] != rows[0]["valid_ppl"]
    for r in rows:
        assert r["updates"] == 2 and _finite([r["valid_ppl"], r["bleu"], r["tokens_per_s"]])
        model = {k: v for k, v in r["variant"].items() if k not in ("eps_ls", "seed")}
        built = Transformer(ModelConfig.preset("tiny", vocab_size=300, **model))
        assert r["params"] == sum(p.numel() for p in built.parameters())  # tied: counted once
    assert next(r for r in rows if r["name"] == "D-ls0.2")["eps_ls"] == 0.2
    table = (tmp_path / "results.md").read_text()
    assert "| row | paper change | our change | params (M) |" in table and table.count("\n| ") == 21
    assert "| A-h1 | h=1 d_k=512 d_v=512 | h=1 d_k=32 d_v=32 |" in table
    # the plot: each change against base, ours (y) for the paper's (x), in percent
    base = rows[0]
    changed = [r for r in rows if r["name"] in table3.PAPER and r is not base]
    for ax, key in zip(figures["table3.png"].axes, ("valid_ppl", "bleu")):
        points = [tuple(c.get_offsets()[0]) for c in ax.collections]
        ours = [100 * (r[key] / base[key] - 1) if base[key] else 0.0 for r in changed]
        assert [y for _, y in points] == pytest.approx(ours)
    assert_picture(tmp_path / "table3.png")
    _forbid(monkeypatch, training, "train_row")
    assert run_experiment("table3", tmp_path, budget, corpus=corpus)["rows"] == rows


def test_scaling_smoke(corpus, tmp_path, monkeypatch):
    figures = catch_figures(monkeypatch)
    rows = run_experiment("scaling", tmp_path, read_budget(TINY), corpus=corpus)["rows"]
    assert [r["name"] for r in rows] == [
        "d_k=8 scaled",
        "d_k=8 unscaled",
        "d_k=32 scaled",
        "d_k=32 unscaled",
    ]
    assert [(r["model"]["h"], r["model"]["scale_attention"]) for r in rows] == [
        (4, True),
        (4, False),
        (1, True),
        (1, False),
    ]
    assert all(_finite([r["valid_ppl"], r["bleu"]]) for r in rows)
    ratio = rows[1]["valid_ppl"] / rows[0]["valid_ppl"]
    assert (
        f"| d_k=8 unscaled | 4 | {rows[1]['valid_ppl']:.3g} | {rows[1]['bleu']:.3g} | {ratio:.3g} |"
        in (tmp_path / "results.md").read_text()
    )
    for ax, key in zip(figures["scaling.png"].axes, ("valid_ppl", "bleu")):  # a bar a row
        assert [bar.get_height() for bar in ax.patches] == [r[key] for r in rows]
    assert_picture(tmp_path / "scaling.png")


@pytest.mark.slow
def test_restricted_smoke(corpus, tmp_path, monkeypatch):
    figures = catch_figures(monkeypatch)
    rows = run_experiment("restricted", tmp_path, read_budget(TINY), corpus=corpus)["rows"]
    assert [r["name"] for r in rows] == ["r=1", "r=2", "r=4", "r=8", "r=16", "full"]
    assert [r["model"]["attention_window"] for r in rows] == [1, 2, 4, 8, 16, None]
    assert all(
        _finite([r["valid_ppl"], r["bleu"], r["tokens_per_s"], r["decode_sent_per_s"]])
        for r in rows
    )
    for ax, key in zip(figures["restricted.png"].axes, ("valid_ppl", "bleu")):  # a point a row
        assert list(ax.lines[0].get_ydata()) == [r[key] for r in rows]
    assert_picture(tmp_path / "restricted.png")


def test_low_resource_trains_on_nested_subsets(corpus, tmp_path):
    rows = run_experiment("low-resource", tmp_path, read_budget(TINY), corpus=corpus)["rows"]
    n = len(
        TokenDataset(corpus.data, "train")
    )  # 158: the tiny corpus keeps pairs of <= 48 subwords
    assert [(r["name"], r["pairs"]) for r in rows] == [
        ("10%", 16),
        ("25%", 40),
        ("50%", 79),
        ("100%", n),
    ]
    subsets = [TokenDataset(tmp_path / f"data/{f}", "train") for f in ("0.10", "0.25")]
    small = {tuple(subsets[0].src(i)) for i in range(len(subsets[0]))}
    assert small <= {tuple(subsets[1].src(i)) for i in range(len(subsets[1]))}
    assert rows[0]["epochs"] > rows[-1]["epochs"] > 0 and _finite([r["bleu"] for r in rows])


def test_extrapolation_trains_short_and_scores_long(corpus, tmp_path):
    rows = run_experiment("extrapolation", tmp_path, read_budget(TINY), corpus=corpus)["rows"]
    assert [r["name"] for r in rows] == ["sinusoidal", "learned"]
    L = rows[0]["L"]
    train = TokenDataset(tmp_path / f"data/max{L}", "train")
    assert (
        max(np.maximum(train.src_lens, train.tgt_lens))
        <= L
        < max(TokenDataset(corpus.data, "train").src_lens)
    )
    for r in rows:
        assert [b["bucket"] for b in r["buckets"]][:2] == ["(0L, 1L]", "(1L, 1.5L]"]
        assert all(0 < b["sentences"] <= 3 and _finite([b["ppl"], b["bleu"]]) for b in r["buckets"])
    assert "| sinusoidal | (0L, 1L] |" in (tmp_path / "results.md").read_text()


# --- heads ------------------------------------------------------------------------------------------


def test_head_statistics_by_hand():
    n = 4
    w = torch.stack(
        [torch.eye(n), torch.eye(n).roll(1, dims=0), torch.full((n, n), 1 / n)]
    )  # (3, n, n)
    w[1, 0] = torch.tensor([1.0, 0, 0, 0])  # query 0 has no previous token: it looks at itself
    stats = head_statistics(w, punctuation=torch.tensor([False, True, False, False]))
    assert stats["itself"].tolist() == [4.0, 1.0, 1.0]
    assert stats["previous"].tolist() == [0.0, 3.0, 0.75]
    assert stats["next"].tolist() == [0.0, 0.0, 0.75]
    assert stats["punctuation"].tolist() == [1.0, 1.0, 1.0]
    assert stats["eos"].tolist() == [1.0, 0.0, 1.0]
    assert stats["distance"].tolist() == [
        0.0,
        3.0,
        5.0,
    ]  # uniform: (0+1+2+3)+(1+0+1+2)+(2+1+0+1)+(3+2+1+0) / 4
    assert stats["entropy"][:2].tolist() == [0.0, 0.0]
    assert stats["entropy"][2].item() == pytest.approx(n * math.log(n))
    assert set(stats) == {"previous", "next", "itself", "punctuation", "eos", "distance", "entropy"}


def test_punctuation_pieces():
    assert [is_punctuation(p) for p in ("▁,", ".", "»;", "▁", "▁and", "a.")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]


def test_heads_smoke(corpus, tmp_path):
    from aiayn.train import TrainConfig
    from aiayn.train.trainer import Trainer

    cfg = TrainConfig(
        data=str(corpus.data),
        out=str(tmp_path / "run"),
        preset="tiny",
        max_src_tokens=400,
        max_tgt_tokens=400,
        max_updates=2,
        save_every_minutes=None,
        validate=False,
        num_threads=1,
    )
    checkpoint = Trainer(cfg).run()["checkpoint"]
    out = tmp_path / "heads"
    result = run_experiment(
        "heads", out, read_budget(["sentences=5"]), checkpoint=checkpoint, valid=corpus.valid
    )
    assert [r["name"] for r in result["rows"]] == ["layer 1", "layer 2"]
    for r in result["rows"]:
        assert r["sentences"] == 5 and [h["head"] for h in r["heads"]] == [1, 2, 3, 4]
        for h in r["heads"]:
            assert 0 <= h["previous"] + h["next"] + h["itself"] <= 1 + 1e-5
            assert 0 <= h["entropy"] <= r["uniform"]["entropy"] + 1e-5  # at most log n per query
    assert result["plots"] == ["heads_shares.png", "heads_lines.png"]
    for name in result["plots"]:
        assert_picture(out / name)
    assert json.loads((out / "results.json").read_text())["inputs"]["checkpoint"] == checkpoint


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_experiment_stopped_by_a_signal_says_how_to_resume_in_one_line(
    tmp_path, capsys, monkeypatch, signum, code
):
    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler runs before this ends
        raise AssertionError("the signal did not stop the experiment")

    monkeypatch.setattr("aiayn.experiments.run_experiment", signalled)
    out = tmp_path / "heads"
    argv = ["experiment", "heads", "--checkpoint", tmp_path, "--out", out]
    got, _, err = run_cli(capsys, *argv)
    assert got == code
    assert err.splitlines() == [
        f"aiayn experiment: stopped by {signal.Signals(signum).name}; re-running the same "
        f"command resumes: {out / 'results.json'} keeps finished rows"
    ]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_table3_leaves_out_a_row_that_scaling_makes_another_rows_configuration():
    def variants(preset):
        base = ModelConfig.preset(preset)
        rows = table3.changes(base)
        return base, {name: ({"P_drop": 0.1, **m}, t) for name, (m, t) in rows.items()}

    base, tiny = variants("tiny")
    with pytest.warns(UserWarning) as caught:
        kept = table3.distinct(base, tiny, "tiny")
    assert set(tiny) - set(kept) == {"C-N4"}  # 1 layer, as C-N2: one result, not two
    assert [str(w.message) for w in caught] == [
        "table3: row C-N4 is the configuration of row C-N2 at preset tiny "
        "(P_drop=0.1 N_enc=1 N_dec=1); left out"
    ]
    base, demo = variants("demo")
    assert table3.distinct(base, demo, "demo") == demo  # every row its own model
