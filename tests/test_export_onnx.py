"""The ONNX export and --engine onnxruntime: the graphs' log-probabilities and our search's
n-best lists on them equal ours; what is not an export of ours is one line; int8 stays close."""

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("onnxruntime", reason="the ONNX export needs onnxruntime: '.[onnx]'")
onnx = pytest.importorskip("onnx", reason="the ONNX export needs onnx: '.[onnx]'")

from _export_models import corpus_lines, seeded_model, trained_like_model  # noqa: E402

from aiayn import ModelConfig, Transformer  # noqa: E402
from aiayn.checkpoint import save_checkpoint  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.config import to_dict  # noqa: E402
from aiayn.data import Vocab  # noqa: E402
from aiayn.decode import DecodeConfig, SearchRequest, decode_ids  # noqa: E402
from aiayn.decode.cache import decode_step, new_cache  # noqa: E402
from aiayn.decode.sample import SampleConfig  # noqa: E402
from aiayn.errors import UserError  # noqa: E402
from aiayn.export import MARKER, ExportError  # noqa: E402
from aiayn.export.onnx import CONFIG, DECODER, ENCODER, export_onnx  # noqa: E402
from aiayn.export.onnx_engine import OnnxEngine  # noqa: E402

VARIANTS = [
    {},
    {"norm": "pre"},
    {"positional": "learned"},
    {"share_embeddings": False},
    {"scale_attention": False},
    {"h": 2, "d_k": 8, "d_v": 24},
]
IDS = ["paper", "pre-LN", "learned-positions", "unshared", "unscaled", "d_k-neq-d_v"]


@pytest.fixture(scope="module")
def vocab(tiny_corpus):
    return Vocab.load(tiny_corpus / "spm.model")


@pytest.fixture(scope="module")
def exported(vocab, tmp_path_factory):
    """The trained-like tiny model and its fp32 ONNX export."""
    model = trained_like_model(len(vocab))
    return model, export_onnx(model, vocab, tmp_path_factory.mktemp("onnx") / "out")


def padded(vocab, lines):
    """(n, S) source ids of ``lines`` + eos, padded."""
    ids = [vocab.encode_source(line) for line in lines]
    src = torch.full((len(ids), max(map(len, ids))), vocab.pad_id)
    for i, s in enumerate(ids):
        src[i, : len(s)] = torch.tensor(s)
    return src


@pytest.mark.parametrize("overrides", VARIANTS, ids=IDS)
def test_log_probs_equal_ours_over_steps_with_reordered_beams(vocab, tmp_path, overrides):
    """Several steps of 4 beams of 3 padded sentences, the beams reordered and a sentence
    leaving midway, as the search does: the graphs' log-probabilities within 1e-4 of ours."""
    model = seeded_model(len(vocab), **overrides)
    engine = OnnxEngine.open(export_onnx(model, vocab, tmp_path / "onnx"), threads=1)
    src = padded(vocab, corpus_lines("test", 0, 3))
    assert (src == vocab.pad_id).any()
    onnx = engine.model
    ours_cache = new_cache(model, model.encode(src), model.src_mask(src))
    theirs_cache = onnx.new_cache(onnx.encode(src), onnx.src_mask(src))
    b, tokens, worst = 4, torch.full((12, 1), vocab.bos_id), 0.0
    for t in range(6):
        with torch.no_grad():
            ours = F.log_softmax(decode_step(model, tokens, ours_cache), dim=-1)
        theirs = onnx.decode_step(tokens, theirs_cache)
        worst = max(worst, float((ours - theirs).abs().max()))
        n = tokens.size(0) // b
        rows = torch.arange(n * b).view(n, b).flip(1)  # every sentence's beams reversed
        sentences = torch.arange(n) if t != 2 else torch.tensor([0, 2])  # one leaves
        rows = rows[sentences].reshape(-1)
        for cache in (ours_cache, theirs_cache):
            cache.select(rows, sentences=None if t != 2 else sentences)
        best = ours.index_select(0, rows).argmax(dim=-1, keepdim=True)
        tokens = (best + torch.arange(rows.numel())[:, None] % 3) % len(vocab)  # rows differ
    assert worst <= 1e-4
    recorded = json.loads((tmp_path / "onnx" / CONFIG).read_text())["max_log_prob_difference"]
    assert recorded <= 1e-4


