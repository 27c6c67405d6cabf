"""The package as a user gets it: bundled data found as package data, bundled recipes by name,
and a built wheel that runs the pipeline from a directory outside the checkout."""

import importlib.util
import json
import os
import site
import subprocess
import sys
import tarfile
import zipfile
from importlib import resources
from pathlib import Path

import pytest

import aiayn
from aiayn.data import bundled_corpus_paths
from aiayn.train import load_train_config
from aiayn.train.config import bundled_configs

ROOT = Path(__file__).resolve().parents[1]
CORPUS = [
    f"corpus/bible/{split}.{side}.gz"
    for split in ("train", "valid", "test")
    for side in ("en", "es", "ref")
]
PACKAGE_DATA = [
    "py.typed",
    "corpus/bible/README.md",
    *CORPUS,
    "configs/wmt14-base.yaml",
    "configs/wmt14-big.yaml",
    "configs/wmt14-enfr-base.yaml",
    "configs/wmt14-enfr-big.yaml",
    "configs/parsing-sample.yaml",
]


def test_bundled_corpus_is_package_data_of_the_imported_package():
    root = Path(str(resources.files("aiayn") / "corpus" / "bible"))
    assert root.parent.parent == Path(aiayn.__file__).parent
    assert bundled_corpus_paths()["train"] == (root / "train.en.gz", root / "train.es.gz")
    assert bundled_corpus_paths("es", "en")["test"] == (root / "test.es.gz", root / "test.en.gz")
    assert "Licence" in (root / "README.md").read_text(encoding="utf-8")


def test_bundled_recipes_load_by_name_and_a_file_on_disk_wins(tmp_path, monkeypatch):
    assert sorted(bundled_configs()) == [
        "demo",
        "parsing-sample",
        "wmt14-base",
        "wmt14-big",
        "wmt14-enfr-base",
        "wmt14-enfr-big",
    ]
    wmt = load_train_config("wmt14-base", ["keep_last=8"])
    assert (wmt.preset, wmt.data, wmt.max_src_tokens, wmt.tokens_per_update, wmt.keep_last) == (
        "base",
        "work/wmt14-ende",
        3200,
        25000,
        8,
    )
    parsing = load_train_config("parsing-sample")
    assert (parsing.preset, parsing.model["norm"], parsing.max_minutes) == (
        "parsing-cpu",
        "pre",
        30,
    )
    monkeypatch.chdir(tmp_path)
    Path("wmt14-base").write_text("preset: tiny\n")
    with pytest.raises(
        ValueError, match="wmt14-base: config files are .yaml"
    ):  # the user's file, not ours
        load_train_config("wmt14-base")
    with pytest.raises(
        FileNotFoundError,
        match="no bundled config of that name .bundled: demo, parsing-sample, wmt14",
    ):
        load_train_config("wmt14-huge")


def test_unknown_recipe_is_one_clear_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-m", "aiayn", "train", "wmt14-bigg"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "aiayn train: error: wmt14-bigg: no such config file, and no bundled config of that name "
        "(bundled: demo, parsing-sample, wmt14-base, wmt14-big, wmt14-enfr-base, wmt14-enfr-big)"
    ]


