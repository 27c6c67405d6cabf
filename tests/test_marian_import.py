"""``aiayn import``: a MarianMT directory shaped like OPUS-MT (swish, an output bias, a source and
a target SentencePiece model over one table, a decoder that starts from pad) becomes a
checkpoint that computes transformers' logits, searches as ``generate`` does, exports back
to the same model and fine-tunes on new text."""

import copy
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from _export_models import corpus_lines

from aiayn.checkpoint import load_translator, read_meta
from aiayn.cli.main import main
from aiayn.data.pieces import TwoModelVocab
from aiayn.decode import DecodeConfig, SearchRequest, decode_ids
from aiayn.decode.rules import SEARCH_RULES
from aiayn.export.common import ExportError
from aiayn.export.marian_import import import_marian, marian_to_transformer

transformers = pytest.importorskip("transformers")

SENTENCES, LIMIT, BEAM, ALPHA = 200, 24, 4, 0.6


def train_spm(lines: list[str], prefix: Path) -> Path:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        model_type="unigram",
        vocab_size=120,
        minloglevel=2,
        num_threads=1,
    )
    return prefix.with_suffix(".model")


def marian_vocab(models: list[Path]) -> dict[str, int]:
    """Marian's joint table as its converter writes it: eos 0, unk 1, the pieces, pad last."""
    table = {"</s>": 0, "<unk>": 1}
    for path in models:
        sp = spm.SentencePieceProcessor(model_file=str(path))
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                table.setdefault(sp.id_to_piece(i), len(table))
    table["<pad>"] = len(table)
    return table


@pytest.fixture(scope="module")
def opus(tmp_path_factory):
    """A save_pretrained MarianMT directory like OPUS-MT's, random weights (seed 0)."""
    root = tmp_path_factory.mktemp("opus")
    src_model = train_spm(corpus_lines("train", 0, 1500), root / "source")
    tgt_model = train_spm(corpus_lines("train", 1, 1500), root / "target")
    table = marian_vocab([src_model, tgt_model])
    pad = table["<pad>"]
    (root / "vocab.json").write_text(json.dumps(table), encoding="utf-8")
    config = transformers.MarianConfig(
        vocab_size=len(table),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=256,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        init_std=0.2,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
        model.model.shared.weight[0] *= 8.0  # eos decisive now and then: outputs of varied lengths
    out = root / "marian"
    model.save_pretrained(out)
    tokenizer = transformers.MarianTokenizer(
        source_spm=str(src_model), target_spm=str(tgt_model), vocab=str(root / "vocab.json")
    )
    tokenizer.save_pretrained(out)
    return out, model, tokenizer


@pytest.fixture(scope="module")
def imported(opus, tmp_path_factory):
    out = import_marian(opus[0], tmp_path_factory.mktemp("imported") / "ckpt")
    model, vocab = load_translator(out)
    _, layout = marian_to_transformer(opus[0])
    return out, model, vocab, layout


def marian_ids(layout, ours: list[int]) -> list[int]:
    return [layout.order[i] for i in ours]


def hf_logits(model, src: torch.Tensor, tgt_in: torch.Tensor, pad: int) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=src, attention_mask=src != pad, decoder_input_ids=tgt_in).logits


def test_the_tokenisers_agree_side_by_side(opus, imported):
    _, _, tokenizer = opus
    _, _, vocab, layout = imported
    assert isinstance(vocab, TwoModelVocab)
    for src, tgt in zip(corpus_lines("test", 0, 50), corpus_lines("test", 1, 50)):
        assert marian_ids(layout, vocab.encode_source(src)) == tokenizer(src).input_ids
        theirs = tokenizer(text_target=tgt).input_ids
        assert marian_ids(layout, vocab.encode_target(tgt) + [vocab.eos_id]) == theirs
        if vocab.unk_id in vocab.encode_target(tgt):
            continue  # HF drops an unknown piece (a special token), we show it as " ⁇ "
        assert vocab.decode(vocab.encode_target(tgt)) == tokenizer.decode(
            theirs, skip_special_tokens=True
        )
    # a leading language code (multilingual OPUS-MT) is one piece, as MarianTokenizer has it
    coded = ">>es<< " + corpus_lines("test", 0, 1)[0]
    assert marian_ids(layout, vocab.encode_source(coded)) == tokenizer(coded).input_ids
    assert vocab.encode_source(coded)[0] == vocab.unk_id  # this table has no such code
    # the two sides are split by different models: English text cut differently
    line = corpus_lines("test", 0, 1)[0]
    assert vocab.encode(line, "source") != vocab.encode(line, "target")


