"""``--engine ctranslate2`` (``aiayn.export.engine``): the same outputs as ours from
translate and evaluate, an export cached by the checkpoint's fingerprint, and one-line
refusals for what CTranslate2 cannot do."""

import json
from pathlib import Path

import pytest

pytest.importorskip(
    "ctranslate2", reason="the engine needs ctranslate2: pip install -e '.[export]'"
)

from _cli import one_line_error, run_cli  # noqa: E402
from _export_models import corpus_lines, trained_like_model  # noqa: E402

from aiayn.checkpoint import save_checkpoint  # noqa: E402
from aiayn.config import to_dict  # noqa: E402
from aiayn.data import Vocab  # noqa: E402
from aiayn.decode import (  # noqa: E402
    Batching,
    OutputConstraint,
    SampleConfig,
    SearchRequest,
)
from aiayn.decode.engine import TorchEngine  # noqa: E402
from aiayn.errors import UserError  # noqa: E402
from aiayn.export import MARKER  # noqa: E402
from aiayn.export import engine as ct2_engine  # noqa: E402
from aiayn.export.engine import CACHE_SUFFIX, CTranslate2Engine  # noqa: E402

LINES = 8
SHORT = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good.",
]


# tiny ops on a busy 2-core machine: a second intra-op thread only adds waiting
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vocab(tiny_corpus):
    return Vocab.load(tiny_corpus / "spm.model")


def _checkpoint(vocab, root: Path, eos_scale: float = 4.0) -> Path:
    """A checkpoint whose beam outputs are comparable (``_export_models``), 64 positions:
    the translation preset's |X| + 50 outputs are cut there, so tests stay quick."""
    model = trained_like_model(len(vocab), eos_scale=eos_scale, max_len=64)
    meta = {"model_config": to_dict(model.cfg)}
    return save_checkpoint(root, 1, model, meta, None, vocab.path)


@pytest.fixture(scope="module")
def ckpt(vocab, tmp_path_factory) -> Path:
    return _checkpoint(vocab, tmp_path_factory.mktemp("engine") / "ckpts")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("engine_text") / "test.en"
    path.write_text("\n".join(corpus_lines("test", 0, LINES) + [""]) + "\n", encoding="utf-8")
    return path


def _translate(capsys, ckpt, source, *options) -> list[str]:
    # fp32 named: on a native-bf16 CPU ``auto`` may decode ours in bf16, CTranslate2 in float32
    argv = ("--checkpoint", ckpt, "--input", source, "--quiet", "--precision", "fp32")
    code, out, err = run_cli(capsys, "translate", *argv, *options)
    assert code == 0, err
    return out.splitlines()


@pytest.mark.parametrize(
    "options",
    [(), ("--nbest", "3"), ("--nbest", "2", "--format", "jsonl"), ("--split",)],
    ids=["best", "nbest", "jsonl", "split"],
)
def test_translate_with_ctranslate2_prints_what_torch_prints(capsys, ckpt, source, options):
    ours = _translate(capsys, ckpt, source, *options)
    theirs = _translate(capsys, ckpt, source, *options, "--engine", "ctranslate2")
    if not options:  # varied outputs; the blank line gives a blank line
        assert len(set(ours)) > 2 and ours[-1] == ""
    if options and options[-1] == "jsonl":  # scores agree to float32 rounding, texts exactly
        ours, theirs = ([json.loads(line) for line in lines] for lines in (ours, theirs))
        for a, b in zip(ours, theirs):
            assert [h["text"] for h in a["hypotheses"]] == [h["text"] for h in b["hypotheses"]]
            for x, y in zip(a["hypotheses"], b["hypotheses"]):
                assert x["score"] == pytest.approx(y["score"], abs=1e-3)
                assert x["length"] == y["length"]
        return
    if options:  # moses lines: id ||| text ||| score ||| log-prob
        ours, theirs = ([line.split(" ||| ")[:2] for line in lines] for lines in (ours, theirs))
    assert theirs == ours


