"""docs/data.md, "from your two files to a served model", run: every ``aiayn`` command of its
shell blocks, in the page's order, on tiny files and with tiny sizes, each succeeding."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _cli import TINY, run_cli
from test_data_corpus import distinct_pairs
from test_docs import fenced_blocks

import aiayn

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "data.md"
# the page's sizes, made tiny; a training run is two updates of a 1+1-layer model
TINY_VALUES = {"--valid-size": "20", "--test-size": "20"}
TINY_TRAINING = [
    "max_updates=2",
    "save_every_updates=1",
    "preset=tiny",
    "valid_bleu_sentences=4",
    *(f"model.{k}={v}" for k, v in TINY.items()),
]


def guide_commands() -> list[list[str]]:
    """The ``aiayn`` commands of the page's ``sh`` blocks, as argument lists."""
    text = GUIDE.read_text(encoding="utf-8")
    found = []
    for start, lines in fenced_blocks(text):
        if text.splitlines()[start].strip() != "```sh":
            continue
        found += [shlex.split(line) for line in lines if line.startswith("aiayn ")]
    return found


def tiny(argv: list[str]) -> list[str]:
    argv = [TINY_VALUES.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    if argv[1] == "prepare":
        argv += ["--vocab-size", "120", "--quiet"]
    if argv[1] == "train":
        argv += [a for s in TINY_TRAINING for a in ("--set", s)]
    return argv


def write_inputs(root: Path) -> None:
    """Every file the page's commands read: a 300-pair corpus, the corpora of its data spec
    (the YAML block of the page itself), and monolingual German."""
    pairs = distinct_pairs(420, seed=11)

    def pair_files(name: str, chosen: list[tuple[str, str]]) -> None:
        (root / f"{name}.en").write_text("".join(s + "\n" for s, _ in chosen), encoding="utf-8")
        (root / f"{name}.de").write_text("".join(t + "\n" for _, t in chosen), encoding="utf-8")

    pair_files("corpus", pairs[:300])
    pair_files("europarl", pairs[300:360])
    pair_files("dev", pairs[360:380])
    pair_files("mono", pairs[380:400])  # mono.en: replaced by the back-translation
    with gzip.open(root / "crawl.tsv.gz", "wt", encoding="utf-8") as f:
        f.write("".join(f"{s}\t{t}\n" for s, t in pairs[400:]))
    units = "".join(
        f'<tu><tuv xml:lang="en"><seg>{s}</seg></tuv><tuv xml:lang="de"><seg>{t}</seg></tuv></tu>'
        for s, t in pairs[:10]
    )
    (root / "memory.tmx").write_text(f'<tmx version="1.4"><header/><body>{units}</body></tmx>')
    text = GUIDE.read_text(encoding="utf-8")
    (yaml_block,) = [
        lines for start, lines in fenced_blocks(text) if text.splitlines()[start] == "```yaml"
    ]
    (root / "data.yaml").write_text("\n".join(yaml_block) + "\n")


def serve_answers(argv: list[str]) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(aiayn.__file__).parents[1])}
    cmd = [sys.executable, "-m", "aiayn", *argv[1:], "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    return json.loads(r.read())
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"aiayn serve did not answer (exit status {proc.poll()})")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow  # end to end: about 10 s
def test_every_command_of_the_guide_runs(tmp_path, capsys, monkeypatch):
    commands = guide_commands()
    assert [c[1] for c in commands[:6]] == [
        "prepare",
        "train",
        "average",
        "evaluate",
        "translate",
        "serve",
    ]
    write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    for argv in map(tiny, commands):
        if argv[1] == "serve":
            assert serve_answers(argv)
            continue
        redirect = argv[argv.index(">") + 1] if ">" in argv else None
        argv = argv[: argv.index(">")] if redirect else argv
        code, out, err = run_cli(capsys, *argv[1:])
        assert code == 0, (argv, err)
        if redirect:
            Path(redirect).write_text(out, encoding="utf-8")
    meta = json.loads(Path("work/ende/meta.json").read_text())
    assert meta["record"] == {"src_lang": "en", "tgt_lang": "de"}
    assert json.loads(Path("runs/ende/config.json").read_text())["valid_bleu_lang"] == "de"
    bt = json.loads(Path("work/ende-bt/meta.json").read_text())["splits"]["train"]["corpora"]
    assert [c["name"] for c in bt] == ["europarl", "crawl", "memory", "bt"]
    assert bt[-1]["back_translated"] and bt[1]["weight"] == 0.5
    assert len(Path("mono.en").read_text().splitlines()) == 20  # one sample per German line