def test_a_piece_the_target_model_lacks_prints_as_marian_tokenizer_prints_it(opus, imported):
    """A source-only piece of the joint table, output by the model: its word mark a space."""
    _, _, tokenizer = opus
    _, _, vocab, layout = imported
    target = vocab.models["target"]
    foreign = [
        i
        for i, p in enumerate(vocab.pieces)
        if p.startswith("\u2581") and len(p) > 2 and target.piece_to_id(p) == target.unk_id()
    ]
    known = [i for i in vocab.encode_target("i father") if i != vocab.unk_id]
    assert foreign and known
    for ids in (known + foreign[:2], foreign[:1] + known, foreign[:3]):
        text = vocab.decode(ids)
        assert "\u2581" not in text
        assert text == tokenizer.decode(marian_ids(layout, ids), skip_special_tokens=True)


def test_imported_logits_equal_transformers(opus, imported):
    """In float64, so that what is compared is the mapping: in float32 the two
    implementations' orders of summation differ by more than 1e-5 on logits near 10, which
    the boosted eos row reaches (float32 is compared to 1e-4)."""
    _, hf, tokenizer = opus
    _, model, vocab, layout = imported
    pad = hf.config.pad_token_id
    sources = corpus_lines("test", 0, 8)
    targets = corpus_lines("test", 1, 8)
    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    tgt = batch["labels"].masked_fill(batch["labels"] == -100, pad)
    tgt_in = torch.cat([torch.full((len(sources), 1), pad), tgt[:, :-1]], dim=1)
    to_ours = {m: i for i, m in enumerate(layout.order)}
    ours_tgt = tgt_in.clone().apply_(to_ours.get)  # the decoder's start (Marian's pad): our bos
    padding = batch["input_ids"] == pad
    ours_src = batch["input_ids"].clone().apply_(to_ours.get).masked_fill(padding, vocab.pad_id)
    real = [i for i, m in enumerate(layout.order) if m >= 0]  # all but our own pad row
    order = torch.tensor([layout.order[i] for i in real])
    assert model.cfg.activation == "swish" and model.cfg.output_bias
    for dtype, atol in ((torch.float64, 1e-5), (torch.float32, 1e-4)):
        theirs = hf_logits(copy.deepcopy(hf).to(dtype), batch["input_ids"], tgt_in, pad)
        with torch.no_grad():
            mine = copy.deepcopy(model).to(dtype)(ours_src, ours_tgt)
        assert torch.allclose(mine[..., real], theirs[..., order], atol=atol, rtol=0)
        # our pad row takes no probability: every other log-probability is Marian's
        lp, their_lp = torch.log_softmax(mine, -1)[..., real], torch.log_softmax(theirs, -1)
        assert torch.allclose(lp, their_lp[..., order], atol=atol, rtol=0)


def generate(hf, sources: list[list[int]], pad: int) -> list[list[int]]:
    """transformers' beam search on Marian ids, as OPUS-MT's generation config runs it (pad
    never generated), each output without its start token and eos."""
    outputs = []
    for start in range(0, len(sources), 50):
        chunk = sources[start : start + 50]
        width = max(map(len, chunk))
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in chunk])
        with torch.no_grad():
            rows = hf.generate(
                input_ids=ids,
                attention_mask=ids != pad,
                num_beams=BEAM,
                length_penalty=ALPHA,
                early_stopping=False,
                max_length=LIMIT + 1,
                bad_words_ids=[[pad]],
                forced_eos_token_id=None,
            ).tolist()
        for row in rows:
            row = row[1:]
            outputs.append(row[: row.index(0)] if 0 in row else [t for t in row if t != pad])
    return outputs