def test_markup_through_ctranslate2_keeps_its_guarantees(capsys, ckpt, tmp_path):
    """CTranslate2 returns no attention: tags and placeholders go by position, still verbatim
    and well formed."""
    from aiayn.text.markup import well_formed

    strings = ["Save <b>%s files</b> to {folder} now", "<i>See</i> https://x.org/a &amp; 3"]
    src = tmp_path / "strings.txt"
    src.write_text("".join(s + "\n" for s in strings), encoding="utf-8")
    options = ("--markup", "xml", "--placeholders", "--engine", "ctranslate2")
    for source, out in zip(strings, _translate(capsys, ckpt, src, *options)):
        assert well_formed(out, "xml"), out
        for kept in ("<b>", "</b>", "%s", "{folder}", "<i>", "https://x.org/a", "&amp;", "3"):
            assert out.count(kept) >= source.count(kept), (source, out)


def test_workers_are_ctranslate2_replicas_with_the_same_outputs(capsys, ckpt, source):
    one = _translate(capsys, ckpt, source, "--engine", "ctranslate2", "--batch-size", "2")
    two = _translate(
        capsys, ckpt, source, "--engine", "ctranslate2", "--batch-size", "2", "--workers", "2"
    )
    assert two == one and len(set(one)) > 2
    engine = CTranslate2Engine.open(ckpt, threads=2, workers=2)
    assert engine.workers == 2 and engine.translator.num_translators == 2
    with pytest.raises(ValueError, match="opened with 2; give workers to open"):
        engine.decode_ids([[5, 3]], SearchRequest(batching=Batching(workers=3)))
    with pytest.raises(UserError, match="the ctranslate2 engine cannot do: shortlist"):
        engine.decode_ids([[5, 3]], SearchRequest(shortlist=object()))


def test_prefixes_and_sampling_map_to_ctranslate2(ckpt, vocab):
    engine = CTranslate2Engine.open(ckpt, threads=1)
    torch_engine = TorchEngine(trained_like_model(len(vocab), max_len=64))
    sources = [vocab.encode_source(line) for line in SHORT]
    wanted = vocab.encode("Y dijo")
    prefix = [OutputConstraint(wanted, [], eos_id=vocab.eos_id)] * len(sources)
    request = SearchRequest(constraints=prefix).with_ids(vocab)
    ours, theirs = (e.decode_ids(sources, request) for e in (torch_engine, engine))
    assert [h[0].tokens for h in theirs] == [h[0].tokens for h in ours]
    assert len(theirs) >= 3 and all(h[0].tokens[: len(wanted)] == wanted for h in theirs)
    # the prefix's log-probabilities are counted, as ours counts them
    assert [h[0].score for h in theirs] == pytest.approx([h[0].score for h in ours], abs=1e-3)
    sampling = SampleConfig(samples=3, top_k=5)
    draws = engine.decode_ids(sources, SearchRequest(sampling=sampling).with_ids(vocab))
    assert all(len(hyps) == 3 for hyps in draws)
    assert len({tuple(h.tokens) for hyps in draws for h in hyps}) > 4  # drawn, not searched
    for hyps in draws:
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    phrases = [OutputConstraint((), [vocab.encode("Dios")], where="line 1")] * len(sources)
    with pytest.raises(UserError, match="^line 1: the ctranslate2 engine cannot do: lexical_"):
        engine.decode_ids(sources, SearchRequest(constraints=phrases).with_ids(vocab))


def test_the_export_is_cached_and_rebuilt_when_the_checkpoint_changes(vocab, tmp_path, capsys):
    ckpt = _checkpoint(vocab, tmp_path / "ckpts")
    cache = ckpt.parent / (ckpt.name + CACHE_SUFFIX)
    line = [vocab.encode_source(corpus_lines("test", 0, 1)[0])]
    first = CTranslate2Engine.open(ckpt, threads=1).decode_ids(
        line, SearchRequest().with_ids(vocab)
    )
    assert "exporting" in capsys.readouterr().err
    marker = json.loads((cache / MARKER).read_text())
    built = (cache / "model.bin").stat().st_mtime_ns
    CTranslate2Engine.open(ckpt, threads=1)  # the same checkpoint: the cache, untouched
    assert "exporting" not in capsys.readouterr().err
    assert (cache / "model.bin").stat().st_mtime_ns == built
    _checkpoint(vocab, tmp_path / "ckpts", eos_scale=0.5)  # new weights, same directory
    second = CTranslate2Engine.open(ckpt, threads=1).decode_ids(
        line, SearchRequest().with_ids(vocab)
    )
    assert "exporting" in capsys.readouterr().err
    assert json.loads((cache / MARKER).read_text())["fingerprint"] != marker["fingerprint"]
    ours = TorchEngine(trained_like_model(len(vocab), eos_scale=0.5, max_len=64)).decode_ids(
        line, SearchRequest().with_ids(vocab)
    )
    assert second[0][0].tokens == ours[0][0].tokens != first[0][0].tokens


