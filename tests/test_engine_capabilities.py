"""The command line, ``aiayn.Translator`` and the server refuse the same features of the
CTranslate2 and ONNX Runtime engines (``aiayn.decode.capabilities``) through the Translator's
one refusal, each naming what its user typed (the option, the keyword, the request's field)
and the engine in use. No export is made: the Translator refuses before its engine's
``ctranslate2.Translator`` or ONNX graphs (stand-ins here that raise when used) are reached."""

from __future__ import annotations

import io
from typing import Any
from unittest.mock import patch

import pytest
from _export_models import trained_like_model

import aiayn
from aiayn.cli.decoding import open_decoding
from aiayn.cli.main import build_parser
from aiayn.cli.stream import Outputs, TextStream, translate_stream
from aiayn.data import Vocab
from aiayn.decode import SearchRequest
from aiayn.decode.capabilities import ALL_FEATURES, CAPABILITIES, ENGINE_NAMES, check_supported
from aiayn.errors import UserError
from aiayn.export.engine import CTranslate2Engine
from aiayn.export.onnx_engine import OnnxEngine
from aiayn.serve import Adapter
from aiayn.serve.app import TranslateRequest, _Refused, _translate_job

SENTENCE = "And God saw the light, that it was good."

# How each entry point asks for a feature (None: it cannot ask for it).
CLI: dict[str, list[str]] = {
    "ensemble": ["--checkpoint", "B"],
    "quantize": ["--quantize", "int8"],
    "precision": ["--precision", "bf16"],
    "lexical_constraints": ["--constraints", "F"],
    "glossary": ["--glossary", "G"],
    "prefixes": ["--prefix", "F"],
    "sampling": ["--sample"],
    "seed": ["--sample", "--seed", "0"],
    "shortlist": ["--shortlist", "F"],
    "search_rules": ["--search-rules", "ct2"],
    "no_repeat_ngram": ["--no-repeat-ngram-size", "3"],
    "repetition_penalty": ["--repetition-penalty", "1.2"],
    "token_scores": ["--token-scores"],
    "alignments": ["--alignments"],
}
LOADING = {  # aiayn.Translator's keywords that choose how a checkpoint loads
    "ensemble": {"checkpoint": ["A", "B"]},
    "quantize": {"quantize": "int8"},
    "precision": {"precision": "bf16"},
}
TRANSLATE: dict[str, dict[str, Any]] = {  # Translator.translate's keywords
    "lexical_constraints": {"constraints": [["God"]]},
    "glossary": {"glossary": {"God": "Dios"}},
    "prefixes": {"prefixes": ["And"]},
    "max_src_len": {"request": SearchRequest(max_src_len=9)},
    "min_len": {"request": SearchRequest(min_len=2)},
    "sampling": {"sample": True},
    "shortlist": {"request": SearchRequest(shortlist=object())},  # type: ignore[arg-type]
    "search_rules": {"rules": "ct2"},
    "no_repeat_ngram": {"no_repeat_ngram_size": 3},
    "repetition_penalty": {"repetition_penalty": 1.2},
    "token_scores": {"token_scores": True},
    "alignments": {"alignments": True},
}
SERVER: dict[str, dict[str, Any]] = {  # POST /translate's fields
    "lexical_constraints": {"constraints": [["God"]]},
    "glossary": {"glossary": [["God", "Dios"]]},
    "prefixes": {"prefix": ["And"]},
    "sampling": {"sample": True},
    "seed": {"sample": True, "seed": 3},
    "search_rules": {"search_rules": "ct2"},
    "no_repeat_ngram": {"no_repeat_ngram_size": 3},
    "repetition_penalty": {"repetition_penalty": 1.2},
}


@pytest.fixture(scope="module")
def vocab(tiny_corpus):
    return Vocab.load(tiny_corpus / "spm.model")


class Decoding(Exception):
    """What an engine's translator or graphs raise here: the request got past every check."""


class Unreachable:
    def __getattr__(self, name: str) -> Any:
        raise Decoding(name)


ENGINES = ["ctranslate2", "onnxruntime"]
Opened = CTranslate2Engine | OnnxEngine


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, vocab) -> Opened:
    """Each engine as opened on an export, its decoder a stand-in that raises when reached."""
    if request.param == "onnxruntime":
        return OnnxEngine(model=Unreachable(), vocab=vocab)  # type: ignore[arg-type]
    return CTranslate2Engine(translator=Unreachable(), vocab=vocab, max_len=64)


def _refusal(call) -> str | None:
    """The one-line refusal ``call`` raised, or None when it went through to decoding."""
    try:
        call()
    except (UserError, _Refused) as err:
        message = str(err)
        assert "\n" not in message
        return message
    except Decoding:
        pass
    return None