def test_hf_rules_equal_generate_on_200_sentences(opus, imported):
    _, hf, tokenizer = opus
    _, model, vocab, layout = imported
    lines = corpus_lines("train", 0, SENTENCES)
    sources = [vocab.encode_source(line, max_len=128) for line in lines]
    rules = replace(SEARCH_RULES["hf"], max_len=LIMIT)
    found = decode_ids(
        model, sources, SearchRequest(DecodeConfig(beam=BEAM, alpha=ALPHA, rules=rules))
    )
    mine = [marian_ids(layout, vocab.content_ids(h[0].tokens)) for h in found]
    assert min(map(len, mine)) < LIMIT - 1 and max(map(len, mine)) >= LIMIT - 1  # eos, and cut
    assert generate(hf, [marian_ids(layout, s) for s in sources], hf.config.pad_token_id) == mine


def test_hf_rules_take_the_models_own_generation_settings(opus, tmp_path, capsys):
    """Imported, the model's generation_config.json (beam 3, max_length, transformers'
    length penalty 1.0) is the checkpoint's search under --search-rules hf: translate finds
    what generate() finds with no options; options given still win."""
    from aiayn import Translator

    _, _, tokenizer = opus
    copy, pad = tmp_path / "marian", opus[1].config.pad_token_id
    shutil.copytree(opus[0], copy)
    settings = {"num_beams": 3, "max_length": LIMIT + 1, "bad_words_ids": [[pad]]}
    settings |= {"decoder_start_token_id": pad, "pad_token_id": pad, "eos_token_id": 0}
    (copy / "generation_config.json").write_text(json.dumps(settings))
    main(["import", str(copy), "--out", str(tmp_path / "ckpt")])
    lines = corpus_lines("test", 0, 8)
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    args = [
        "translate",
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--input",
        str(tmp_path / "in.txt"),
    ]
    main([*args, "--quiet", "--search-rules", "hf"])
    mine = capsys.readouterr().out.splitlines()
    hf = transformers.MarianMTModel.from_pretrained(copy).eval()
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = tokenizer.batch_decode(hf.generate(**batch), skip_special_tokens=True)
    assert mine == theirs
    with Translator(tmp_path / "ckpt") as translator:
        own = translator.request(rules="hf").decode
        assert (own.beam, own.alpha, own.rules.max_len) == (3, 1.0, LIMIT)
        given = translator.request(rules="hf", beam=5, alpha=0.6).decode
        assert (given.beam, given.alpha, given.rules.max_len) == (5, 0.6, LIMIT)
        paper = translator.request().decode
        assert (paper.beam, paper.alpha, paper.rules) == (4, 0.6, SEARCH_RULES["paper"])


@pytest.mark.parametrize(
    "settings, warned",
    [({"do_sample": True}, "do_sample=True"), ({"bad_words_ids": [[5, 6]]}, "bad_words_ids")],
)
def test_import_warns_of_generation_settings_the_search_does_not_do(
    opus, tmp_path, settings, warned
):
    copy = tmp_path / "marian"
    shutil.copytree(opus[0], copy)
    (copy / "generation_config.json").write_text(json.dumps(settings))
    with pytest.warns(UserWarning, match=re.escape(warned)):
        import_marian(copy, tmp_path / "out")
    (copy / "generation_config.json").write_text(json.dumps({"max_length": 1}))
    with pytest.raises(ExportError, match=r"max_length=1 is not a setting generate\(\) can run"):
        import_marian(copy, tmp_path / "again")


def nbest(model, sources):
    config = DecodeConfig(beam=BEAM, alpha=ALPHA, nbest=3, max_len_a=0, max_len_b=LIMIT)
    return [
        [(h.tokens, round(h.score, 5)) for h in hyps]
        for hyps in decode_ids(model, sources, SearchRequest(config))
    ]


