"""Documents in, documents out (``aiayn.text``, ``translate --split``): sentences found by the
segmenter, long ones cut where it is safe, and the translations joined back line by line."""

import sys
from pathlib import Path

import pytest
from _cli import run_cli
from _export_models import corpus_lines

from aiayn.checkpoint import latest_checkpoint, load_translator, read_meta
from aiayn.decode import DecodeConfig, SearchRequest, translate
from aiayn.errors import UserError
from aiayn.text.document import SplitOutputs, join_line, split_line, trained_limit
from aiayn.text.segment import sentence_spans

FIRST = 62  # test-split verses 63-72: ten one-sentence verses in a row, nested quotes and all


def _verses() -> list[str]:
    return corpus_lines("test", 0, FIRST + 10)[FIRST:]


def test_the_segmenter_finds_the_ten_verses_of_a_paragraph():
    verses = _verses()
    paragraph = " ".join(verses)
    assert [paragraph[a:b] for a, b in sentence_spans(paragraph)] == verses
    assert any("”’”" in v for v in verses)  # a sentence that ends in three closing quotes


def test_spans_keep_the_lines_own_spaces():
    text = "  Dr. Smith came at 5 p.m.   He left.\t"
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == ["Dr. Smith came at 5 p.m.", "He left."]
    assert join_line(text, spans, ["A.", "B."]) == "  A.   B.\t"
    assert sentence_spans("   ") == [] and join_line("   ", [], []) == "   "


def test_a_long_sentence_is_cut_at_clause_punctuation_then_at_spaces():
    words = len  # a piece "takes" one position per character here
    text = "one two three, four five six; seven eight nine"
    spans, cut = split_line(text, "en", words, 20, where="x")
    assert cut and [text[a:b] for a, b in spans] == [
        "one two three,",
        "four five six;",
        "seven eight nine",
    ]
    spans, _ = split_line("aaaa bbbb cccc dddd", "en", words, 10, where="x")
    assert [(a, b) for a, b in spans] == [(0, 9), (10, 19)]  # the space nearest the middle
    with pytest.warns(
        UserWarning, match=r"^in.txt: line 3: a sentence of 13 source positions, more than the 5"
    ):  # translated whole, as without --split, not the whole file refused
        spans, _ = split_line("abcdefghijkl. Ab cd.", "en", words, 5, where="in.txt: line 3")
    assert spans == [(0, 13), (14, 16), (17, 20)]


def test_the_limit_is_the_longest_training_source_else_the_positions():
    assert trained_limit({"dataset": {"splits": {"train": {"longest_src_tokens": 47}}}}) == 48
    assert trained_limit({"dataset": {"splits": {}}, "model_config": {"max_len": 256}}) == 256


def test_an_unknown_language_is_refused_in_one_line():
    with pytest.raises(UserError, match="--split xx: no sentence rules for that language"):
        sentence_spans("A. B.", "xx")


@pytest.fixture(scope="module")
def tiny(tiny_run):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    return ckpt, *load_translator(ckpt)


def test_a_paragraph_translates_as_its_sentences_alone(tiny, one_thread):
    ckpt, model, vocab = tiny
    request = SearchRequest(DecodeConfig.preset("translation", beam=2))
    verses = _verses()
    split = SplitOutputs(translate, limit=read_meta(ckpt)["model_config"]["max_len"])
    (joined,) = split(model, [" ".join(verses)], vocab, request, progress=False, on_truncate=None)
    apart = translate(model, verses, vocab, request)
    assert joined == " ".join(apart)
    assert split.counts.lines == 1 and split.counts.cut == 0


def test_split_on_the_command_line_gives_a_paragraph_its_lines_translations(
    tiny, tmp_path, capsys, one_thread
):
    ckpt = tiny[0]
    verses = _verses()
    paragraph, lines = tmp_path / "paragraph.txt", tmp_path / "lines.txt"
    paragraph.write_text(f"\n  {' '.join(verses)}\n\n", encoding="utf-8")
    lines.write_text("".join(v + "\n" for v in verses), encoding="utf-8")
    argv = ("translate", "--checkpoint", ckpt, "--beam", 2, "--split")
    code, out, err = run_cli(capsys, *argv, "--input", paragraph)
    assert code == 0
    assert "--split: 1 line(s) held several sentences;" in err
    limit = trained_limit(read_meta(ckpt))
    assert limit < 60 and f"had a sentence longer than the {limit} source positions" in err
    assert "; 1 had a sentence longer" in err  # the tiny model saw short verses only
    code, apart, _ = run_cli(capsys, *argv, "--input", lines)
    assert code == 0
    assert out == "\n  " + " ".join(apart.splitlines()) + "\n\n"  # blank lines and spaces kept


def test_an_unbreakable_long_sentence_is_translated_whole_not_the_file_refused(
    tiny, tmp_path, capsys, one_thread
):
    src = tmp_path / "in.txt"
    src.write_text("In the beginning.\n" + "x" * 400 + "\nAnd God said.\n", encoding="utf-8")
    argv = ("translate", "--checkpoint", tiny[0], "--beam", 1, "--input", src, "--split")
    with pytest.warns(UserWarning, match="line 2: a sentence of .* no space to cut it at"):
        code, out, err = run_cli(capsys, *argv)
    assert code == 0 and len(out.splitlines()) == 3, err


def test_split_refuses_per_sentence_outputs(tiny, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("A. B.\n", encoding="utf-8")
    code, _, err = run_cli(
        capsys, "translate", "--checkpoint", tiny[0], "--input", src, "--split", "--nbest", 2
    )
    assert code == 2 and "--split joins sentences back into lines" in err


def test_the_segmenter_keeps_its_measured_accuracy_on_the_gold_set():
    # scripts/compare_segmenters.py chose it on this set (docs/documents.md has the table)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import compare_segmenters

    cases = compare_segmenters.gold()
    exact = [[t[a:b] for a, b in sentence_spans(t, lang)] == s for lang, t, s in cases]
    n = len(cases) - len(compare_segmenters.TRICKY)
    assert n >= 100
    assert sum(exact[:n]) >= 105 and sum(exact[n:]) >= 27  # 99.1% and 90.0%
