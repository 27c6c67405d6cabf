"""The Hugging Face export: MarianMT logits equal ours, the tokenizer is ours, generate agrees."""

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the hf export needs transformers: pip install -e '.[export]'"
)

from _export_models import corpus_lines, seeded_model, trained_like_model  # noqa: E402

from aiayn import ModelConfig, Transformer  # noqa: E402
from aiayn.data import Vocab  # noqa: E402
from aiayn.decode import DecodeConfig, SearchRequest, decode_ids  # noqa: E402
from aiayn.export import ExportError  # noqa: E402
from aiayn.export.hf import export_hf, marian_permutation  # noqa: E402
from aiayn.model import sinusoidal_encoding  # noqa: E402


@pytest.fixture(scope="module")
def vocab(tiny_corpus):
    return Vocab.load(tiny_corpus / "spm.model")


@pytest.mark.parametrize("d_model", [32, 256])
def test_marians_positions_are_ours_permuted(d_model):
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    marian = MarianSinusoidalPositionalEmbedding(300, d_model).create_weight()
    ours = sinusoidal_encoding(300, d_model)[:, marian_permutation(d_model)]
    torch.testing.assert_close(ours, marian, atol=1e-6, rtol=0)
    assert not torch.allclose(
        sinusoidal_encoding(300, d_model), marian, atol=1e-3
    )  # the layouts differ


@pytest.mark.parametrize(
    "preset, overrides",
    [("tiny", {}), ("tiny", {"share_embeddings": False}), ("demo", {})],
    ids=["tiny", "tiny-unshared", "demo-shape"],
)
@pytest.mark.slow
def test_logits_equal_ours_on_padded_real_sentences(vocab, tmp_path, preset, overrides):
    model = seeded_model(len(vocab), preset, **overrides)
    out = export_hf(model, vocab, tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    marian = transformers.MarianMTModel.from_pretrained(out).eval()
    batch = tokenizer(corpus_lines("test", 0, 6), padding=True, return_tensors="pt")
    assert (batch.input_ids == vocab.pad_id).any()  # the batch really is padded
    refs = [vocab.encode(line)[:20] for line in corpus_lines("test", 1, 6)]
    tgt_in = torch.full((len(refs), 21), vocab.pad_id)
    for row, ref in enumerate(refs):
        tgt_in[row, : len(ref) + 1] = torch.tensor([vocab.bos_id] + ref)
    with torch.no_grad():
        ours = model(batch.input_ids, tgt_in)
        theirs = marian(**batch, decoder_input_ids=tgt_in).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


def test_tokenizer_round_trips_unicode(tmp_path, vocab):
    lines = corpus_lines("train", 0, 200) + corpus_lines("train", 1, 200)
    byte_vocab = Vocab.train(lines, tmp_path / "spm", vocab_size=400, byte_fallback=True)
    out = export_hf(
        Transformer(ModelConfig.preset("tiny", vocab_size=400)), byte_vocab, tmp_path / "hf"
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    for text in [
        "¿Dónde está el niño? «Ñandú» — naïve café",
        "日本語の文 🙂 Ελληνικά",
        "In the beginning",
    ]:
        ids = tokenizer(text).input_ids
        assert ids == byte_vocab.encode(text) + [byte_vocab.eos_id]
        assert tokenizer.decode(ids, skip_special_tokens=True) == byte_vocab.decode(ids) == text


def test_greedy_generate_equals_our_greedy_search(vocab, tmp_path):
    model = trained_like_model(len(vocab))
    out = export_hf(model, vocab, tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    marian = transformers.MarianMTModel.from_pretrained(out).eval()
    lines = corpus_lines("test", 0, 8)
    batch = tokenizer(lines, padding=True, return_tensors="pt")
    generated = marian.generate(**batch, num_beams=1, max_new_tokens=12, max_length=None)
    theirs = [row[1:] for row in generated.tolist()]  # without the decoder start (bos)
    ours = decode_ids(
        model,
        [vocab.encode(line) + [vocab.eos_id] for line in lines],
        SearchRequest(DecodeConfig(beam=1, max_len_a=0, max_len_b=12)),
    )
    ours = [h[0].tokens + ([vocab.eos_id] if h[0].length > len(h[0].tokens) else []) for h in ours]
    assert any(vocab.eos_id in row for row in ours) and any(len(row) == 12 for row in ours)
    assert [row[: len(o)] for row, o in zip(theirs, ours)] == ours
    assert all(set(row[len(o) :]) <= {vocab.pad_id} for row, o in zip(theirs, ours))


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"norm": "pre"}, "pre-LN"),
        ({"positional": "learned"}, "learned"),
        ({"scale_attention": False}, "scale_attention=False"),
        ({"attention_window": 4}, "restricted attention"),
        ({"d_k": 4, "d_v": 4}, "d_k=4"),
    ],
)
def test_refuses_what_marian_cannot_represent(vocab, tmp_path, overrides, named):
    model = Transformer(ModelConfig.preset("tiny", vocab_size=len(vocab), **overrides))
    with pytest.raises(ExportError, match=f"MarianMT cannot represent this model: .*{named}"):
        export_hf(model, vocab, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
