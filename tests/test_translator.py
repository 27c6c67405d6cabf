"""``aiayn.Translator`` is ``aiayn translate``: the same bytes with default options, the same
n-best numbers and scores, the same search request from the same options, the loading options
resolved and refused as the command resolves them; sentences are checked in one line; and
``aiayn.prepare`` / ``aiayn.train_model`` return what the commands print."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import aiayn
from aiayn.checkpoint import latest_checkpoint
from aiayn.cli.decoding import keywords
from aiayn.cli.main import build_parser, main
from aiayn.decode import DecodeConfig, SampleConfig, nbest_outputs, translate, translate_corpus
from aiayn.errors import UserError
from aiayn.evaluate import evaluate_model
from aiayn.runtime.policy import choose_precision

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tiny_run) -> Path:
    return latest_checkpoint(tiny_run / "checkpoints")


@pytest.fixture(scope="module")
def test_en(tiny_corpus) -> Path:
    return tiny_corpus.parent / "test.en"


@pytest.fixture(scope="module")
def translator(checkpoint):
    with aiayn.Translator(checkpoint) as t:
        yield t


def _cli(capsys, *argv: str) -> str:
    capsys.readouterr()
    main(list(argv))
    return capsys.readouterr().out


def test_translate_is_byte_for_byte_the_commands_output(capsys, translator, checkpoint, test_en):
    printed = _cli(capsys, "translate", "--checkpoint", str(checkpoint), "--input", str(test_en))
    sources = test_en.read_text(encoding="utf-8").splitlines()
    ours = "".join(r.text + "\n" for r in translator.translate(sources))
    assert ours.encode() == printed.encode()
    assert len(printed.splitlines()) == len(sources) == 40


def test_nbest_and_scores_are_the_commands_nbest_lines(capsys, translator, checkpoint, test_en):
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(test_en), "--nbest", "3"]
    printed = _cli(capsys, *argv).splitlines()
    sources = test_en.read_text(encoding="utf-8").splitlines()[:40]
    ours = [
        f"{i} ||| {c.text} ||| {c.score:.6f} ||| {c.log_prob:.6f}"
        for i, result in enumerate(translator.translate(sources, nbest=3))
        for c in result.nbest
    ]
    assert ours == printed
    assert len(ours) == 3 * 40


def test_outputs_cut_at_the_length_limit_are_the_commands(capsys, translator, checkpoint, test_en):
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(test_en)]
    printed = _cli(capsys, *argv, "--nbest", "2", "--format", "jsonl").splitlines()
    marked = [[bool(h.get("cut")) for h in json.loads(line)["hypotheses"]] for line in printed]
    sources = test_en.read_text(encoding="utf-8").splitlines()[:40]
    results = translator.translate(sources, nbest=2)
    assert [[c.cut for c in r.nbest] for r in results] == marked
    assert [r.cut for r in results] == [m[0] if m else False for m in marked]
    assert any(r.cut for r in results) and not all(r.cut for r in results), "a 2-update model"


def test_token_scores_sum_to_the_log_prob_and_score_rescoring_agrees(translator):
    [result] = translator.translate(["Jesus wept."], token_scores=True)
    best = result.best
    assert best.token_log_probs is not None and len(best.token_log_probs) == best.length
    assert sum(best.token_log_probs) == pytest.approx(best.log_prob, abs=1e-4)
    if best.length > len(best.tokens):  # ended with eos: scoring its text gives its numbers
        [scored] = translator.score(["Jesus wept."], [result.text])
        assert scored.log_prob == pytest.approx(best.log_prob, abs=1e-3)


def test_score_is_the_commands_tsv(capsys, translator, checkpoint, tiny_corpus):
    src, ref = tiny_corpus.parent / "valid.en", tiny_corpus.parent / "valid.es"
    argv = ["score", "--checkpoint", str(checkpoint), "--src", str(src), "--ref", str(ref)]
    printed = _cli(capsys, *argv).splitlines()
    scores = translator.score(
        src.read_text(encoding="utf-8").splitlines(), ref.read_text(encoding="utf-8").splitlines()
    )
    ours = [f"{s.log_prob:.6f}\t{s.length}\t{s.score:.6f}\t{s.ppl:.6f}" for s in scores]
    assert ours == printed


@pytest.mark.parametrize(
    ("options", "argv"),
    [
        ({}, []),
        ({"nbest": 3}, ["--nbest", "3"]),
        (
            {"beam": 5, "alpha": 1.0, "batch_size": 8},
            ["--beam", "5", "--alpha", "1", "--batch-size", "8"],
        ),
        (
            {"rules": "fairseq", "max_tokens": 500},
            ["--search-rules", "fairseq", "--max-tokens", "500"],
        ),
        ({"sample": True, "nbest": 2}, ["--sample", "--nbest", "2"]),
        ({"sample": SampleConfig(top_k=5, seed=3)}, ["--sample", "--top-k", "5", "--seed", "3"]),
    ],
)
def test_request_is_the_one_the_command_builds_from_the_same_options(translator, options, argv):
    args = build_parser().parse_args(["translate", "--checkpoint", "x", *argv])
    assert translator.request(**options) == translator.request(**keywords(args, translator.request))


def test_loading_options_resolve_as_the_commands_do(checkpoint, bf16_answer):
    translator = aiayn.Translator(checkpoint)  # the command's defaults: auto, auto, torch
    assert translator.precision == choose_precision("auto", "cpu")
    assert translator.workers == 1  # auto: one per thread, and this module runs on one
    assert translator.request().batching.workers == 1


def test_run_pointer_and_ensemble(tiny_run, checkpoint):
    pointer = tiny_run / "checkpoints" / "latest"
    assert aiayn.Translator(pointer).checkpoints == [checkpoint]
    two = aiayn.Translator([pointer, checkpoint])
    assert len(two.translate(["Amen.", ""])) == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workers": 0}, "--workers must be at least 1, got 0"),
        ({"workers": "two"}, "--workers is a number of processes or auto, not 'two'"),
        ({"device": "tpu"}, "--device tpu: not a device"),
        ({"precision": "fp16"}, "--precision fp16: choose one of auto, fp32, bf16"),
        ({"precision": "bf16", "quantize": "int8"}, "--precision bf16 with --quantize int8"),
        ({"engine": "onnx"}, "--engine onnx: choose one of torch, ctranslate2, onnxruntime"),
        ({"engine": "ctranslate2", "quantize": "int8"}, "cannot do: --quantize int8 (our int8"),
    ],
)
def test_bad_loading_options_are_one_line(checkpoint, options, message):
    with pytest.raises(UserError) as err:
        aiayn.Translator(checkpoint, **options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_closed_translator_refuses_to_decode(checkpoint):
    with aiayn.Translator(checkpoint) as translator:
        assert translator.translate(["Amen."])[0].text == translator.translate(["Amen."])[0].text
    with pytest.raises(UserError, match="closed"):
        translator.translate(["Amen."])


@pytest.mark.parametrize(
    ("sentences", "message"),
    [
        ("Jesus wept.", "must be a list of str, not one str: give [text] for one sentence"),
        ([None], "[0] is NoneType, not str"),
        (["Amen.", 3], "[1] is int, not str"),
        (7, "of str, not int"),
    ],
)
def test_sentences_that_are_not_a_list_of_str_are_a_one_line_type_error(
    translator, sentences, message
):
    calls = [
        lambda: translator.translate(sentences),
        lambda: translator.score(sentences, ["x"]),
        lambda: translate(translator.model, sentences, translator.vocab),
        lambda: nbest_outputs(translator.model, sentences, translator.vocab),
        lambda: list(translate_corpus(translator.model, sentences, translator.vocab)),
        lambda: evaluate_model(translator.model, translator.vocab, sentences, ["x"]),
        lambda: list(translator.windows(sentences, translator.request())),
    ]
    for call in calls:
        with pytest.raises(TypeError) as err:
            call()
        assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"beam": "4"}, "beam must be an integer, got '4' (str)"),
        ({"alpha": "0.6"}, "alpha must be a number, got '0.6' (str)"),
        ({"beam": True}, "beam must be an integer, got True (bool)"),
        ({"bem": 4}, "unknown decoding option 'bem'"),
    ],
)
def test_decode_config_refuses_a_wrong_type_in_one_line(overrides, message):
    with pytest.raises(UserError) as err:
        DecodeConfig.preset("translation", **overrides)
    assert message in str(err.value)


def test_prefixes_and_constraints_are_the_commands(capsys, translator, checkpoint, tmp_path):
    sources = ["In the beginning God created the heaven and the earth.", "Jesus wept."]
    prefixes, phrases = ["En el", ""], [["tierra"], []]
    (tmp_path / "in.en").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (tmp_path / "prefix").write_text("En el\n\n", encoding="utf-8")
    (tmp_path / "phrases").write_text("tierra\n\n", encoding="utf-8")
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "in.en")]
    argv += ["--prefix", str(tmp_path / "prefix"), "--constraints", str(tmp_path / "phrases")]
    printed = _cli(capsys, *argv).splitlines()
    ours = translator.translate(sources, prefixes=prefixes, constraints=phrases)
    assert [r.text for r in ours] == printed
    assert ours[0].text.startswith("En el") and "tierra" in ours[0].text
    with pytest.raises(UserError, match="1 prefixes for 2 sentences"):
        translator.translate(sources, prefixes=["En"])


def test_alignments_are_the_commands(capsys, translator, checkpoint, test_en):
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(test_en), "--alignments"]
    printed = _cli(capsys, *argv).splitlines()
    sources = test_en.read_text(encoding="utf-8").splitlines()
    ours = [f"{r.text} ||| {r.alignment}" for r in translator.translate(sources, alignments=True)]
    assert ours == printed


def test_translate_file_writes_what_the_command_prints(
    capsys, translator, checkpoint, test_en, tmp_path
):
    out = tmp_path / "hyp.es"
    assert translator.translate_file(test_en, out, beam=2) == 40
    printed = _cli(
        capsys, "translate", "--checkpoint", str(checkpoint), "--input", str(test_en), "--beam", "2"
    )
    assert out.read_bytes() == printed.encode()
    with pytest.raises(UserError, match="output"):
        translator.translate_file(test_en, test_en)
    assert len(test_en.read_text(encoding="utf-8").splitlines()) == 40  # the input is intact


def test_options_and_a_request_are_not_both_taken(translator):
    with pytest.raises(TypeError, match="give a request or options"):
        translator.translate(["Amen."], translator.request(), beam=2)


def test_prepare_returns_what_the_command_prints(capsys, tiny_corpus, tmp_path):
    text = tiny_corpus.parent
    train = (str(text / "train.en"), str(text / "train.es"))
    written = aiayn.prepare(tmp_path / "py", train=train, vocab_size=200)
    main(
        [
            "prepare",
            "--out",
            str(tmp_path / "cli"),
            "--train-src",
            train[0],
            "--train-tgt",
            train[1],
            "--vocab-size",
            "200",
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    assert written.out == (tmp_path / "py").resolve()
    assert written.summary.keys() == printed.keys()
    assert written.summary["splits"] == printed["splits"]
    with pytest.raises(UserError, match="no input: give --bundled"):
        aiayn.prepare(tmp_path / "none")
    with pytest.raises(UserError, match="--vocab reuses a vocabulary"):
        aiayn.prepare(
            tmp_path / "both", train=train, vocab=str(written.out / "spm.model"), vocab_size=10
        )


@pytest.mark.slow
def test_train_model_returns_what_the_command_prints(capsys, tiny_corpus, tmp_path):
    keys = {
        "data": str(tiny_corpus),
        "preset": "tiny",
        "model": {"N_enc": 1, "N_dec": 1, "d_model": 32, "d_ff": 64, "h": 2},
        "max_updates": 1,
        "warmup": 10,
        "validate": False,
        "num_threads": 1,
        "save_every_minutes": None,
    }
    run = aiayn.train_model({**keys, "out": str(tmp_path / "py")}, device="cpu")
    assert run.out == (tmp_path / "py").resolve() and run.stopped is None
    assert run.summary["updates"] == 1
    assert latest_checkpoint(run.out / "checkpoints") is not None
    config = tmp_path / "cli.json"
    config.write_text(json.dumps({**keys, "out": str(tmp_path / "cli")}), encoding="utf-8")
    capsys.readouterr()
    main(["train", str(config), "--device", "cpu"])
    printed = json.loads(capsys.readouterr().out)
    assert run.summary.keys() == printed.keys()
    with pytest.raises(UserError, match="bogus"):
        aiayn.train_model({**keys, "out": str(tmp_path / "bad"), "bogus": 1})


def test_another_engine_is_the_commands(capsys, checkpoint, test_en, tmp_path):
    pytest.importorskip("ctranslate2")
    import shutil

    ckpt = tmp_path / "ckpt"  # the export is cached beside the checkpoint: a copy of ours
    shutil.copytree(checkpoint, ckpt)
    argv = [
        "translate",
        "--checkpoint",
        str(ckpt),
        "--input",
        str(test_en),
        "--engine",
        "ctranslate2",
    ]
    printed = _cli(capsys, *argv).splitlines()
    with aiayn.Translator(ckpt, engine="ctranslate2") as translator:
        sources = test_en.read_text(encoding="utf-8").splitlines()
        assert [r.text for r in translator.translate(sources)] == printed
        with pytest.raises(UserError, match="cannot do: alignments .they come from our model"):
            translator.translate(sources[:1], alignments=True)


def test_the_command_lines_engine_choices_are_the_translators():
    from aiayn import translator
    from aiayn.cli import decoding as common

    assert common.ENGINES == translator.ENGINES  # named twice: --help must not import torch


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.translate(["Amen.", "Jesus wept."], prefixes="Yo"), "prefixes must be a list"),
        (lambda t: t.translate(["Amen.", "Jesus wept."], constraints="ab"), "constraints must be"),
        (lambda t: t.translate(["Amen."], prefixes=[None]), "prefixes[0] is NoneType, not str"),
        (lambda t: t.translate(["Amen."], constraints=[[3]]), "constraints[0][0] is int, not str"),
        (lambda t: t.translate(["Amen."], sample="yes"), "sample must be True, False or a"),
        (lambda t: t.translate(["Amen."], sample=True, top_k="5"), "top_k must be an integer"),
        (lambda t: t.translate(["Amen."], repetition_penalty="2"), "repetition_penalty must be a"),
        (lambda t: t.request(batch_size=1.5), "batch_size must be at least 1, got 1.5"),
        (lambda t: t.translate(["A \ud800 b"]), "sentences[0] is not Unicode text"),
        (lambda t: t.evaluate([], []), "no sources to evaluate"),
    ],
)
def test_a_python_argument_of_the_wrong_kind_is_the_projects_one_line_error(
    translator, call, message
):
    """No str split into characters, no Python or tokenizer error from deep inside: every
    argument is refused where it enters, as the command line refuses an option."""
    with pytest.raises(UserError) as err:
        call(translator)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("checkpoint", [None, b"runs/demo", 7, ["x", None], "bad\ud800"])
def test_a_checkpoint_that_is_not_a_path_is_one_line(checkpoint):
    with pytest.raises(UserError) as err:
        aiayn.Translator(checkpoint)
    assert "checkpoint" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("options", "argv", "message"),
    [
        ({"top_k": 5}, ["--top-k", "5"], "{top_k} needs {sample}"),
        ({"sample": True, "beam": 3}, ["--sample", "--beam", "3"], "{beam} has no effect with"),
        ({"shortlist_best": 3}, ["--shortlist-best", "3"], "{shortlist_best} sizes a shortlist"),
        ({"max_tokens": 0}, ["--max-tokens", "0"], "{max_tokens} must be at least 1, got 0"),
        ({"repetition_penalty": 1e30}, ["--repetition-penalty", "1e30"], "at most 10, got 1e+30"),
    ],
)
def test_python_gets_every_check_the_command_line_has(
    capsys, translator, checkpoint, options, argv, message
):
    """One check in the library (``Translator.request``), named as each user typed it."""
    from aiayn.decode.capabilities import option_name

    keywords = {k: k for k in ("top_k", "sample", "beam", "shortlist_best", "max_tokens")}
    with pytest.raises(UserError, match=message.format(**keywords).replace("+", r"\+")):
        translator.request(**options)
    options_named = {k: option_name(k) for k in keywords}
    with pytest.raises(SystemExit) as code:
        main(["translate", "--checkpoint", str(checkpoint), *argv])
    assert code.value.code == 2
    err = capsys.readouterr().err
    assert message.format(**options_named) in err and err.count("\n") == 1


def test_the_entry_points_ask_the_translator_for_requests_and_no_engine_by_class():
    """One ``SearchRequest`` builder (``Translator.request``) for the command line and the
    server; no ``isinstance`` on an engine class outside the engines."""
    package = Path(aiayn.__file__).parent
    for path in [*(package / "cli").glob("*.py"), *(package / "serve").glob("*.py")]:
        assert "SearchRequest(" not in path.read_text(encoding="utf-8"), path
    engines = {package / "decode" / "engine.py", package / "export" / "engine.py"}
    by_class = re.compile(r"isinstance\([^)]*Engine\b")
    for path in set(package.rglob("*.py")) - engines:
        assert not by_class.search(path.read_text(encoding="utf-8")), path