def _by_cli(feature: str, engine: Opened, tmp_path) -> str | None:
    per_line = tmp_path / "F"  # --prefix F, --constraints F: one line for the one input line
    per_line.write_text("God\n", encoding="utf-8")
    terms = tmp_path / "G"  # --glossary G: one term of the one input line
    terms.write_text("God\tDios\n", encoding="utf-8")
    files = {"F": str(per_line), "G": str(terms)}
    options = [files.get(o, o) for o in CLI[feature]]
    checkpoint = ["--checkpoint", str(tmp_path), "--workers", "1"]
    args = build_parser().parse_args(["translate", *checkpoint, "--engine", engine.name, *options])

    def run() -> None:
        with patch("aiayn.translator._open_engine", return_value=engine):  # as on an export
            translator, request = open_decoding(args, "translate")
            stream = TextStream(io.BytesIO(f"{SENTENCE}\n".encode()), io.StringIO())
            translate_stream(stream, translator, request, Outputs.from_args(args))

    refused = _refusal(run)
    for other in set(CAPABILITIES) - {feature}:  # the option asks for its feature alone
        assert refused is None or CAPABILITIES[other].why(engine.name) not in refused, other
    return refused


def _by_translator(feature: str, engine: Opened, tmp_path) -> str | None:
    if feature in LOADING:
        options = {"checkpoint": str(tmp_path), **LOADING[feature]}
        return _refusal(lambda: aiayn.Translator(engine=engine.name, **options))
    translator = aiayn.Translator(str(tmp_path), engine=engine.name, workers=1)  # not loaded
    translator.engine, translator.vocab = engine, engine.vocab  # as opened on an export
    return _refusal(lambda: translator.translate([SENTENCE], **TRANSLATE[feature]))


def _by_server(feature: str, engine: Opened, tmp_path) -> str | None:
    library = aiayn.Translator(str(tmp_path), engine=engine.name, workers=1)  # not loaded
    library.engine, library.vocab = engine, engine.vocab  # as opened on an export
    library._model = trained_like_model(len(engine.vocab), max_len=64)  # attention's model
    translator = Adapter(library)
    body = TranslateRequest(text=[SENTENCE], **SERVER[feature])
    return _refusal(lambda: _translate_job(translator, body, translator.encode(body.text)))


def test_each_entry_point_can_ask_what_the_vocabulary_says_it_asks():
    assert set(CLI) == {f for f, c in CAPABILITIES.items() if c.option is not None}
    assert set(SERVER) == {f for f, c in CAPABILITIES.items() if c.field is not None}
    assert set(CAPABILITIES) == ALL_FEATURES


@pytest.mark.parametrize("feature", sorted(ALL_FEATURES))
def test_cli_translator_and_server_refuse_the_same_features(feature, engine, tmp_path):
    refused = feature not in engine.supports
    capability = CAPABILITIES[feature]
    said = {}
    if feature in CLI:
        said["cli"] = _by_cli(feature, engine, tmp_path)
    if feature in LOADING or feature in TRANSLATE:
        said["translator"] = _by_translator(feature, engine, tmp_path)
    if feature in SERVER:
        said["server"] = _by_server(feature, engine, tmp_path)
    assert said  # every feature is asked somewhere
    assert {entry: message is not None for entry, message in said.items()} == dict.fromkeys(
        said, refused
    )
    if not refused:
        return
    for message in said.values():
        assert f"the {engine.name} engine cannot do: " in message
        assert capability.why(engine.name) in message
    if "cli" in said:
        assert str(capability.option) in said["cli"]
        assert said["cli"].endswith("--engine torch does every one")
    if "server" in said:
        named = "constraints[0]: " if feature == "lexical_constraints" else ": "
        assert named in said["server"] and f"{capability.field} (" in said["server"]


@pytest.mark.parametrize(
    ("engine_name", "option"),
    [
        ("ctranslate2", "--token-scores"),
        ("ctranslate2", "--alignments"),
        ("ctranslate2", "--constraints"),
        ("onnxruntime", "--token-scores"),
        ("onnxruntime", "--alignments"),
    ],
)
def test_the_command_line_refuses_before_anything_loads_or_exports(
    engine_name, option, tmp_path, capsys
):
    """An empty directory as the checkpoint: any load or export would fail another way."""
    from aiayn.cli.main import main

    source = tmp_path / "in.txt"
    source.write_text(f"{SENTENCE}\n", encoding="utf-8")
    given = [option, str(source)] if option == "--constraints" else [option]
    argv = ["translate", "--checkpoint", str(tmp_path), "--input", str(source)]
    with pytest.raises(SystemExit):
        main([*argv, "--engine", engine_name, "--workers", "1", *given])
    err = capsys.readouterr().err
    assert f"the {engine_name} engine cannot do: {option} (" in err and err.count("\n") == 1


@pytest.mark.parametrize("engine_name", ENGINES)
def test_a_refusal_gives_the_reason_of_the_engine_in_use(engine_name):
    """No reason names another engine than the one refusing; CTranslate2's own say why it is
    CTranslate2 that cannot, the others name the engine in use where they name one."""
    other = {"ctranslate2": "ONNX Runtime", "onnxruntime": "CTranslate2"}[engine_name]
    supports = CTranslate2Engine.supports if engine_name == "ctranslate2" else OnnxEngine.supports
    refused = sorted(ALL_FEATURES - supports)
    with pytest.raises(UserError) as e:
        check_supported(refused, engine_name, supports)
    message = str(e.value)
    assert other not in message
    assert all(f"{f} ({CAPABILITIES[f].why(engine_name)})" in message for f in refused)
    assert "our int8 is not " + ENGINE_NAMES[engine_name] + "'s" in message
    if engine_name == "onnxruntime":
        assert "ONNX Runtime's graph holds whole" in message and "--quantization int8" in message
