"""The source-reading diagnostics tell a collapsed encoder from a working one."""

import dataclasses
import json

import pytest
import torch

import aiayn
from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.data import Vocab
from aiayn.diagnose import encoder_spread, source_sensitivity

SOURCES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "And God said, Let there be light: and there was light.",
]
REFERENCES = [
    "En el principio creó Dios los cielos y la tierra.",
    "Y la tierra estaba desordenada y vacía.",
    "Y dijo Dios: Sea la luz: y fue la luz.",
]


def _model(vocab: Vocab) -> aiayn.Transformer:
    torch.manual_seed(0)
    cfg = aiayn.ModelConfig(
        N_enc=2, N_dec=1, d_model=32, d_ff=64, h=4, vocab_size=len(vocab), P_drop=0.0
    )
    return aiayn.Transformer(cfg).eval()


def _collapse(model: aiayn.Transformer) -> None:
    """Make the last encoder layer's final LayerNorm output its bias alone: every position the
    same vector, the state the 30-minute parser trained itself into."""
    with torch.no_grad():
        norm = model.encoder[-1].ffn_norm
        norm.weight.zero_()
        norm.bias.normal_()


@pytest.fixture(scope="module")
def vocab(tiny_corpus):
    return Vocab.load(tiny_corpus / "spm.model")


def test_a_collapsed_encoder_has_no_spread_and_ignores_the_source(vocab):
    model = _model(vocab)
    working = encoder_spread(model, vocab, SOURCES)
    assert len(working) == 2 and min(working) > 0.3
    fresh = source_sensitivity(model, vocab, SOURCES, REFERENCES)
    assert fresh["ppl_rotated"] != pytest.approx(fresh["ppl_true"], rel=1e-4)

    _collapse(model)
    collapsed = encoder_spread(model, vocab, SOURCES)
    assert collapsed[0] == pytest.approx(working[0]) and collapsed[1] < 1e-5
    ignored = source_sensitivity(model, vocab, SOURCES, REFERENCES)
    assert ignored["ratio"] == pytest.approx(1.0, abs=1e-5)


def test_sensitivity_needs_two_sentences(vocab):
    with pytest.raises(ValueError, match="at least two sentences"):
        source_sensitivity(_model(vocab), vocab, SOURCES[:1], REFERENCES[:1])


def test_diagnose_command_reports_both(vocab, tmp_path, capsys):
    model = _model(vocab)
    _collapse(model)
    meta = {"update": 1, "model_config": dataclasses.asdict(model.cfg)}
    ckpt = save_checkpoint(tmp_path / "ckpts", 1, model, meta, None, vocab.path)
    (tmp_path / "src").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    main(
        [
            "diagnose",
            "--checkpoint",
            str(ckpt),
            "--src",
            str(tmp_path / "src"),
            "--ref",
            str(tmp_path / "ref"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["ratio"] == pytest.approx(1.0, abs=1e-5) and report["encoder_spread"][-1] < 1e-5