def _run(cmd: list, cwd: Path, env: dict, stdin: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, input=stdin, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result


def _build(dist: Path) -> tuple[Path, Path]:
    """sdist, then the wheel from the sdist (as `python -m build` does), offline: the wheel can
    only hold what the sdist carried, and no stale build/ directory of the checkout leaks in."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
            dist,
        ],
        ROOT,
        env,
    )
    (sdist,) = dist.glob("aiayn-*.tar.gz")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            sdist,
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            dist,
        ],
        dist,
        env,
    )
    (wheel,) = dist.glob("aiayn-*.whl")
    return sdist, wheel


def _venv_reusing_installed_packages(venv: Path, env: dict) -> Path:
    """A fresh virtualenv that sees this environment's packages (torch, sentencepiece, pip...)
    through a .pth file, so nothing is downloaded. A .pth line only adds a directory to
    sys.path (the .pth files inside it are not run), so an editable aiayn here stays invisible."""
    _run([sys.executable, "-m", "venv", "--without-pip", venv], venv.parent, env)
    python = venv / "bin" / "python"
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], venv.parent, env
    )
    Path(purelib.stdout.strip(), "reuse-test-env.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n"
    )
    return python


@pytest.mark.slow
def test_wheel_runs_prepare_train_translate_info_from_any_directory(tmp_path):
    dist = tmp_path / "dist"
    dist.mkdir()
    sdist, wheel = _build(dist)
    in_sdist = tarfile.open(sdist).getnames()
    top = f"{sdist.name.removesuffix('.tar.gz')}/"
    for name in [
        *(f"src/aiayn/{p}" for p in PACKAGE_DATA),
        "tests/test_package.py",
        "README.md",
        "MANIFEST.in",
    ]:
        assert top + name in in_sdist, name
    in_wheel = zipfile.ZipFile(wheel).namelist()
    assert all(f"aiayn/{p}" in in_wheel for p in PACKAGE_DATA)
    for name in in_sdist + in_wheel:
        assert not any(
            part in {"runs", "work", ".venv", "__pycache__", "build", "dist"}
            for part in Path(name).parts[1:]
        ), name
        assert not name.endswith(".pyc"), name
    assert not any(name.startswith(("tests/", "configs/", "data/")) for name in in_wheel)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    python = _venv_reusing_installed_packages(tmp_path / "venv", env)
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            "-q",
            wheel,
        ],
        tmp_path,
        env,
    )
    aiayn_cmd = tmp_path / "venv" / "bin" / "aiayn"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(
        [
            python,
            "-c",
            "import aiayn.data, aiayn.train.config as c; "
            "print(aiayn.__file__); print(aiayn.data.bundled_corpus_paths()['train'][0]); "
            "print(c.find_config('wmt14-base'))",
        ],
        elsewhere,
        env,
    ).stdout.splitlines()
    installed = tmp_path / "venv" / "lib"
    assert all(Path(p).is_relative_to(installed) for p in where), where

    prep = _run(
        [aiayn_cmd, "prepare", "--bundled", "--out", "work/bible", "--vocab-size", "500"],
        elsewhere,
        env,
    )
    meta = json.loads((elsewhere / "work/bible/meta.json").read_text())
    assert {s: meta["splits"][s]["read"] for s in ("train", "valid", "test")} == {
        "train": 27959,
        "valid": 1403,
        "test": 1523,
    }
    assert json.loads(prep.stdout)["vocab_size"] == 500
    assert f"aiayn prepare: wrote {elsewhere / 'work/bible'}" in prep.stderr

    train = _run(
        [
            aiayn_cmd,
            "train",
            "--set",
            "preset=tiny",
            "--set",
            "data=work/bible",
            "--set",
            "out=runs/tiny",
            "--set",
            "max_updates=3",
            "--set",
            "warmup=1",
            "--set",
            "validate=false",
            "--set",
            "max_src_tokens=500",
            "--set",
            "max_tgt_tokens=500",
            "--device",
            "cpu",
        ],
        elsewhere,
        env,
    )
    summary = json.loads(train.stdout)
    checkpoint = elsewhere / "runs/tiny/checkpoints/update_0000003"
    assert summary["updates"] == 3 and Path(summary["checkpoint"]).resolve() == checkpoint
    assert (checkpoint / "model.safetensors").is_file()
    assert f"aiayn train: wrote {elsewhere / 'runs/tiny'}" in train.stderr

    line = "In the beginning God created the heavens and the earth.\n"
    out = _run(
        [
            aiayn_cmd,
            "translate",
            "--checkpoint",
            "runs/tiny/checkpoints/update_0000003",
            "--beam",
            "1",
        ],
        elsewhere,
        env,
        stdin=line,
    )
    assert len(out.stdout.splitlines()) == 1
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnx"):
        _onnx_export_decodes_as_ours(aiayn_cmd, elsewhere, env)

    info = _run([aiayn_cmd, "info", "--presets"], elsewhere, env)
    rows = {line.split()[0]: line.split() for line in info.stdout.splitlines() if line.strip()}
    assert rows["base"][8:10] == ["63.1M", "65M"] and rows["tiny"][1:3] == ["2", "32"]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["runs", "work"]


def _onnx_export_decodes_as_ours(aiayn_cmd: Path, cwd: Path, env: dict) -> None:
    """From the installed wheel: ``aiayn export --to onnx``, then ``--engine onnxruntime`` on
    the export gives our 4-best lists, log-probabilities within 1e-4 (the extra's packages
    come from this environment). The model is ``trained_like_model`` on the wheel's
    vocabulary: a model trained for 3 updates ties its hypotheses, which float rounding orders."""
    from _export_models import trained_like_model

    from aiayn.checkpoint import save_checkpoint
    from aiayn.config import to_dict
    from aiayn.data import Vocab

    vocab = Vocab.load(cwd / "work/bible/spm.model")
    model = trained_like_model(len(vocab))
    meta = {"model_config": to_dict(model.cfg)}
    ckpt = str(save_checkpoint(cwd / "runs/seeded", 1, model, meta, None, vocab.path))
    _run(
        [aiayn_cmd, "export", "--checkpoint", ckpt, "--to", "onnx", "--out", "runs/onnx"], cwd, env
    )
    lines = "In the beginning God created the heavens and the earth.\nAnd God said.\nLight.\n"
    nbest = ["--nbest", "4", "--format", "jsonl", "--workers", "1"]
    found = []
    for given in ([ckpt], ["runs/onnx", "--engine", "onnxruntime"]):
        out = _run([aiayn_cmd, "translate", "--checkpoint", *given, *nbest], cwd, env, stdin=lines)
        found.append([json.loads(line)["hypotheses"] for line in out.stdout.splitlines()])
    ours, theirs = found
    assert len(ours) == 3 and all(len(hyps) == 4 for hyps in ours)
    assert len({hyps[0]["text"] for hyps in ours}) == 3  # not one string repeated
    assert [[h["text"] for h in x] for x in theirs] == [[h["text"] for h in x] for x in ours]
    apart = [abs(a["log_prob"] - b["log_prob"]) for x, y in zip(ours, theirs) for a, b in zip(x, y)]
    assert max(apart) <= 1e-4
