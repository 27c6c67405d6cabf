"""Forced decoding (``aiayn.decode.score``) and ``aiayn score``: the training loss's numbers, the
search's own scores, and the command's output formats."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _cli import one_line_error, run_cli
from _decode_helpers import B_, EOS, PAD, SRC, TABLE, A, ScriptedModel, tiny_model

from aiayn.checkpoint import VOCAB, latest_checkpoint, load_transformer
from aiayn.data import Vocab
from aiayn.data.collate import pad_rows
from aiayn.decode import Batching, DecodeConfig, SearchRequest, beam_search, decode_ids, score_ids
from aiayn.decode.nbest import output_ids
from aiayn.evaluate import reference_perplexity
from aiayn.files import read_lines
from aiayn.train.loss import label_smoothed_nll


def test_scripted_forced_scores_are_hand_computed():
    # b a eos: .4 * .9 * 1; a eos: .6 * .7. alpha 0.6: lp(3) = (8/6)^.6, lp(2) = (7/6)^.6.
    model = ScriptedModel(TABLE)
    s1, s2 = score_ids(model, [[7, 8, 9]] * 2, [[B_, A, EOS], [A, EOS]], alpha=0.6)
    assert s1.token_log_probs == pytest.approx([math.log(0.4), math.log(0.9), 0.0])
    assert (s1.length, s2.length) == (3, 2)
    assert s1.log_prob == pytest.approx(math.log(0.36))
    assert s1.score == pytest.approx(math.log(0.36) / (8 / 6) ** 0.6)
    assert s2.score == pytest.approx(math.log(0.42) / (7 / 6) ** 0.6)
    assert s1.ppl == pytest.approx(0.36 ** (-1 / 3))


def test_forced_scores_equal_the_search_scores():
    config = DecodeConfig(beam=2, alpha=2.0, max_len_a=0, max_len_b=3, nbest=2)
    hyps = beam_search(ScriptedModel(TABLE), SRC, config)[0]
    targets = [h.tokens + [EOS] * (h.length - len(h.tokens)) for h in hyps]
    scores = score_ids(ScriptedModel(TABLE), SRC.tolist() * 2, targets, alpha=2.0)
    assert [s.score for s in scores] == pytest.approx([h.score for h in hyps], abs=1e-6)
    assert [s.log_prob for s in scores] == pytest.approx([h.log_prob for h in hyps], abs=1e-6)


def random_pairs(n: int = 7, seed: int = 2) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    sources, targets = [], []
    for _ in range(n):
        s, t = torch.randint(1, 12, (2,), generator=g).tolist()
        sources.append(torch.randint(4, 100, (s,), generator=g).tolist() + [EOS])
        targets.append(torch.randint(4, 100, (t,), generator=g).tolist() + [EOS])
    return sources, targets


@pytest.mark.parametrize("batch_size", [1, 3])
def test_forced_scores_equal_the_training_loss_without_smoothing(batch_size):
    model = tiny_model()
    sources, targets = random_pairs()
    scores = score_ids(model, sources, targets, batching=Batching(batch_size=batch_size))
    for src, tgt, score in zip(sources, targets, scores):
        tgt_in = torch.tensor([[2] + tgt[:-1]])
        with torch.no_grad():
            logits = model(torch.tensor([src]), tgt_in)[0]
        loss, nll = label_smoothed_nll(logits, torch.tensor(tgt), 0.0)
        assert -score.log_prob == pytest.approx(float(loss), abs=1e-4)
        per_token = -torch.log_softmax(logits, -1).gather(1, torch.tensor(tgt)[:, None])
        assert score.token_log_probs == pytest.approx((-per_token[:, 0]).tolist(), abs=1e-5)
        assert score.length == len(tgt)
    # and batched over padded pairs, as training sees them
    src = pad_rows(sources, [], [], PAD)
    tgt_in = pad_rows([t[:-1] for t in targets], [2], [], PAD)
    tgt_out = pad_rows(targets, [], [], PAD)
    with torch.no_grad():
        logits = model(src, tgt_in).flatten(0, 1)
    loss, _ = label_smoothed_nll(logits, tgt_out.flatten(), 0.0, ignore_index=PAD)
    assert -sum(s.log_prob for s in scores) == pytest.approx(float(loss), rel=1e-5)


def test_empty_source_has_no_score_and_overlong_target_is_refused():
    model = tiny_model()
    assert score_ids(model, [[], [5, EOS]], [[EOS], [6, EOS]])[0] is None
    with pytest.raises(ValueError, match="refs: line 2: 300 tokens"):
        score_ids(model, [[5, EOS], [5, EOS]], [[EOS], [6] * 299 + [EOS]], name="refs")


# --- aiayn score ---------------------------------------------------------------------------------


@pytest.fixture
def pairs(tiny_corpus, tmp_path):
    src, ref = tmp_path / "src.en", tmp_path / "ref.es"
    sources = read_lines(tiny_corpus.parent / "test.en")[:6]
    references = read_lines(tiny_corpus.parent / "test.es")[:6]
    src.write_text("\n".join(sources) + "\n", encoding="utf-8")
    ref.write_text("\n".join(references) + "\n", encoding="utf-8")
    return src, ref, sources, references


def test_score_command_prints_the_library_scores(tiny_run, pairs, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src, ref, sources, references = pairs
    # fp32 as the library's model below (a native-bf16 CPU's auto may score in bf16)
    argv = ("--checkpoint", ckpt, "--src", src, "--ref", ref, "--precision", "fp32")
    code, out, err = run_cli(capsys, "score", *argv)
    assert code == 0, err
    rows = [line.split("\t") for line in out.splitlines()]
    assert len(rows) == len(sources) and all(len(r) == 4 for r in rows)

    from aiayn.checkpoint import load_transformer

    model, _ = load_transformer(ckpt)
    vocab = Vocab.load(ckpt / VOCAB)
    expected = score_ids(
        model,
        [vocab.encode_source(s) for s in sources],
        [vocab.encode(r) + [EOS] for r in references],
    )
    for row, s in zip(rows, expected):
        assert float(row[0]) == pytest.approx(s.log_prob, abs=1e-5)
        assert int(row[1]) == s.length
        assert float(row[2]) == pytest.approx(s.score, abs=1e-5)
        assert float(row[3]) == pytest.approx(s.ppl, rel=1e-5)
    ppl = reference_perplexity(model, vocab, sources, references)
    corpus_ppl = float(err.rsplit("perplexity ", 1)[1].split()[0])
    assert corpus_ppl == pytest.approx(ppl, rel=1e-5)  # the corpus figure evaluate reports


def test_score_tokens_jsonl_and_stdin_tsv(tiny_run, pairs, capsys, monkeypatch):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src, ref, sources, references = pairs
    code, out, err = run_cli(
        capsys, "score", "--checkpoint", ckpt, "--src", src, "--ref", ref, "--tokens"
    )
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    vocab = Vocab.load(ckpt / VOCAB)
    for i, (record, reference) in enumerate(zip(records, references)):
        assert record["id"] == i and "line" not in record  # from 0, as translate's jsonl
        pieces = [piece for piece, _ in record["tokens"]]
        assert pieces == [vocab.id_to_piece(t) for t in vocab.encode(reference)] + ["</s>"]
        assert math.fsum(lp for _, lp in record["tokens"]) == pytest.approx(record["log_prob"])

    tsv = "".join(f"{s}\t{r}\n" for s, r in zip(sources, references)).encode()
    monkeypatch.setattr("sys.stdin", _Stdin(tsv))
    code, out2, err = run_cli(capsys, "score", "--checkpoint", ckpt, "--format", "jsonl")
    assert code == 0, err
    assert [json.loads(line)["log_prob"] for line in out2.splitlines()] == pytest.approx(
        [r["log_prob"] for r in records]
    )


class _Stdin:
    def __init__(self, data: bytes) -> None:
        import io

        self.buffer = io.BytesIO(data)


def test_score_refuses_bad_input_in_one_line(tiny_run, pairs, capsys, monkeypatch, tmp_path):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src, ref, *_ = pairs
    short = tmp_path / "short"
    short.write_text("one line\n")
    code, _, err = run_cli(capsys, "score", "--checkpoint", ckpt, "--src", src, "--ref", short)
    assert code == 2
    one_line_error(err, str(src), "6 lines", str(short), "1")
    monkeypatch.setattr("sys.stdin", _Stdin(b"a\tb\nno tab here\n"))
    code, _, err = run_cli(capsys, "score", "--checkpoint", ckpt)
    assert code == 2
    one_line_error(err, "<stdin>: line 2", "tab")
    code, _, err = run_cli(capsys, "score", "--checkpoint", ckpt, "--src", src)
    assert code == 2
    one_line_error(err, "--src and --ref")


@pytest.mark.parametrize(
    "src_text, ref_text, problem",
    [
        ("", "", "are both empty: nothing to score"),
        ("a\nb\n", "", "the reference file {ref} is empty"),
        ("a\nb\n", "x\n", "{src} has 2 lines but {ref} has 1"),
        ("\n \n", "x\ny\n", "no line of {src} has text: nothing to score"),
    ],
)
def test_score_checks_the_files_as_evaluate_does(
    tiny_run, tmp_path, capsys, src_text, ref_text, problem
):
    # empty files printed "0 pairs ... perplexity 1.0000" with exit 0, where evaluate refused
    src, ref = tmp_path / "s.txt", tmp_path / "r.txt"
    src.write_text(src_text)
    ref.write_text(ref_text)
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    code, out, err = run_cli(capsys, "score", "--checkpoint", ckpt, "--src", src, "--ref", ref)
    assert code == 2 and out == "" and "perplexity" not in err
    one_line_error(err, problem.format(src=src, ref=ref))


@pytest.mark.parametrize(
    "stdin, problem",
    [
        (b"", "<stdin> is empty: nothing to score"),
        (b"\tx\n \ty\n", "no source in <stdin> has text"),
    ],
)
def test_score_checks_stdin_pairs_alike(tiny_run, capsys, monkeypatch, stdin, problem):
    monkeypatch.setattr("sys.stdin", _Stdin(stdin))
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    code, out, err = run_cli(capsys, "score", "--checkpoint", ckpt)
    assert code == 2 and out == "" and "perplexity" not in err
    one_line_error(err, problem)


def test_an_output_cut_at_the_length_limit_is_marked_and_rescores_without_eos(
    tiny_run, pairs, capsys
):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    vocab = Vocab.load(ckpt / VOCAB)
    src, ref, sources, references = pairs
    common = ("--checkpoint", ckpt, "--precision", "fp32")
    argv = (*common, "--input", src, "--beam", "2", "--nbest", "2")
    code, out, err = run_cli(capsys, "translate", *argv)
    assert code == 0, err
    # the search's own numbers, and forced decoding of its ids as --no-eos or not scores them
    model, _ = load_transformer(ckpt)
    source_ids = [vocab.encode_source(s) for s in sources]
    nbest = decode_ids(model, source_ids, SearchRequest(DecodeConfig(beam=2, nbest=2)))
    hyps = [(i, h) for i, hs in enumerate(nbest) for h in hs]
    cut = sorted({i for i, h in hyps if h.length == len(h.tokens)})
    assert cut, "a 2-update model runs to the length limit on some of these lines"
    lines = ", ".join(str(i + 1) for i in cut)
    assert f"{len(cut)} input line(s) have an output cut at the length limit" in err
    assert f"(lines {lines};" in err and "aiayn score --no-eos" in err
    printed = [line.split(" ||| ") for line in out.splitlines()]
    assert [float(p[3]) for p in printed] == [pytest.approx(h.log_prob, abs=1e-4) for _, h in hyps]
    rescored = score_ids(
        model, [source_ids[i] for i, _ in hyps], [output_ids(h, EOS) for _, h in hyps]
    )
    assert [s.log_prob for s in rescored] == [pytest.approx(h.log_prob, abs=1e-4) for _, h in hyps]
    assert [s.length for s in rescored] == [h.length for _, h in hyps]
    # the command: --no-eos scores the reference's tokens alone
    code, out, err = run_cli(
        capsys, "score", *common, "--src", src, "--ref", ref, "--format", "jsonl", "--no-eos"
    )
    assert code == 0, err
    expected = score_ids(model, source_ids, [vocab.encode(r) for r in references])
    got = [json.loads(line) for line in out.splitlines()]
    assert [(g["log_prob"], g["length"]) for g in got] == [
        (pytest.approx(e.log_prob, abs=1e-5), e.length) for e in expected
    ]
    assert "target tokens (no eos)" in err
    code, out, _ = run_cli(capsys, "translate", *common, "--input", src, "--format", "jsonl")
    records = [json.loads(line)["hypotheses"][0] for line in out.splitlines()]
    assert [i for i, r in enumerate(records) if r.get("cut")] == [
        i for i, hs in enumerate(decode_ids(model, source_ids)) if hs[0].length == len(hs[0].tokens)
    ]
