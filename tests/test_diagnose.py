"""The source-reading diagnostics tell a collapsed encoder from a working one."""

import copy
import dataclasses
import json

import pytest
import torch

import aiayn
from aiayn.analysis.diagnose import encoder_spread, source_sensitivity
from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.data import Vocab
from aiayn.evaluate import reference_perplexity

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


def _spread(x: torch.Tensor) -> float:
    """The formula of encoder_spread's docstring, for one sentence: x (1, S, d_model)."""
    return float((x - x.mean(dim=1, keepdim=True)).norm(dim=-1).mean() / x.norm(dim=-1).mean())


def _encoded(model: aiayn.Transformer, vocab: Vocab) -> list[float]:
    with torch.no_grad():
        return [_spread(model.encode(torch.tensor([vocab.encode_source(s)]))) for s in SOURCES]


def test_encoder_spread_measures_what_encode_returns(vocab):
    """Pre-LN (a final LayerNorm) and a restricted window (a mask): the layers alone, without
    mask and norm, are another encoder than the one the decoder reads."""
    torch.manual_seed(0)
    cfg = aiayn.ModelConfig(
        N_enc=2,
        N_dec=1,
        d_model=32,
        d_ff=64,
        h=4,
        vocab_size=len(vocab),
        P_drop=0.0,
        norm="pre",
        attention_window=2,
    )
    model = aiayn.Transformer(cfg).eval()
    spreads = encoder_spread(model, vocab, SOURCES)
    first_only = copy.deepcopy(model)  # the state after layer 1, as encode would return it
    first_only.encoder = first_only.encoder[:1]
    first_only.enc_norm = torch.nn.Identity()
    expected = [sum(_encoded(m, vocab)) / len(SOURCES) for m in (first_only, model)]
    assert spreads == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "measure",
    [
        lambda model, vocab: encoder_spread(model, vocab, SOURCES),
        lambda model, vocab: reference_perplexity(model, vocab, SOURCES, REFERENCES),
    ],
    ids=["encoder_spread", "reference_perplexity"],
)
def test_measurements_run_without_dropout_and_restore_the_mode(vocab, measure):
    torch.manual_seed(0)
    cfg = aiayn.ModelConfig(
        N_enc=2, N_dec=1, d_model=32, d_ff=64, h=4, vocab_size=len(vocab), P_drop=0.5
    )
    model = aiayn.Transformer(cfg)
    evaluated = measure(model.eval(), vocab)
    assert not model.training
    model.train()
    assert measure(model, vocab) == evaluated  # no dropout while measuring
    assert model.training and all(m.training for m in model.modules())
