"""``aiayn translate``: what it says about its input goes to stderr as one line naming the
input file and the line in it."""

import re
import sys
import warnings

import pytest
from _cli import one_line_error, run_cli

from aiayn.checkpoint import latest_checkpoint, load_translator
from aiayn.decode import DecodeConfig, SearchRequest, translate


def test_an_overlong_line_is_reported_by_its_line_in_the_file(tiny_run, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")  # the tiny model: 256 positions
    src = tmp_path / "in.txt"
    lines = ["In the beginning"] * 6
    lines[4] = " ".join(["and the earth"] * 120)  # line 5, the second of the third chunk of 2
    src.write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run_cli(
            capsys, "translate", "--checkpoint", ckpt, "--beam", 1, "--window", 2, "--input", src
        )
    assert code == 0 and len(out.splitlines()) == 6
    assert not [w for w in caught if "truncated" in str(w.message)]  # no Python warning
    said = [line for line in err.splitlines() if "truncated" in line]
    assert len(said) == 1 and "Warning" not in err, err
    assert re.fullmatch(
        rf"aiayn translate: warning: {re.escape(str(src))}: line 5: \d+ tokens, more than the "
        r"model's 256 positions: truncated",
        said[0],
    ), said


# --- whole corpora: windows sorted by length, written in the input's order --------------------

# 10 lines: CRLF endings, blank lines (one of them CRLF), invalid UTF-8 (line 4), no final LF.
RAW = (
    b"In the beginning God created the heaven\r\n"
    b"\n"
    b"And the earth was without form\n"
    b"\xff\xfe broken\r\n"
    b"and void\r\n"
    b"\r\n"
    b"And God said, Let there be light: and there was light\n"
    b"light\n"
    b"And God saw the light, that it was good\n"
    b"darkness"
)
TEXTS = [
    "In the beginning God created the heaven",
    "",
    "And the earth was without form",
    None,  # not UTF-8: an empty output
    "and void",
    "",
    "And God said, Let there be light: and there was light",
    "light",
    "And God saw the light, that it was good",
    "darkness",
]


def _translate_file(capsys, ckpt, src, *extra):
    return run_cli(capsys, "translate", "--checkpoint", ckpt, "--beam", 1, "--input", src, *extra)


def test_a_window_keeps_the_input_order_and_line_count(tiny_run, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_bytes(RAW)
    code, out, err = _translate_file(capsys, ckpt, src, "--window", 3)
    assert code == 2
    one_line_error(err, str(src), "1 line(s) not valid UTF-8 (line 4)", "the other 9")
    model, vocab = load_translator(ckpt)
    config = DecodeConfig.preset("translation", beam=1)
    alone = [translate(model, [t], vocab, SearchRequest(config))[0] if t else "" for t in TEXTS]
    assert out.split("\n") == [*alone, ""]  # one line per input line, each its own translation
    assert len({alone[i] for i in (0, 2, 6, 7)}) == 4  # all different: any swap would show


@pytest.mark.parametrize("window", [1, 3])
def test_a_window_smaller_than_the_file_gives_the_outputs_of_one_window(
    tiny_run, tmp_path, capsys, window
):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_bytes(RAW.replace(b"\xff\xfe", b"no"))
    code, whole, err = _translate_file(capsys, ckpt, src)
    assert code == 0, err
    code, windowed, err = _translate_file(capsys, ckpt, src, "--window", window, "--max-tokens", 9)
    assert code == 0, err
    assert windowed == whole and len(whole.splitlines()) == 10


def test_the_progress_bar_shows_only_on_a_terminal(tiny_run, tmp_path, capsys, monkeypatch):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_bytes(RAW.replace(b"\xff\xfe", b"no"))
    code, _, err = _translate_file(capsys, ckpt, src)
    assert code == 0 and err == ""  # stderr is not a terminal: no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = _translate_file(capsys, ckpt, src, "--window", 4)
    assert code == 0 and len(out.splitlines()) == 10
    assert re.search(r"10/10 \[.*sent/s\]", err), err  # the whole file: rate and ETA
    code, _, err = _translate_file(capsys, ckpt, src, "--quiet")
    assert code == 0 and err == ""


def test_evaluate_shows_no_progress_bar_off_a_terminal(tiny_run, tiny_corpus, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "src.txt"
    src.write_bytes(RAW.replace(b"\xff\xfe", b"no"))
    code, out, err = run_cli(
        capsys, "evaluate", "--checkpoint", ckpt, "--beam", 1, "--src", src, "--ref", src,
        "--max-tokens", 9, "--output", tmp_path / "hyp.txt",
    )  # fmt: skip
    assert code == 0, err
    assert "sent/s" not in err and "it/s" not in err, err
    code, translated, _ = _translate_file(capsys, ckpt, src)
    assert (tmp_path / "hyp.txt").read_text() == translated  # one path: the same outputs


@pytest.mark.parametrize("option", ["--window", "--max-tokens", "--batch-size", "--workers"])
def test_a_window_or_batch_below_one_is_refused_by_name(tiny_run, tmp_path, capsys, option):
    src = tmp_path / "in.txt"
    src.write_text("one\n")
    code, out, err = _translate_file(capsys, latest_checkpoint(tiny_run / "checkpoints"), src,
                                     option, 0)  # fmt: skip
    assert code == 2 and out == ""
    one_line_error(err, f"{option} must be at least 1, got 0")


def test_interactive_answers_each_line_before_reading_the_next(tiny_run, capsys, monkeypatch):
    import io as std_io

    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    model, vocab = load_translator(ckpt)
    lines = ["In the beginning", "light"]
    answered = []

    class Stdin(std_io.BytesIO):
        def __iter__(self):  # each line is read only after the one before was answered
            for line in lines:
                answered.append(capsys.readouterr().out)
                yield (line + "\n").encode()

    monkeypatch.setattr(sys, "stdin", std_io.TextIOWrapper(Stdin()))
    code, out, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--beam", 1,
                             "--interactive")  # fmt: skip
    assert code == 0, err
    first, second = translate(
        model, lines, vocab, SearchRequest(DecodeConfig.preset("translation", beam=1))
    )
    assert answered == ["> ", f"{first}\n> "] and out == f"{second}\n> "


@pytest.mark.lint  # a repository lint: `make lint` runs it
def test_the_help_states_the_librarys_corpus_defaults(capsys):
    from aiayn.decode.request import BATCH_SIZE, BEAM_ROWS, MAX_TOKENS
    from aiayn.decode.translate import WINDOW

    code, out, _ = run_cli(capsys, "translate", "--help")
    assert code == 0
    help_text = " ".join(out.split())
    for default in (WINDOW, BATCH_SIZE):
        assert f"(default: {default})" in help_text
    assert f"(default: {MAX_TOKENS}; a beam over {BEAM_ROWS} gets" in help_text
