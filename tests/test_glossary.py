"""Glossaries (``aiayn.text.glossary``): the matching rules, the refusals naming a file's line,
and every term whose source occurs ending up in the output, through ``aiayn.Translator``, the
command line and the server; target languages: a model's ``>>xx<<`` tokens listed and
checked, sources tagged, and ``prepare``'s per-corpus tags recorded. The models are seeded
random tiny Transformers on a vocabulary trained here: their outputs are nonsense, so every
term found in them was put there by the constraints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.checkpoint import read_meta, save_checkpoint
from aiayn.cli.main import main
from aiayn.data import Vocab
from aiayn.data.corpora import Corpus
from aiayn.data.pieces import TwoModelVocab
from aiayn.data.prepare import prepare_corpus
from aiayn.data.vocab import target_languages
from aiayn.decode.config import CONSTRAINED_BEAM
from aiayn.errors import UserError
from aiayn.records import load_records
from aiayn.text.glossary import Glossary

pytestmark = pytest.mark.usefixtures("one_thread")

ENGLISH = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good.",
    "And the evening and the morning were the first day.",
    "And God called the dry land Earth.",
]
SPANISH = [
    "En el principio creó Dios los cielos y la tierra.",
    "Y dijo Dios: Sea la luz: y fue la luz.",
    "Y vió Dios que la luz era buena.",
    "Y fué la tarde y la mañana un día.",
    "Y llamó Dios á la seca Tierra.",
]
GERMAN = [
    "Am Anfang schuf Gott Himmel und Erde.",
    "Und Gott sprach: Es werde Licht! Und es ward Licht.",
    "Und Gott sah, dass das Licht gut war.",
    "Da ward aus Abend und Morgen der erste Tag.",
    "Und Gott nannte das Trockene Erde.",
]
TERMS = {"God": "Dios", "light": "luz", "earth": "tierra", "evening": "tarde"}


def _checkpoint(root: Path, symbols: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    vocab = Vocab.train(
        (ENGLISH + SPANISH + GERMAN) * 4, root / "spm", 150, num_threads=1,
        user_defined_symbols=symbols,
    )  # fmt: skip
    torch.manual_seed(0)
    config = aiayn.ModelConfig.preset("tiny", vocab_size=len(vocab), max_len=48)
    model = aiayn.Transformer(config).eval()
    meta = {"update": 1, "model_config": dataclasses.asdict(model.cfg)}
    return save_checkpoint(root / "ckpts", 1, model, meta, None, vocab.path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A model of one target language: no language tokens."""
    return _checkpoint(tmp_path_factory.mktemp("glossary"), [])


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory) -> Path:
    """A model whose vocabulary has two target-language tokens, as prepare makes them."""
    return _checkpoint(tmp_path_factory.mktemp("multilingual"), [">>de<<", ">>es<<"])


@pytest.fixture(scope="module")
def translator(checkpoint):
    with aiayn.Translator(checkpoint, workers=1) as t:
        yield t


# --- Matching ----------------------------------------------------------------------------


def test_terms_match_whole_words_case_sensitively_longest_first():
    glossary = Glossary.of(
        [["cat", "gato"], ["New York", "Nueva York"], ["New York City", "Ciudad de Nueva York"]],
        "glossary",
    )
    found = glossary.matches("The category of cat: New  York City, not new york; cat again.")
    assert [t.pair() for t in found] == [("cat", "gato"), ("New York City", "Ciudad de Nueva York")]
    assert glossary.matches("Cat, cats and concatenate") == ()
    assert [t.source for t in glossary.matches("New York.")] == ["New York"]


