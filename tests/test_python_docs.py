"""Every example of docs/python.md runs, in the page's order and in one namespace (as a reader
pastes them one after another), from a directory laid out as the page says: a trained run at
``runs/demo`` (the tiny model: ``averaged`` is its latest checkpoint) and text files in
``corpus/``. A page example that stops working fails here, not in a reader's hands."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from aiayn.checkpoint import latest_checkpoint

PAGE = Path(__file__).resolve().parent.parent / "docs" / "python.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    return BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_has_an_example_for_each_entry_point():
    code = "\n".join(python_blocks())
    for name in (
        "Translator(",
        ".translate(",
        "nbest=",
        ".translate_file(",
        ".score(",
        "prepare(",
        "train_model(",
    ):
        assert name in code, name


def test_every_example_on_the_page_runs(tiny_run, tiny_corpus, tmp_path, monkeypatch, one_thread):
    demo = tmp_path / "runs" / "demo"
    demo.mkdir(parents=True)
    (demo / "checkpoints").symlink_to(tiny_run / "checkpoints")
    (demo / "averaged").symlink_to(latest_checkpoint(tiny_run / "checkpoints"))
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