@pytest.mark.parametrize("made_by", ["someone else", "aiayn export"])
def test_a_directory_the_engine_did_not_make_is_never_replaced(vocab, tmp_path, capsys, made_by):
    ckpt = _checkpoint(vocab, tmp_path / "ckpts")
    taken = ckpt.parent / (ckpt.name + CACHE_SUFFIX)
    if made_by == "aiayn export":
        assert (
            run_cli(capsys, "export", "--checkpoint", ckpt, "--to", "ctranslate2", "--out", taken)[
                0
            ]
            == 0
        )
    else:
        taken.mkdir()
        (taken / "notes.txt").write_text("mine")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in taken.iterdir())
    code, _, err = run_cli(
        capsys,
        "translate",
        "--checkpoint",
        ckpt,
        "--engine",
        "ctranslate2",
        "--input",
        ckpt / "meta.json",
    )
    assert code == 2
    one_line_error(err, str(taken), "is taken by a directory", "never replaced")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in taken.iterdir()) == before


def test_a_read_only_checkpoint_directory_caches_in_the_user_cache(vocab, tmp_path, monkeypatch):
    ckpt = _checkpoint(vocab, tmp_path / "ckpts")
    monkeypatch.setattr(ct2_engine, "_writable", lambda directory: directory != ckpt.parent)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    CTranslate2Engine.open(ckpt, threads=1)
    assert not (ckpt.parent / (ckpt.name + CACHE_SUFFIX)).exists()
    (cached,) = (tmp_path / "cache" / "aiayn" / "ctranslate2").iterdir()
    assert json.loads((cached / MARKER).read_text())["fingerprint"].startswith(cached.name)


@pytest.mark.parametrize(
    "options, named",
    [
        (["--quantize", "int8"], "ctranslate2 engine cannot do: --quantize int8 (our int8"),
        (["--alignments"], "ctranslate2 engine cannot do: --alignments (they come from"),
        (["--token-scores"], "ctranslate2 engine cannot do: --token-scores (they come from"),
        (["--constraints", "FILE"], "ctranslate2 engine cannot do: --constraints (CTranslate2"),
        (["--sample", "--seed", "1"], "ctranslate2 engine cannot do: --seed (CTranslate2 seeds"),
        (["--checkpoint", "CKPT"], "cannot do: 2 --checkpoint (it decodes one checkpoint, not"),
    ],
)
def test_options_ctranslate2_cannot_honour_are_refused_by_name(
    capsys, ckpt, source, options, named
):
    options = [str(source) if o == "FILE" else str(ckpt) if o == "CKPT" else o for o in options]
    code, out, err = run_cli(
        capsys,
        "translate",
        "--checkpoint",
        ckpt,
        "--input",
        source,
        "--engine",
        "ctranslate2",
        *options,
    )
    assert code == 2 and out == ""
    one_line_error(err, named)


def test_evaluate_with_ctranslate2_scores_what_torch_scores(capsys, ckpt, source, tmp_path):
    ref = tmp_path / "test.es"
    ref.write_text("\n".join(corpus_lines("test", 1, LINES) + [""]) + "\n", encoding="utf-8")
    results = {}
    for engine in ("torch", "ctranslate2"):
        hyp = tmp_path / f"{engine}.hyp"
        code, out, err = run_cli(
            capsys, "evaluate", "--checkpoint", ckpt, "--src", source, "--ref", ref,
            "--lang", "es", "--output", hyp, "--engine", engine, "--quiet", "--precision", "fp32",
        )  # fmt: skip
        assert code == 0, err
        results[engine] = (json.loads(out[: out.rindex("}") + 1]), hyp.read_text())
    (ours, our_hyps), (theirs, their_hyps) = results["torch"], results["ctranslate2"]
    assert their_hyps == our_hyps and theirs["engine"] == "ctranslate2"
    for key in ("sacrebleu", "paper_bleu", "ppl", "signature"):
        assert theirs[key] == ours[key], key
