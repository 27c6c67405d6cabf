"""``POST /translate`` with ``split``, ``markup`` and ``placeholders`` (``aiayn.serve.text``):
one answer per text, as ``translate --split`` / ``--markup`` give them."""

import dataclasses

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import aiayn  # noqa: E402
from aiayn.checkpoint import save_checkpoint  # noqa: E402
from aiayn.data import Vocab  # noqa: E402
from aiayn.serve import Adapter  # noqa: E402
from aiayn.serve.app import Limits, create_app  # noqa: E402
from aiayn.text.markup import well_formed  # noqa: E402
from aiayn.translator import Translator  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def client(tiny_corpus, tmp_path_factory):
    vocab = Vocab.load(tiny_corpus / "spm.model")
    torch.manual_seed(0)
    model = aiayn.Transformer(aiayn.ModelConfig.preset("tiny", vocab_size=len(vocab), max_len=40))
    meta = {"update": 1, "model_config": dataclasses.asdict(model.eval().cfg)}
    ckpt = save_checkpoint(tmp_path_factory.mktemp("st") / "c", 1, model, meta, None, vocab.path)
    with TestClient(
        create_app(Adapter(Translator(ckpt, workers=1, precision="fp32")), Limits())
    ) as c:
        yield c


def _texts(client, text, **options):
    answer = client.post("/translate", json={"text": text, "beam": 1, **options})
    assert answer.status_code == 200, answer.json()
    return answer.json()["translations"]


def test_split_answers_each_text_with_its_sentences_translations_joined(client):
    sentences = ["In the beginning God created.", "The earth was empty.", "He saw light."]
    alone = [t["text"] for t in _texts(client, sentences)]
    found = _texts(client, [f"  {sentences[0]}  {sentences[1]}", "", sentences[2]], split=True)
    assert [f["text"] for f in found] == [f"  {alone[0]}  {alone[1]}", "", alone[2]]
    assert [len(f["sentences"]) for f in found] == [2, 0, 1]


def test_markup_and_placeholders_come_back_verbatim_and_well_formed(client):
    text = ["Save <b>%s files</b> to {folder} now", '<a href="https://x.org">Open</a> &amp; 3']
    found = _texts(client, text, markup="xml", placeholders=True)
    for source, answer in zip(text, found):
        out = answer["text"]
        assert well_formed(out, "xml") and "alignment" not in answer
        for kept in ("<b>", "</b>", "%s", "{folder}", '<a href="https://x.org">', "&amp;", "3"):
            assert out.count(kept) >= source.count(kept), (source, out)


@pytest.mark.parametrize(
    "extra", [{"nbest": 2, "beam": 2}, {"alignments": True}, {"markup": "xml"}]
)
def test_split_and_markup_refuse_what_they_cannot_give(client, extra):
    body = {"text": ["A. B."], "split": True, **extra}
    answer = client.post("/translate", json=body)
    assert answer.status_code == 422
    assert "split, markup and placeholders give the best text" in answer.json()["error"]
