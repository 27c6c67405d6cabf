"""`aiayn compare`: its scores, intervals and p-values are sacrebleu's command line's on the same
files, runs add their configuration differences and validation curves, and every mistake is
one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import one_line_error, run_cli
from _pictures import assert_picture

from aiayn.analysis import compare as compare_module
from aiayn.files import read_lines

BUNDLED_TEST = Path(__file__).resolve().parents[1] / "src/aiayn/corpus/bible/test.es.gz"
LINES = 120  # enough lines for the tests to mean something, few enough for TER


def _drop(line: str, every: int) -> str:
    """A worse translation: every ``every``-th word left out."""
    words = line.split()
    return " ".join(w for i, w in enumerate(words) if i % every != every - 1)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A reference file (the bundled test split's first lines) and two systems: one close to
    it, one further, each with its own damage."""
    root = tmp_path_factory.mktemp("compare")
    refs = read_lines(BUNDLED_TEST)[:LINES]
    paths = {"ref": root / "ref.es", "base": root / "base.es", "other": root / "other.es"}
    paths["ref"].write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    paths["base"].write_text("".join(_drop(r, 7) + "\n" for r in refs), encoding="utf-8")
    worse = [_drop(r, 3) if i % 2 else _drop(r, 9) for i, r in enumerate(refs)]
    paths["other"].write_text("".join(h + "\n" for h in worse), encoding="utf-8")
    return paths


def _sacrebleu_cli(files: dict[str, Path], test: str) -> str:
    """``sacrebleu REF -i BASE OTHER --paired-bs|--paired-ar -m bleu chrf ter``, 4 decimals."""
    argv = [sys.executable, "-m", "sacrebleu", str(files["ref"]), "-i"]
    argv += [str(files["base"]), str(files["other"]), f"--paired-{test}"]
    argv += ["-m", "bleu", "chrf", "ter", "-f", "text", "--width", "4", "-q"]
    found = subprocess.run(argv, capture_output=True, text=True, check=True)
    return found.stdout


@pytest.mark.slow
def test_compare_is_sacrebleus_paired_bootstrap_and_randomization(files, capsys):
    """The goal: the same scores, intervals and p-values as `sacrebleu --paired-bs` (and the
    p-values of `--paired-ar`) on the same files, with sacrebleu's default seed."""
    code, out, err = run_cli(
        capsys, "compare", files["base"], files["other"], "--ref", files["ref"], "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    ours = [s["scores"] for s in report["systems"]]
    metrics = ["BLEU", "chrF2", "TER"]
    assert list(ours[0]) == metrics
    # sacrebleu prints "score (mean ± ci)" per system and metric, and "(p = ...)" under each
    # system after the baseline, all rounded to --width 4
    bs = _sacrebleu_cli(files, "bs")
    triples = re.findall(r"(-?\d+\.\d{4}) \((-?\d+\.\d{4}) ± (\d+\.\d{4})\)", bs)
    assert len(triples) == 6, bs
    expected = [tuple(map(float, t)) for t in triples]
    found = [
        (round(s[m]["score"], 4), round(s[m]["mean"], 4), round(s[m]["ci"], 4))
        for s in ours
        for m in metrics
    ]
    assert found == expected
    p_bs = [float(p) for p in re.findall(r"p = (\d\.\d{4})", bs)]
    assert [round(ours[1][m]["p_bootstrap"], 4) for m in metrics] == p_bs
    p_ar = [float(p) for p in re.findall(r"p = (\d\.\d{4})", _sacrebleu_cli(files, "ar"))]
    assert [round(ours[1][m]["p_ar"], 4) for m in metrics] == p_ar
    assert ours[1]["BLEU"]["delta"] == pytest.approx(
        ours[1]["BLEU"]["score"] - ours[0]["BLEU"]["score"]
    )
    assert ours[1]["BLEU"]["delta"] < 0 and ours[1]["TER"]["delta"] > 0  # worse both ways
    assert "|bs:1000|seed:12345|" in report["signatures"]["BLEU"]


@pytest.mark.slow
def test_the_table_shows_the_difference_p_values_and_wins(files, capsys):
    code, out, _ = run_cli(
        capsys, "compare", files["base"], files["other"], "--ref", files["ref"],
        "--metrics", "bleu", "chrf", "--sentence-metric", "bleu",
    )  # fmt: skip
    assert code == 0
    code, raw, _ = run_cli(
        capsys, "compare", files["base"], files["other"], "--ref", files["ref"],
        "--metrics", "bleu", "chrf", "--sentence-metric", "bleu", "--json",
    )  # fmt: skip
    report = json.loads(raw)
    bleu = report["systems"][1]["scores"]["BLEU"]
    line = next(x for x in out.splitlines() if x.startswith("  vs baseline"))
    assert f"{bleu['delta']:+.2f} p = {bleu['p_bootstrap']:.4f} / {bleu['p_ar']:.4f}" in line
    assert "TER" not in out and report["sentence_metric"] == "BLEU"
    wins = report["systems"][1]["sentences"]
    assert sum(wins.values()) == LINES and wins["losses"] > wins["wins"]
    assert f"{files['other']}  {wins['wins']} / {wins['losses']} / {wins['ties']}" in out


def _run(root: Path, name: str, hyps: Path, config: dict, valid: list[tuple[int, float, float]]):
    """A training run's directory as aiayn train and evaluate leave it."""
    run = root / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config), encoding="utf-8")
    log = [{"update": 10, "loss": 5.0, "elapsed_s": 3.0}]
    log += [
        {"update": u, "elapsed_s": 60.0 * m, "valid_ppl": p, "valid_bleu": p / 10}
        for u, m, p in valid
    ]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log), encoding="utf-8")
    (run / "test.hyp.es").write_bytes(hyps.read_bytes())
    return run


