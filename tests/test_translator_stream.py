"""``Translator.stream`` and ``stream_document``: ``translate``'s translations (``--split``'s
lines) one at a time, in input order, the first after one sentence's search: counted on the
engine, never timed."""

from __future__ import annotations

from pathlib import Path

import pytest

import aiayn
from aiayn.checkpoint import latest_checkpoint
from aiayn.cli.main import main
from aiayn.decode.translate import stream_windows
from aiayn.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tiny_run) -> Path:
    return latest_checkpoint(tiny_run / "checkpoints")


@pytest.fixture(scope="module")
def sources(tiny_corpus) -> list[str]:
    return (tiny_corpus.parent / "test.en").read_text(encoding="utf-8").splitlines()[:12]


class Counting:
    """An engine that counts the sentences it has searched, and records that count as each
    translation is taken from the stream (``seen``)."""

    def __init__(self, engine):
        self.inner, self.searched, self.calls = engine, 0, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def nbest(self, texts, *args, **kwargs):
        self.calls.append(len(texts))
        found = self.inner.nbest(texts, *args, **kwargs)
        self.searched += len(texts)
        return found


def test_the_stream_is_translates_translations_in_input_order(checkpoint, sources):
    with aiayn.Translator(checkpoint, workers=1) as translator:
        whole = translator.translate(sources, beam=3, nbest=2)
        streamed = list(translator.stream(sources, beam=3, nbest=2))
    assert [t.source for t in streamed] == sources
    assert [[c.text for c in t.nbest] for t in streamed] == [
        [c.text for c in t.nbest] for t in whole
    ]
    for got, expected in zip(streamed, whole):  # other batches: equal to the last bits
        assert [c.score for c in got.nbest] == pytest.approx([c.score for c in expected.nbest])


def test_the_first_translation_comes_after_its_own_search_alone(checkpoint, sources):
    with aiayn.Translator(checkpoint, workers=1) as translator:
        counting = Counting(translator.engine)
        translator.engine = counting
        searched_when_taken = [counting.searched for _ in translator.stream(sources)]
    assert searched_when_taken[0] == 1  # the other 11 not yet searched
    assert counting.calls == [1, 2, 4, 5]  # stream_windows: 1, 2, 4, ...
    # each is given as soon as its window is done: 1, then 2 more, then 4 more, ...
    assert searched_when_taken == [1, 3, 3, 7, 7, 7, 7] + [12] * 5


def test_stream_windows_double_up_to_the_most():
    windows = stream_windows(6)
    assert [next(windows) for _ in range(6)] == [1, 2, 4, 6, 6, 6]
    with pytest.raises(ValueError, match="most must be at least 1"):
        next(stream_windows(0))


def test_samples_are_seeded_by_their_place_in_the_input_not_in_the_window(checkpoint, sources):
    options = {"sample": True, "seed": 3, "nbest": 2}
    with aiayn.Translator(checkpoint, workers=1) as translator:
        whole = translator.translate(sources, **options)
        streamed = list(translator.stream(sources, **options))
    assert [[c.text for c in t.nbest] for t in streamed] == [
        [c.text for c in t.nbest] for t in whole
    ]


def test_prefixes_go_with_their_sentences_across_windows(checkpoint, sources):
    prefixes = ["" if i % 3 else "Y" for i in range(len(sources))]
    with aiayn.Translator(checkpoint, workers=1) as translator:
        whole = translator.translate(sources, prefixes=prefixes)
        streamed = list(translator.stream(sources, prefixes=prefixes))
    assert [t.text for t in streamed] == [t.text for t in whole]
    assert all(t.text.startswith("Y") for t in streamed[::3])


def test_options_are_checked_when_the_stream_is_made_not_when_it_is_read(checkpoint):
    with aiayn.Translator(checkpoint, workers=1) as translator:
        with pytest.raises(UserError, match="beam"):
            translator.stream(["Jesus wept."], beam=0)
        with pytest.raises(UserError, match="2 prefixes for 1 sentences"):
            translator.stream(["Jesus wept."], prefixes=["a", "b"])


def test_a_streamed_document_joins_into_what_split_prints_byte_for_byte(
    capsys, checkpoint, sources, tmp_path
):
    lines = [
        f"  {sources[0]}  {sources[1]} {sources[2]}",
        "",
        "   ",
        " ".join(sources[3:11]),
        sources[11],
    ]
    (document := tmp_path / "doc.en").write_text("".join(x + "\n" for x in lines))
    capsys.readouterr()
    main(["translate", "--checkpoint", str(checkpoint), "--input", str(document), "--split"])
    printed = capsys.readouterr().out
    with aiayn.Translator(checkpoint) as translator:
        pieces = list(translator.stream_document(lines))
    joined = ["".join(p.text for p in pieces if p.line == i) for i in range(len(lines))]
    assert "".join(line + "\n" for line in joined).encode() == printed.encode()
    order = [(p.line, p.sentence) for p in pieces]
    assert order == sorted(order, key=lambda o: (o[0], -1 if o[1] is None else o[1]))
    for i, line in enumerate(lines):  # every sentence of a line once, a blank line one piece
        numbers = [j for at, j in order if at == i]
        assert numbers == ([None] if not line.strip() else list(range(len(numbers))))
    assert len([j for at, j in order if at == 3]) >= 8
    assert pieces[0].text.startswith("  ") and sources[0].startswith(pieces[0].translation.source)