def test_a_model_with_dropout_exports_without_it_and_keeps_its_mode(vocab, tmp_path):
    """A model loaded for training (dropout 0.1, train mode): the graphs are its eval-mode
    network, and the model is left training."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", P_drop=0.1, vocab_size=len(vocab))).train()
    out = export_onnx(model, vocab, tmp_path / "onnx")
    assert model.training
    assert json.loads((out / CONFIG).read_text())["max_log_prob_difference"] <= 1e-4
    src = padded(vocab, corpus_lines("test", 0, 2))
    onnx_model = OnnxEngine.open(out, threads=1).model
    keys = torch.from_numpy(onnx_model.encode(src)[0])
    with torch.no_grad():
        memory = model.eval().encode(src)
        expected = model.decoder[0].src_attn.project_kv(memory)[0]
    torch.testing.assert_close(keys[0], expected, atol=1e-5, rtol=0)


def test_nbest_lists_equal_ours(vocab, exported):
    """20 test verses, beam 4, 4-best: every list equal to ours, token for token."""
    model, out = exported
    engine = OnnxEngine.open(out, threads=1)
    sources = [vocab.encode_source(line) for line in corpus_lines("test", 0, 20)] + [[]]
    request = SearchRequest(DecodeConfig(beam=4, nbest=4, max_len_a=0.5, max_len_b=8))
    ours, theirs = decode_ids(model, sources, request), engine.decode_ids(sources, request)
    assert [[h.tokens for h in hyps] for hyps in theirs] == [
        [h.tokens for h in hyps] for hyps in ours
    ]
    assert theirs[-1] == [] and len({len(h[0].tokens) for h in ours[:-1]}) > 2
    apart = [abs(a.log_prob - b.log_prob) for x, y in zip(ours, theirs) for a, b in zip(x, y)]
    assert max(apart) <= 1e-4


def test_guards_and_sampling_run_as_ours(vocab, exported):
    """Our search's other paths on the graphs: a repetition guard, and seeded samples (the
    cache copied per sample), as ours."""
    model, out = exported
    engine = OnnxEngine.open(out, threads=1)
    sources = [vocab.encode_source(line) for line in corpus_lines("test", 0, 6)]
    short = DecodeConfig(max_len_a=0.5, max_len_b=8)
    for request in (
        SearchRequest(replace(short, no_repeat_ngram_size=2, repetition_penalty=1.5)),
        SearchRequest(short, sampling=SampleConfig(samples=3, top_k=20, seed=7)),
    ):
        ours, theirs = decode_ids(model, sources, request), engine.decode_ids(sources, request)
        assert [[h.tokens for h in x] for x in theirs] == [[h.tokens for h in x] for x in ours]


def test_directory_holds_what_a_consumer_needs(vocab, exported):
    _, out = exported
    assert {p.name for p in out.iterdir()} == {ENCODER, DECODER, CONFIG, MARKER, "spm.model"}
    config = json.loads((out / CONFIG).read_text())
    assert config["ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    assert config["search"]["beam"] == 4 and config["search"]["alpha"] == 0.6
    assert config["opset"] == 17 and config["onnxruntime"] and config["vocabulary"] == "spm.model"


def _broken(kind: str, good: Path, root: Path) -> Path:
    """A directory ``--engine onnxruntime`` must refuse: what ``kind`` says."""
    bad = root / kind
    if kind == "foreign":  # someone else's ONNX model, no marker of ours
        bad.mkdir()
        shutil.copy(good / ENCODER, bad / "model.onnx")
        return bad
    if kind == "not-a-directory":
        bad.write_text("x")
        return bad
    shutil.copytree(good, bad)
    config = json.loads((good / CONFIG).read_text())
    if kind == "ctranslate2-marker":
        (bad / MARKER).write_text(json.dumps({"format": "ctranslate2"}))
    elif kind in ("truncated-graph", "truncated-encoder"):
        name = DECODER if kind == "truncated-graph" else ENCODER
        (bad / name).write_bytes((good / name).read_bytes()[: (good / name).stat().st_size // 3])
    elif kind in ("missing-graph", "missing-config", "missing-vocabulary"):
        name = {"missing-graph": ENCODER, "missing-config": CONFIG}.get(kind, "spm.model")
        (bad / name).unlink()
    elif kind == "swapped-graphs":
        shutil.copy(good / ENCODER, bad / DECODER)
    elif kind == "bad-config":
        (bad / CONFIG).write_text("{not json")
    elif kind == "foreign-config":  # another program's JSON that says format 1
        (bad / CONFIG).write_text(json.dumps({"format": 1, "model_type": "marian", "d_model": 32}))
    elif kind == "other-model-graph":  # graphs of a model with other heads than model.json's
        (bad / CONFIG).write_text(json.dumps({**config, "heads": config["heads"] * 2}))
    elif kind == "other-vocabulary":  # graphs of another vocabulary size
        (bad / CONFIG).write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 1}))
    elif kind == "damaged-vocabulary":
        (bad / "spm.model").write_bytes(b"\x00not a sentencepiece model")
    return bad


# each kind and the file its one line must name
KINDS = {
    "foreign": "",
    "ctranslate2-marker": "",
    "truncated-graph": DECODER,
    "truncated-encoder": ENCODER,
    "missing-graph": ENCODER,
    "missing-config": CONFIG,
    "missing-vocabulary": "",
    "swapped-graphs": DECODER,
    "bad-config": CONFIG,
    "foreign-config": CONFIG,
    "other-model-graph": ENCODER,
    "other-vocabulary": DECODER,
    "damaged-vocabulary": "spm.model",
    "not-a-directory": "",
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_malformed_or_foreign_directory_is_one_line(exported, tmp_path, kind):
    """The engine opens nothing it cannot decode with: one UserError line naming the file."""
    bad = _broken(kind, exported[1], tmp_path)
    with pytest.raises(UserError) as e:
        OnnxEngine.open(bad)
    assert "\n" not in str(e.value) and str(bad / KINDS[kind]).rstrip("/") in str(e.value)


CLI_KINDS = ["foreign", "truncated-graph", "foreign-config", "other-model-graph"]


@pytest.mark.parametrize("command", ["translate", "evaluate"])
@pytest.mark.parametrize("kind", CLI_KINDS)
def test_the_command_line_refuses_a_malformed_directory_in_one_line(
    exported, tmp_path, capsys, command, kind
):
    bad = _broken(kind, exported[1], tmp_path)
    (tmp_path / "in.txt").write_text("In the beginning\n")
    given = ["--input", str(tmp_path / "in.txt")]
    if command == "evaluate":
        given = ["--src", str(tmp_path / "in.txt"), "--ref", str(tmp_path / "in.txt")]
    with pytest.raises(SystemExit) as e:
        main([command, "--checkpoint", str(bad), "--engine", "onnxruntime", *given])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    if command == "evaluate":  # its perplexity is our model's: an export alone will not do
        assert err.startswith(f"aiayn evaluate: error: {bad}: an export, not a checkpoint")
    else:
        assert err.startswith(f"aiayn translate: error: {bad / KINDS[kind]}".rstrip("/"))


@pytest.mark.parametrize("kind", CLI_KINDS)
def test_the_translator_refuses_a_malformed_directory_in_one_line(exported, tmp_path, kind):
    from aiayn import Translator

    bad = _broken(kind, exported[1], tmp_path)
    translator = Translator(bad, engine="onnxruntime")  # opens on first use
    with pytest.raises(UserError) as e:
        translator.translate(["In the beginning"])
    assert "\n" not in str(e.value) and str(bad / KINDS[kind]).rstrip("/") in str(e.value)


@pytest.mark.parametrize("kind", [*CLI_KINDS, "good-export-alone"])
def test_serve_refuses_a_malformed_directory_in_one_line(
    exported, tmp_path, capsys, monkeypatch, kind
):
    """Before it listens: a damaged export is named, and a good one given without its
    checkpoint is refused (the server's attention and alignments are our model's)."""
    pytest.importorskip("fastapi")
    from aiayn.serve import server

    def listen(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(server, "make_server", listen)
    bad = exported[1] if kind == "good-export-alone" else _broken(kind, exported[1], tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["serve", "--checkpoint", str(bad), "--engine", "onnxruntime", "--port", "8917"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    if kind == "good-export-alone":
        assert "an export, not a checkpoint (no meta.json)" in err
    else:
        assert f"{bad / KINDS[kind]}".rstrip("/") in err


def test_engine_refuses_what_the_graphs_cannot_do_in_one_line(vocab, exported):
    from aiayn.decode.capabilities import check_supported

    engine = OnnxEngine.open(exported[1], threads=1)
    asked = {"shortlist": "--shortlist", "alignments": "--alignments"}
    with pytest.raises(Exception) as e:
        check_supported(asked, engine.name, engine.supports)
    assert "--shortlist" in str(e.value) and "--alignments" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_exports_and_translates_as_ours(vocab, tmp_path, capsys):
    """``aiayn export --to onnx`` of a checkpoint, then ``aiayn.Translator`` with engine
    onnxruntime on that directory, and on the checkpoint itself (exported beside it on first
    use, reused after): the same translations as ours."""
    from aiayn import Translator

    model = trained_like_model(len(vocab))
    ckpt = save_checkpoint(
        tmp_path / "ckpts", 1, model, {"model_config": to_dict(model.cfg)}, None, vocab.path
    )
    out = tmp_path / "onnx"
    main(["export", "--checkpoint", str(ckpt), "--to", "onnx", "--out", str(out)])
    assert f"-> {out}" in capsys.readouterr().out
    lines = corpus_lines("test", 0, 3)
    with Translator(ckpt, workers=1) as ours:
        expected = [t.text for t in ours.translate(lines, beam=4)]
    for given in (out, ckpt, ckpt):
        with Translator(given, engine="onnxruntime") as theirs:
            assert [t.text for t in theirs.translate(lines, beam=4)] == expected
    cache = ckpt.parent / (ckpt.name + ".onnx")
    assert capsys.readouterr().err.count(f"exporting {ckpt} to ONNX in {cache}") == 1
    assert json.loads((cache / MARKER).read_text())["fingerprint"]


def test_a_foreign_directory_where_the_cache_goes_is_kept(vocab, exported, tmp_path):
    from aiayn import Translator

    model = exported[0]
    ckpt = save_checkpoint(
        tmp_path / "ckpts", 1, model, {"model_config": to_dict(model.cfg)}, None, vocab.path
    )
    shutil.copytree(exported[1], ckpt.parent / (ckpt.name + ".onnx"))  # the user's export
    translator = Translator(ckpt, engine="onnxruntime")  # opens on first use
    with pytest.raises(ExportError, match="never replaced") as e:
        translator.translate(["In the beginning"])
    assert "\n" not in str(e.value)
    assert (ckpt.parent / (ckpt.name + ".onnx") / ENCODER).is_file()


def test_int8_runs_and_stays_close(vocab, tmp_path):
    """int8 graphs: int8 products, recorded as int8, their likely tokens' log-probabilities within
    1 of ours on this random model (a trained one is closer), and the search runs on them."""
    model = seeded_model(len(vocab))
    fp32 = export_onnx(model, vocab, tmp_path / "fp32")
    int8 = export_onnx(model, vocab, tmp_path / "int8", quantization="int8")
    config = json.loads((int8 / CONFIG).read_text())
    assert config["quantization"] == "int8"
    assert 0 < config["max_log_prob_difference_p0.01"] < 1.0
    for name in (ENCODER, DECODER):  # every product with a weight on int8, fewer bytes
        graph = onnx.load(int8 / name).graph
        weights = {w.name for w in graph.initializer}
        products = [n for n in graph.node if n.op_type in ("MatMul", "MatMulInteger")]
        assert any(n.op_type == "MatMulInteger" for n in products)
        assert not [n for n in products if n.op_type == "MatMul" and weights & set(n.input)]
        assert (int8 / name).stat().st_size < (fp32 / name).stat().st_size
    sources = [vocab.encode_source(line) for line in corpus_lines("test", 0, 4)]
    request = SearchRequest(DecodeConfig(beam=4, nbest=2, max_len_a=0.5, max_len_b=8))
    found = OnnxEngine.open(int8, threads=1).decode_ids(sources, request)
    assert all(len(h) == 2 and h[0].score >= h[1].score for h in found)


def test_quantization_other_than_int8_is_refused(vocab, tmp_path):
    with pytest.raises(ExportError, match="int8"):
        export_onnx(seeded_model(len(vocab)), vocab, tmp_path / "o", quantization="int4")
    assert not (tmp_path / "o").exists()


def test_documented_snippet_decodes_as_our_greedy_search_without_aiayn(vocab, exported):
    """docs/export.md's ONNX example, run as it is written (its OUT pointed at an export), in
    a process that never imports aiayn: its outputs are our beam 1 with alpha 0 (greedy)."""
    model, out = exported
    page = (Path(__file__).parents[1] / "docs" / "export.md").read_text(encoding="utf-8")
    code = page.split("<!-- onnx-example -->\n```python\n", 1)[1].split("```", 1)[0]
    assert 'OUT = "runs/demo/onnx"' in code and "aiayn" not in code.replace("# aiayn export", "")
    lines = corpus_lines("test", 0, 4)
    code = code.replace('OUT = "runs/demo/onnx"', f"OUT = {str(out)!r}")
    code += f"for line in {lines!r}:\n    print(translate(line))\n"
    code += "assert not [m for m in sys.modules if m.startswith('aiayn')]\n"
    run = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True, check=True
    )
    sources = [vocab.encode_source(line) for line in lines]
    greedy = SearchRequest(DecodeConfig(beam=1, alpha=0.0))
    ours = [vocab.decode(h[0].tokens) for h in decode_ids(model, sources, greedy)]
    assert run.stdout.splitlines()[1:] == ours  # after the page's own example line


@pytest.mark.slow  # a subprocess exporting and decoding twice: about 15 s
def test_the_agreement_script_counts_equal_nbest_lists_and_records_them(
    vocab, tiny_corpus, tmp_path
):
    """scripts/export_agreement.py --peers onnx on a checkpoint and its prepared test split:
    every 4-best list equal to ours, token log-probabilities within 1e-4, and a record of
    topic export (docs/export.md's table) holding those counts."""
    from aiayn.records import load_records, render_topic

    model = trained_like_model(len(vocab))
    ckpt = save_checkpoint(
        tmp_path / "ckpts", 1, model, {"model_config": to_dict(model.cfg)}, None, vocab.path
    )
    (tmp_path / "records").mkdir()
    script = Path(__file__).parents[1] / "scripts" / "export_agreement.py"
    argv = ["--checkpoint", str(ckpt), "--data", str(tiny_corpus), "--limit", "6"]
    run = subprocess.run(
        [sys.executable, str(script), *argv, "--peers", "onnx", "--threads", "1"]
        + ["--record", str(tmp_path / "records")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)["onnx"]
    assert found["nbest"] == 4 and found["nbest_equal"] == found["sentences"] == 6
    assert found["unequal"] == [] and 0 < found["max_token_log_prob_difference"] <= 1e-4
    (record,) = load_records(tmp_path / "records")
    assert record.topic == "export" and record.figures["4-best lists equal"] == "6 / 6"
    assert "6 / 6" in render_topic([record], "export")