def test_a_request_glossary_overrides_the_servers_for_a_shared_source():
    server = Glossary.of({"God": "Dios", "light": "luz"}, "server")
    merged = server.merged(Glossary.of({"light": "lumbre"}, "glossary"))
    assert sorted(t.pair() for t in merged.terms) == [("God", "Dios"), ("light", "lumbre")]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("God\tDios\nlight luz\n", "line 2: 0 tabs"),
        ("God\tDios\tDeus\n", "line 1: 2 tabs"),
        ("God\tDios\n\n \tluz\n", "line 3: the source is blank"),
        ("God\t \n", "line 1: the target is blank"),
        ("God\tDios\nGod\tSeñor\n", "line 2: 'God' again, with another target"),
        ("\n\n", "no terms"),
    ],
)
def test_a_bad_glossary_line_is_refused_naming_it(tmp_path, text, problem):
    path = tmp_path / "g.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=problem) as err:
        Glossary.read(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_a_target_the_vocabulary_cannot_spell_is_refused_naming_its_line(translator, tmp_path):
    path = tmp_path / "g.tsv"
    path.write_text("God\tDios\nwhale\txeno\n", encoding="utf-8")  # no "x" in the corpus
    with pytest.raises(UserError, match=rf"^{path}: line 2: the target 'xeno' has .*'x'"):
        translator.request(glossary=str(path))


# --- Applied -------------------------------------------------------------------------------


def test_every_term_whose_source_occurs_is_in_the_output(translator):
    results = translator.translate(ENGLISH, glossary=TERMS, beam=2)
    # God, earth | God, light | God, light | evening | God ("Earth" is not "earth")
    assert [[s for s, _ in r.glossary] for r in results] == [
        ["God", "earth"], ["God", "light"], ["God", "light"], ["evening"], ["God"]
    ]  # fmt: skip
    present = sum(t in r.text for r in results for _, t in r.glossary)
    assert present == sum(len(r.glossary) for r in results) == 8
    plain = translator.translate(ENGLISH, beam=2)
    assert sum(t in p.text for p, r in zip(plain, results) for _, t in r.glossary) < 8
    assert all(r.glossary is None for r in plain)


def test_the_command_line_applies_a_glossary_and_counts_it(checkpoint, tmp_path, capsys):
    glossary, source = tmp_path / "g.tsv", tmp_path / "in.en"
    glossary.write_text("".join(f"{s}\t{t}\n" for s, t in TERMS.items()), encoding="utf-8")
    source.write_text("".join(line + "\n" for line in ENGLISH), encoding="utf-8")
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(source), "--workers"]
    main([*argv, "1", "--beam", "2", "--glossary", str(glossary), "--format", "jsonl"])
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["glossary"] for r in records][0] == [["God", "Dios"], ["earth", "tierra"]]
    for record in records:
        assert all(t in record["hypotheses"][0]["text"] for _, t in record["glossary"])
    applied = sum(len(r["glossary"]) for r in records)
    assert f"--glossary {glossary}: {applied} term(s) applied in 5 of 5 line(s)" in err


def test_the_glossary_is_refused_with_a_shortlist_and_with_split(checkpoint, tmp_path, capsys):
    translator = aiayn.Translator(checkpoint, workers=1)
    with pytest.raises(UserError, match="shortlist and glossary cannot be combined"):
        translator.request(glossary=TERMS, shortlist=str(tmp_path / "none"))
    request = translator.request(glossary=TERMS)
    with pytest.raises(UserError, match="glossary constrains whole sentences"):
        translator.best_lines(ENGLISH, request, lambda lines: lines)


def test_a_glossary_or_constraints_widen_the_beam_unless_one_is_given(translator):
    # the banks of dynamic beam allocation share the beam: the paper's 4 leaves each one place
    assert translator.request().decode.beam == 4
    assert translator.request(glossary=TERMS).decode.beam == CONSTRAINED_BEAM == 8
    assert translator.request(constraints=True).decode.beam == CONSTRAINED_BEAM
    assert translator.request(glossary=TERMS, beam=3).decode.beam == 3
    assert translator.request(prefixes=True).decode.beam == 4  # a prefix alone has no banks
    assert translator.request(preset="parsing", constraints=True).decode.beam == 21


def test_the_server_applies_its_glossary_and_the_requests(checkpoint, tmp_path):
    from fastapi.testclient import TestClient

    from aiayn.serve import Adapter, Limits, create_app

    path = tmp_path / "g.tsv"
    path.write_text("God\tDios\nlight\tluz\n", encoding="utf-8")
    adapter = Adapter(aiayn.Translator(checkpoint, workers=1, precision="fp32"), str(path))
    with TestClient(create_app(adapter, Limits())) as client:
        body = {"text": ENGLISH[1:3], "beam": 2, "glossary": {"light": "tierra"}}
        answer = client.post("/translate", json=body).json()["translations"]
        assert [a["glossary"] for a in answer] == [[["God", "Dios"], ["light", "tierra"]]] * 2
        assert all("Dios" in a["text"] and "tierra" in a["text"] for a in answer)
        bad = client.post("/translate", json={"text": ["God"], "glossary": [["whale", "xeno"]]})
        assert bad.status_code == 422
        assert bad.json()["error"].startswith("glossary[0]: the target 'xeno'")


# --- Target languages ------------------------------------------------------------------------


def test_a_models_languages_are_its_language_tokens(multilingual, translator):
    multi = aiayn.Translator(multilingual, workers=1)
    assert multi.target_languages() == ("de", "es")
    assert translator.target_languages() == ()
    with pytest.raises(UserError, match=r"target_lang fr: .* translates into de, es$"):
        multi.request(target_lang="fr")
    with pytest.raises(UserError, match="target_lang es: .* has no target-language tokens"):
        translator.request(target_lang="es")
    request = multi.request(target_lang="es")
    ids = multi.sources_vocab(request).encode_source(ENGLISH[0])
    assert ids[: len(ids) - len(multi.vocab.encode_source(ENGLISH[0]))] == multi.vocab.encode(
        ">>es<<"
    )
    into = {code: multi.translate(ENGLISH[:2], target_lang=code) for code in ("de", "es")}
    assert [r.text for r in into["de"]] != [r.text for r in into["es"]]


