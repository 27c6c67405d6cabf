"""Every example of docs/python.md, and the README's Python snippet, runs, in the page's order and in one namespace (as a reader
pastes them one after another), from a directory laid out as the page says: a trained run at
``runs/demo`` (the tiny model: ``averaged`` is its latest checkpoint) and text files in
``corpus/``. A page example that stops working fails here, not in a reader's hands."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from aiayn.checkpoint import latest_checkpoint

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "python.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page: Path = PAGE) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def demo_run_at(where: Path, tiny_run: Path) -> None:
    """``runs/demo`` under ``where`` as the docs name it: the tiny run, ``averaged`` its latest
    checkpoint."""
    demo = where / "runs" / "demo"
    demo.mkdir(parents=True)
    (demo / "checkpoints").symlink_to(tiny_run / "checkpoints")
    (demo / "averaged").symlink_to(latest_checkpoint(tiny_run / "checkpoints"))


def test_the_page_has_an_example_for_each_entry_point():
    code = "\n".join(python_blocks())
    for name in (
        "Translator(",
        ".translate(",
        "nbest=",
        ".translate_file(",
        ".stream(",
        ".stream_document(",
        ".score(",
        "prepare(",
        "train_model(",
    ):
        assert name in code, name


@pytest.mark.slow  # end to end: about 10 s
def test_every_example_on_the_page_runs(tiny_run, tiny_corpus, tmp_path, monkeypatch, one_thread):
    demo_run_at(tmp_path, tiny_run)
    (tmp_path / "corpus").mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "es"):
            (tmp_path / "corpus" / f"{split}.{lang}").symlink_to(
                tiny_corpus.parent / f"{split}.{lang}"
            )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_python"}
    printed = io.StringIO()
    for i, block in enumerate(python_blocks()):
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"docs/python.md block {i + 1}", "exec"), namespace)
    # what the examples made is there: the file translated, a dataset and a trained run
    assert len((tmp_path / "test.hyp.es").read_text(encoding="utf-8").splitlines()) == 40
    assert (tmp_path / "work" / "mine" / "meta.json").is_file()
    assert namespace["run"].summary["updates"] == 2
    assert "40 lines translated" in printed.getvalue()


def test_the_readmes_python_snippet_prints_a_translation_and_its_score(
    tiny_run, tmp_path, monkeypatch, one_thread
):
    [block] = python_blocks(ROOT / "README.md")
    demo_run_at(tmp_path, tiny_run)
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    # one line: the translation's text, then its score (a log-probability over a length: < 0)
    [line] = printed.getvalue().splitlines()
    text, score = line.rsplit(" ", 1)
    assert text.strip() and float(score) < 0