def test_export_reimported_gives_the_same_logits_and_nbest(imported, tmp_path):
    from aiayn.export.hf import export_hf

    _, model, vocab, _ = imported
    export_hf(model, vocab, tmp_path / "hf")
    again = import_marian(tmp_path / "hf", tmp_path / "again")
    model2, vocab2 = load_translator(again)
    assert vocab2.pieces == vocab.pieces and vocab2.fingerprint == vocab.fingerprint
    assert model2.cfg == model.cfg
    sources = [vocab.encode_source(line) for line in corpus_lines("test", 0, 30)]
    src = torch.tensor([s[:8] for s in sources if len(s) >= 8][:6])
    tgt_in = torch.cat([torch.full((len(src), 1), vocab.bos_id), src[:, :-1]], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(src, tgt_in), model2(src, tgt_in), atol=1e-5, rtol=0)
    assert nbest(model, sources) == nbest(model2, sources)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"normalize_before": True}, "normalize_before=True cannot be represented"),
        ({"model_type": "bart"}, "model_type 'bart', not 'marian'"),
        ({"scale_embedding": False}, "scale_embedding=False cannot be represented"),
        ({"encoder_ffn_dim": 32}, "encoder_ffn_dim=32 and decoder_ffn_dim=64 differ"),
        ({"rope_theta": 10000.0}, "field rope_theta=10000.0 is not one aiayn maps"),
        ({"tie_encoder_decoder": True}, "tie_encoder_decoder=True (default False) cannot be"),
        ({"activation_function": "tanh"}, "activation_function 'tanh'; aiayn has"),
    ],
)
def test_import_refuses_what_it_cannot_represent(opus, tmp_path, change, message):
    copy = tmp_path / "marian"
    shutil.copytree(opus[0], copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ExportError, match=re.escape(message)):
        import_marian(copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "change, key, theirs, ours",
    [
        ({"d_model": 64}, "model.shared.weight", "(V, 32)", "(V, 64)"),
        (
            {"encoder_ffn_dim": 128, "decoder_ffn_dim": 128},
            "model.encoder.layers.0.fc1.weight",
            "(64, 32)",
            "(128, 32)",
        ),
        ({"d_model": 16}, "model.shared.weight", "(V, 32)", "(V, 16)"),  # a slice would fit
    ],
)
def test_import_names_a_config_that_disagrees_with_the_weights(
    opus, tmp_path, capsys, change, key, theirs, ours
):
    copy = tmp_path / "marian"
    shutil.copytree(opus[0], copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **change}))
    size = str(config["vocab_size"])
    with pytest.raises(SystemExit):
        main(["import", str(copy), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    expected = f"{key}: the weights hold {theirs.replace('V', size)}, config.json's sizes make"
    assert expected in err and ours.replace("V", size) in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_import_warns_of_tensors_the_config_does_not_use(opus, tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a whole model: every tensor used, nothing said
        import_marian(opus[0], tmp_path / "whole")
    copy = tmp_path / "marian"
    shutil.copytree(opus[0], copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "encoder_layers": 1}))
    with pytest.warns(UserWarning, match=r"16 tensor\(s\) the config does not use.*layers\.1\."):
        import_marian(copy, tmp_path / "out")


def test_a_damaged_sentencepiece_model_is_named_as_the_user_gave_it(opus, tmp_path, capsys):
    copy = tmp_path / "marian"
    shutil.copytree(opus[0], copy)
    (copy / "source.spm").write_bytes(b"not a model")
    with pytest.raises(SystemExit):
        main(["import", str(copy), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert f"{copy / 'source.spm'}: not a SentencePiece model" in err and ".tmp" not in err
    assert not (tmp_path / "out").exists()


def test_fields_at_their_defaults_and_generation_settings_are_accepted(opus, imported, tmp_path):
    copy = tmp_path / "marian"
    shutil.copytree(opus[0], copy)
    config = json.loads((copy / "config.json").read_text())
    extra = {"torchscript": False, "num_beams": 6, "_num_labels": 3, "max_length": 512}
    (copy / "config.json").write_text(json.dumps({**config, **extra}))
    model, _ = load_translator(import_marian(copy, tmp_path / "out"))
    assert model.cfg == imported[1].cfg


def test_the_import_command_writes_a_checkpoint_translate_reads(opus, tmp_path, capsys):
    main(["import", str(opus[0]), "--out", str(tmp_path / "ckpt")])
    assert "imported" in capsys.readouterr().out
    assert read_meta(tmp_path / "ckpt")["model_config"]["activation"] == "swish"
    with pytest.raises(SystemExit):
        main(["import", str(opus[0]), "--out", str(tmp_path / "ckpt")])
    assert "exists; choose a new directory" in capsys.readouterr().err


@pytest.mark.slow  # end to end: about 10 s
def test_fine_tuning_the_import_lowers_validation_perplexity(imported, tmp_path):
    from aiayn.data import prepare_corpus
    from aiayn.train import TrainConfig
    from aiayn.train.trainer import Trainer

    ckpt, model, vocab, _ = imported
    text = tmp_path / "text"
    text.mkdir()
    splits = {}
    for split, n in (("train", 1500), ("valid", 60)):
        for side, lang in ((0, "en"), (1, "es")):
            (text / f"{split}.{lang}").write_text("\n".join(corpus_lines(split, side, n)) + "\n")
        splits[split] = (text / f"{split}.en", text / f"{split}.es")
    meta = prepare_corpus(splits, tmp_path / "data", vocab=ckpt, max_len=64)
    assert meta["vocab_fingerprint"] == vocab.fingerprint
    from aiayn.data import TokenDataset

    train = TokenDataset(tmp_path / "data", "train")  # each side split by its own model
    first = corpus_lines("train", 0, 1)[0], corpus_lines("train", 1, 1)[0]
    assert list(train.src(0)) == vocab.encode(first[0], "source")
    assert list(train.tgt(0)) == vocab.encode_target(first[1])
    assert vocab.encode(first[1], "source") != vocab.encode_target(first[1])
    model_fields = {k: v for k, v in read_meta(ckpt)["model_config"].items() if k != "vocab_size"}
    cfg = TrainConfig(
        data=str(tmp_path / "data"),
        out=str(tmp_path / "run"),
        preset="tiny",
        model={**model_fields, "P_drop": 0.0},
        init_from=str(ckpt),
        max_src_tokens=800,
        max_tgt_tokens=800,
        warmup=50,
        max_updates=200,
        save_every_updates=200,
        save_every_minutes=None,
        amp="none",
        compile=False,
        num_threads=1,
        log_every=100,
        validate=True,
    )
    trainer = Trainer(cfg, device="cpu")
    before = trainer.validate()["valid_ppl"]
    summary = trainer.run(resume=None)
    assert summary["valid_ppl"] < 0.5 * before, (before, summary["valid_ppl"])
    _, tuned_vocab = load_translator(summary["checkpoint"])  # carries both models on
    assert isinstance(tuned_vocab, TwoModelVocab) and tuned_vocab.fingerprint == vocab.fingerprint


def test_translate_reads_the_import_with_nbest_constraints_and_ctranslate2(
    imported, tmp_path, capsys
):
    from aiayn.decode import translate

    ckpt, model, vocab, _ = imported
    lines = corpus_lines("test", 0, 3)
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "constraints.txt").write_text("Dios\n" * len(lines))
    args = ["translate", "--checkpoint", str(ckpt), "--input", str(tmp_path / "in.txt"), "--quiet"]
    main(args)
    best = capsys.readouterr().out.splitlines()
    assert best == translate(model, lines, vocab, SearchRequest(DecodeConfig.preset("translation")))
    main([*args, "--nbest", "2"])
    nbest_lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ||| ")[0] for line in nbest_lines] == ["0", "0", "1", "1", "2", "2"]
    assert [line.split(" ||| ")[1] for line in nbest_lines[::2]] == best
    main([*args, "--constraints", str(tmp_path / "constraints.txt")])
    constrained = capsys.readouterr().out.splitlines()
    assert all("Dios" in line for line in constrained) and constrained != best


def test_the_ctranslate2_export_of_the_import_scores_as_ours(imported, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from aiayn.export.ctranslate2 import export_ctranslate2

    _, model, vocab, _ = imported
    out = export_ctranslate2(model, vocab, tmp_path / "ct2")
    assert (out / "source.spm").is_file() and (out / "pieces.json").is_file()
    tr = ctranslate2.Translator(str(out), device="cpu", compute_type="float32", intra_threads=1)
    for src_line, ref_line in zip(corpus_lines("test", 0, 3), corpus_lines("test", 1, 3)):
        src, ref = vocab.encode_source(src_line), vocab.encode_target(ref_line)
        pieces = [[vocab.id_to_piece(i) for i in ids] for ids in (src[:-1], ref)]
        theirs = tr.score_batch([pieces[0]], [pieces[1]])[0].log_probs
        with torch.no_grad():
            logits = model(torch.tensor([src]), torch.tensor([[vocab.bos_id] + ref]))[0]
        ours = torch.log_softmax(logits, -1)[torch.arange(len(ref) + 1), ref + [vocab.eos_id]]
        torch.testing.assert_close(torch.tensor(theirs), ours, atol=1e-5, rtol=0)


def test_the_onnx_export_of_the_import_searches_as_ours(imported, tmp_path):
    """An OPUS-MT-shaped model (swish, output bias, two SentencePiece models, decoding from
    pad) through ONNX Runtime: its 3-best lists at beam 4 equal ours token for token, their
    log-probabilities within 1e-4 (fp32), as the export's own check recorded."""
    pytest.importorskip("onnxruntime")
    from aiayn.export.onnx import CONFIG, TOLERANCE, export_onnx
    from aiayn.export.onnx_engine import OnnxEngine

    _, model, vocab, _ = imported
    out = export_onnx(model, vocab, tmp_path / "onnx")
    assert (out / "source.spm").is_file() and (out / "pieces.json").is_file()
    assert json.loads((out / CONFIG).read_text())["max_log_prob_difference"] <= TOLERANCE
    engine = OnnxEngine.open(out, threads=1)
    assert isinstance(engine.vocab, TwoModelVocab)
    sources = [vocab.encode_source(line) for line in corpus_lines("test", 0, 12)]
    config = DecodeConfig(beam=BEAM, alpha=ALPHA, nbest=3, max_len_a=0, max_len_b=LIMIT)
    theirs = engine.decode_ids(sources, SearchRequest(config))
    ours = decode_ids(model, sources, SearchRequest(config))
    assert [[h.tokens for h in x] for x in theirs] == [[h.tokens for h in x] for x in ours]
    assert len({len(x[0].tokens) for x in ours}) > 2  # outputs of varied lengths
    apart = [abs(a.log_prob - b.log_prob) for x, y in zip(ours, theirs) for a, b in zip(x, y)]
    assert max(apart) <= TOLERANCE


def test_serve_answers_with_the_imported_model(imported):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from aiayn.decode import translate
    from aiayn.serve import Adapter
    from aiayn.serve.app import Limits, create_app
    from aiayn.translator import Translator

    ckpt, model, vocab, _ = imported
    lines = corpus_lines("test", 0, 2)
    with TestClient(
        create_app(Adapter(Translator(ckpt, workers=1, precision="fp32")), Limits())
    ) as c:
        r = c.post("/translate", json={"text": lines, "beam": 3, "alpha": 1.0})
    assert r.status_code == 200
    expected = translate(model, lines, vocab, SearchRequest(DecodeConfig(beam=3, alpha=1.0)))
    assert [a["text"] for a in r.json()["translations"]] == expected