def test_the_command_line_and_server_check_the_code(multilingual, capsys):
    from fastapi.testclient import TestClient

    from aiayn.serve import Adapter, Limits, create_app

    with pytest.raises(SystemExit):
        main(["evaluate", "--checkpoint", str(multilingual), "--src", "x", "--ref", "x"]
             + ["--target-lang", "fr"])  # fmt: skip
    assert "--target-lang fr: " in capsys.readouterr().err
    adapter = Adapter(aiayn.Translator(multilingual, workers=1, precision="fp32"))
    with TestClient(create_app(adapter, Limits())) as client:
        ok = client.post("/translate", json={"text": ["God"], "target_lang": "de"})
        bad = client.post("/translate", json={"text": ["God"], "target_lang": "fr"})
        info = client.get("/info").json()
    assert info["target_langs"] == ["de", "es"] and info["glossary"] is None
    assert ok.status_code == 200 and bad.status_code == 422
    assert bad.json()["error"] == "target_lang fr: the model translates into de, es"


def test_an_imported_models_codes_are_recorded_and_listed(tmp_path):
    from aiayn.export.marian_import import write_imported

    spm = Vocab.train(ENGLISH + SPANISH, tmp_path / "spm", 80, num_threads=1)
    pieces = [spm.id_to_piece(i) for i in range(len(spm))] + [">>spa<<", ">>deu<<"]
    torch.manual_seed(0)
    model = aiayn.Transformer(aiayn.ModelConfig.preset("tiny", vocab_size=len(pieces), max_len=32))
    out = write_imported(model, pieces, (spm.path, spm.path), tmp_path, tmp_path / "ckpt")
    assert read_meta(out)["target_langs"] == ["spa", "deu"]
    assert target_languages(TwoModelVocab(out / "pieces.json")) == ("spa", "deu")
    imported = aiayn.Translator(out, workers=1)
    with pytest.raises(UserError, match="translates into spa, deu"):
        imported.request(target_lang="fra")
    request = imported.request(target_lang="deu")
    assert imported.sources_vocab(request).encode_source("God")[0] == len(pieces) - 1


def test_prepare_tags_each_corpus_and_records_its_languages(tmp_path):
    def pair(name: str, src: list[str], tgt: list[str], **keys: str) -> Corpus:
        (tmp_path / f"{name}.src").write_text("\n".join(src * 6) + "\n", encoding="utf-8")
        (tmp_path / f"{name}.tgt").write_text("\n".join(tgt * 6) + "\n", encoding="utf-8")
        spec = {"src": str(tmp_path / f"{name}.src"), "tgt": str(tmp_path / f"{name}.tgt")}
        return Corpus.from_dict({**spec, "name": name, **keys}, name)

    splits = {
        "train": [pair("es", ENGLISH, SPANISH, tag="es"), pair("de", ENGLISH, GERMAN, tag="de")],
        "test": [pair("test", ENGLISH[:2], GERMAN[:2], tag="de")],
    }
    meta = prepare_corpus(splits, tmp_path / "data", vocab_size=120, num_threads=1)
    assert meta["record"]["target_langs"] == ["es", "de"]
    assert target_languages(Vocab.load(tmp_path / "data" / "spm.model")) == ("es", "de")
    tested = (tmp_path / "data" / "test.src.txt").read_text(encoding="utf-8").splitlines()
    assert tested == [f">>de<< {line}" for line in ENGLISH[:2]] * 6
    with pytest.raises(UserError, match="tag must be the target language's code"):
        Corpus.from_dict({"tsv": "x", "tag": "Spanish!"}, "--corpus tsv=x,tag=Spanish!")


# --- The goal's script -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bible_checkpoint(tiny_corpus, tmp_path_factory) -> Path:
    """A seeded random tiny model on the bundled corpus's 300-piece vocabulary."""
    vocab = Vocab.load(tiny_corpus / "spm.model")
    torch.manual_seed(0)
    model = aiayn.Transformer(aiayn.ModelConfig.preset("tiny", vocab_size=len(vocab), max_len=64))
    meta = {"update": 1, "model_config": dataclasses.asdict(model.cfg)}
    return save_checkpoint(tmp_path_factory.mktemp("bible"), 1, model, meta, None, vocab.path)


def test_the_glossary_bleu_script_counts_every_term_and_records_bleu(bible_checkpoint, tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import glossary_bleu

    drawn = tmp_path / "terms.tsv"
    argv = ["--checkpoint", str(bible_checkpoint), "--terms", "6", "--pairs", "1500"]
    argv += ["--limit", "6", "--beam", "1", "--workers", "1", "--glossary-out", str(drawn)]
    assert glossary_bleu.main([*argv, "--record", str(tmp_path / "records")]) == 0
    terms = Glossary.read(drawn)
    assert 0 < len(terms.terms) <= 6 and all(len(t.source) >= 4 for t in terms.terms)
    (record,) = load_records(tmp_path / "records")
    figures = record.figures
    assert figures["applied"] == figures["in the output"] > 0
    change = figures["SacreBLEU with"] - figures["SacreBLEU without"]
    assert abs(figures["change"] - change) <= 0.011  # each rounded to 2 decimals
