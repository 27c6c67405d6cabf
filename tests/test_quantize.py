"""int8 decoding: a trained model's outputs mostly equal fp32's, and loading never unpickles."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

import aiayn
from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.data import Vocab
from aiayn.decode import DecodeConfig, SearchRequest, beam_search, for_decoding, translate

BOS, EOS, VOCAB, LENGTH = 2, 3, 24, 6


def copy_batch(g: torch.Generator, n: int) -> torch.Tensor:
    """n sources of LENGTH random tokens + eos; the task is to output the tokens again."""
    return torch.cat(
        [torch.randint(4, VOCAB, (n, LENGTH), generator=g), torch.full((n, 1), EOS)], dim=1
    )


@pytest.fixture(scope="module")
def copy_model() -> aiayn.Transformer:
    """A 1+1-layer model trained for a few seconds to copy its source (confident, as a trained
    translator is, unlike a random model whose next-token distributions are nearly flat)."""
    torch.manual_seed(0)
    cfg = aiayn.ModelConfig(
        N_enc=1, N_dec=1, d_model=64, d_ff=128, h=4, vocab_size=VOCAB, P_drop=0.0, max_len=16
    )
    model = aiayn.Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(150):
        src = copy_batch(g, 64)
        tgt_in = torch.cat([torch.full((64, 1), BOS), src[:, :-1]], dim=1)
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in).flatten(0, 1), src.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_int8_outputs_mostly_equal_fp32(copy_model):
    # Threshold: int8 weights (one scale per output row) and per-call int8 activations move
    # each logit by about 1% of the logits' range. An output changes only where two beam
    # candidates score that close; for a model that has learnt its task that is rare, so at
    # least 95 of 100 outputs must be identical (measured: 100 of 100).
    src = copy_batch(torch.Generator().manual_seed(2), 100)
    config = DecodeConfig(beam=4, alpha=0.6, max_len_a=0, max_len_b=LENGTH + 2)
    fp32 = [h[0].tokens for h in beam_search(copy_model, src, config)]
    correct = sum(out == row[:-1] for out, row in zip(fp32, src.tolist()))
    assert correct >= 90, f"the fp32 model copies only {correct}/100: not trained enough to test"
    int8_model = for_decoding(_clone(copy_model), "int8")
    assert isinstance(int8_model.generator, torch.ao.nn.quantized.dynamic.Linear)
    int8 = [h[0].tokens for h in beam_search(int8_model, src, config)]
    same = sum(a == b for a, b in zip(fp32, int8))
    assert same >= 95, f"{same}/100 int8 outputs equal fp32"


def _clone(model: aiayn.Transformer) -> aiayn.Transformer:
    clone = aiayn.Transformer(model.cfg)
    clone.load_state_dict(model.state_dict())
    return clone.eval()


def test_unknown_quantization_is_named():
    with pytest.raises(ValueError, match="'int4'.*int8"):
        for_decoding(aiayn.Transformer(aiayn.ModelConfig.preset("tiny")), "int4")


def test_int8_translate_loads_without_pickle(tiny_corpus, tmp_path, monkeypatch, capsys):
    vocab = Vocab.load(tiny_corpus / "spm.model")
    torch.manual_seed(0)
    model = aiayn.Transformer(
        aiayn.ModelConfig.preset("tiny", vocab_size=len(vocab), P_drop=0.0)
    ).eval()
    ckpt = save_checkpoint(
        tmp_path / "ckpts",
        1,
        model,
        {"model_config": dataclasses.asdict(model.cfg)},
        None,
        vocab.path,
    )
    (tmp_path / "in.txt").write_text("In the beginning.\n\nAnd God said.\n", encoding="utf-8")

    def refuse(*args, **kwargs):
        raise AssertionError("an int8 model must load without unpickling anything")

    for target, name in (
        (pickle, "load"),
        (pickle, "loads"),
        (pickle, "Unpickler"),
        (torch, "load"),
    ):
        monkeypatch.setattr(target, name, refuse)
    main(
        [
            "translate",
            "--checkpoint",
            str(ckpt),
            "--input",
            str(tmp_path / "in.txt"),
            "--quantize",
            "int8",
            "--beam",
            "2",
        ]
    )
    lines = capsys.readouterr().out.split("\n")
    # the int8 library's translations, the blank line blank
    int8 = for_decoding(_clone(model), "int8")
    text = ["In the beginning.", "", "And God said."]
    assert lines == [*translate(int8, text, vocab, SearchRequest(DecodeConfig(beam=2))), ""]
    assert lines[0] and lines[1] == "" and lines[2]
