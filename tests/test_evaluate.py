"""aiayn.evaluate's report: chrF and TER beside both BLEUs, and every SacreBLEU metric's 95%
bootstrap interval, equal to sacrebleu's own (``sacrebleu --confidence``)."""

from __future__ import annotations

import json
import warnings

import pytest
from _cli import run_cli
from sacrebleu.metrics import BLEU, CHRF, TER

from aiayn import evaluate as evaluate_module
from aiayn.checkpoint import latest_checkpoint, load_translator
from aiayn.evaluate import evaluate_model
from aiayn.files import read_lines

REFS = [
    "Y dijo Dios: Sea la luz: y fué la luz.",
    "Y vió Dios que la luz era buena.",
    "Y llamó Dios á la luz Día, y á las tinieblas llamó Noche.",
    "Y fué la tarde y la mañana un día.",
]
HYPS = [
    "Y dijo Dios: Sea la luz, y fué la luz.",
    "Y vió Dios la luz que era buena.",
    "Y llamó Dios á la luz Día, y á las tinieblas Noche.",
    "Y fué la mañana un día.",
]


def test_evaluation_reports_chrf_ter_and_sacrebleus_intervals(tiny_run, monkeypatch):
    """The decoder's outputs are scripted (the scoring is what is tested): each SacreBLEU
    metric's score, bootstrap mean and half-width are what sacrebleu computes for them with
    its default 1000 resamples and seed."""
    monkeypatch.setattr(evaluate_module, "translate_corpus", lambda *args, **kwargs: [HYPS])
    model, vocab = load_translator(latest_checkpoint(tiny_run / "checkpoints"))
    report = evaluate_model(model, vocab, ["a", "b", "c", "d"], REFS, lang="es").as_dict()
    for name, metric in (("BLEU", BLEU), ("chrF2", CHRF), ("TER", TER)):
        expected = metric().corpus_score(HYPS, [REFS], n_bootstrap=1000)
        found = report["intervals"][name]
        assert found["score"] == pytest.approx(expected.score)
        assert (found["mean"], found["ci"]) == pytest.approx((expected._mean, expected._ci))
        assert found["ci"] > 0  # four lines differ in how well they match: a real spread
        assert "bs:1000" in report["interval_signatures"][name]
    assert report["chrf"] == report["intervals"]["chrF2"]["score"]
    assert report["ter"] == report["intervals"]["TER"]["score"]
    assert report["sacrebleu"] == pytest.approx(report["intervals"]["BLEU"]["score"])
    assert json.loads(json.dumps(report)) == report  # the JSON the command prints


def test_evaluate_command_prints_chrf_ter_and_intervals(tiny_run, tmp_path, capsys):
    src = tmp_path / "src.en"
    src.write_text("In the beginning.\nAnd God said.\n", encoding="utf-8")
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    hyp = tmp_path / "hyp.es"
    code, out, err = run_cli(
        capsys, "evaluate", "--checkpoint", ckpt, "--beam", 1,
        "--src", src, "--ref", src, "--output", hyp,
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    expected = CHRF().corpus_score(read_lines(hyp), [read_lines(src)])
    assert report["chrf"] == pytest.approx(expected.score)
    assert set(report["intervals"]) == {"BLEU", "chrF2", "TER"}


def test_evaluate_refuses_a_lang_that_is_no_code_and_warns_of_another_than_trained(
    tiny_run, tmp_path, capsys
):
    """--lang chooses the paper BLEU's tokeniser: "english" is refused in one line, and a code
    other than the language the checkpoint translates into (es here) is said, then used."""
    src, ref = tmp_path / "src.en", tmp_path / "ref.es"
    src.write_text("In the beginning\nAnd God said\n")
    ref.write_text("En el principio\nY dijo Dios\n")
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ("evaluate", "--checkpoint", ckpt, "--src", src, "--ref", ref, "--quiet", "--lang")
    code, out, err = run_cli(capsys, *argv, "english")
    assert code == 2 and out == ""
    assert err.strip() == (
        "aiayn evaluate: error: --lang 'english': not a language code (ISO 639: two or three "
        "lower-case letters, then an optional region: en, de, pt-BR)"
    )
    said = "--lang de, but the checkpoint translates into es: the paper BLEU tokenises as de"
    with pytest.warns(UserWarning, match=said):
        code, out, err = run_cli(capsys, *argv, "de")
    assert code == 0 and json.loads(out)["paper_bleu_lang"] == "de"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none is given for the language it translates into
        code, out, err = run_cli(capsys, *argv, "es")
    assert code == 0 and json.loads(out)["paper_bleu_lang"] == "es"


def test_the_command_line_prints_the_librarys_warnings_as_its_own_lines():
    from aiayn.cli.main import _one_line

    shown = _one_line("evaluate")(UserWarning("--lang de, but ..."), UserWarning, "x.py", 3)
    assert shown == "aiayn evaluate: warning: --lang de, but ...\n"