@pytest.mark.slow  # end to end: about 10 s
def test_runs_show_their_differences_and_one_chart_of_their_curves(
    files, tmp_path, capsys, monkeypatch
):
    base = {"out": "runs/a", "seed": 1, "model": {"P_drop": 0.0, "h": 4}, "amp": "auto"}
    other = {"out": "runs/b", "seed": 2, "model": {"P_drop": 0.1, "h": 4}, "amp": "auto"}
    a = _run(tmp_path, "a", files["base"], base, [(100, 1.0, 80.0), (200, 2.0, 40.0)])
    b = _run(tmp_path, "b", files["other"], other, [(90, 1.0, 90.0), (180, 2.0, 50.0)])
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to read its lines
    chart = tmp_path / "curves.png"
    argv = ["compare", a, b, "--ref", files["ref"], "--metrics", "bleu", "--chart", chart]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    keys = [
        line.split()[0] for line in out.split("differ in (config.json):\n")[1].splitlines()[1:3]
    ]
    assert keys == ["model.P_drop", "seed"]  # out is where, not what: left out
    assert re.search(r"model\.P_drop\s+0\.0\s+0\.1", out)
    assert_picture(chart)
    (fig,) = figures
    ppl_updates, ppl_minutes, bleu_updates, _ = fig.axes[:4]
    assert [list(line.get_xdata()) for line in ppl_updates.lines] == [[100, 200], [90, 180]]
    assert [list(line.get_ydata()) for line in ppl_minutes.lines] == [[80.0, 40.0], [90.0, 50.0]]
    assert list(bleu_updates.lines[0].get_ydata()) == [8.0, 4.0]
    assert [line.get_label() for line in ppl_updates.lines] == [str(a), str(b)]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    code, out, _ = run_cli(capsys, "compare", a, b, "--ref", files["ref"], "--metrics", "bleu")
    assert "--chart FILE.png draws" in out and not (tmp_path / "compare.png").exists()


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["{base}"], ["at least 2 systems", "got 1"]),
        (["{base}", "{missing}"], ["missing.es: no such file"]),
        (["{base}", "{short}"], ["short.es has 3 lines but", "has 120"]),
        (["{base}", "{base}"], ["again: give each system once"]),
        (["{base}", "{other}", "--chart", "{chart}"], ["--chart draws runs'"]),
        (["{base}", "{emptydir}"], ["without config.json: not a training run"]),
        (["{base}", "{nohyps}"], ["holds no test hypotheses", "aiayn evaluate"]),
        (["{base}", "{other}", "--bootstrap", "1"], ["must be >= 2"]),
    ],
)
def test_mistakes_are_one_line(files, tmp_path, capsys, argv, needles):
    short = tmp_path / "short.es"
    short.write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "emptydir").mkdir()
    nohyps = tmp_path / "nohyps"
    nohyps.mkdir()
    (nohyps / "config.json").write_text("{}")
    (nohyps / "log.jsonl").write_text("")
    names = {**{k: str(v) for k, v in files.items()}, "short": str(short)}
    names |= {"missing": str(tmp_path / "missing.es"), "chart": str(tmp_path / "c.png")}
    names |= {"emptydir": str(tmp_path / "emptydir"), "nohyps": str(nohyps)}
    code, _, err = run_cli(
        capsys, "compare", *[a.format(**names) for a in argv], "--ref", files["ref"]
    )
    assert code == 2
    if "--bootstrap" in argv:  # argparse's own one line
        assert "must be >= 2" in err
        return
    one_line_error(err, "aiayn compare: error:", *needles)
    assert not (tmp_path / "c.png").exists()


def test_the_chart_is_never_written_over_an_input(files, tmp_path, capsys):
    run = _run(tmp_path, "a", files["base"], {"seed": 1}, [(100, 1.0, 80.0)])
    code, _, err = run_cli(
        capsys, "compare", run, files["other"], "--ref", files["ref"], "--chart", files["ref"],
        "--metrics", "bleu",
    )  # fmt: skip
    one_line_error(err, "--chart", "is the input")
    assert read_lines(files["ref"])[0] == read_lines(BUNDLED_TEST)[0]


def test_config_differences_flatten_and_mark_missing_keys(tmp_path):
    runs = []
    for i, config in enumerate([{"a": 1, "m": {"x": 1}}, {"a": 1, "m": {"x": 2}, "new": True}]):
        run = tmp_path / str(i)
        run.mkdir()
        (run / "config.json").write_text(json.dumps(config))
        runs.append(run)
    assert compare_module.config_differences(runs) == {"m.x": [1, 2], "new": [None, True]}
