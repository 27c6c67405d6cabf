"""Ensembles (``aiayn.decode.ensemble``): hand-computed averages on scripted models, an
ensemble of a model with itself is that model, and ``--checkpoint A --checkpoint B``."""

from __future__ import annotations

import itertools
import json
import math
import shutil

import pytest
import torch
from _cli import one_line_error, run_cli
from _decode_helpers import (
    B_,
    BOS,
    EOS,
    SHORT,
    SRC,
    TABLE,
    A,
    ScriptedModel,
    random_src,
    tiny_model,
)

import aiayn
from aiayn.checkpoint import VOCAB, latest_checkpoint, load_transformer
from aiayn.data import Vocab
from aiayn.decode import DecodeConfig, Ensemble, beam_search, score_ids

# A second scripted model over the same prefixes as TABLE.
TABLE2 = {
    (): {A: 0.2, B_: 0.8},
    (A,): {EOS: 0.5, A: 0.25, B_: 0.25},
    (B_,): {A: 0.5, EOS: 0.5},
    (A, A): {EOS: 1.0},
    (A, B_): {EOS: 1.0},
    (B_, A): {EOS: 1.0},
}


def ensemble_prob(prefix: tuple[int, ...], token: int) -> float:
    """exp(mean of the two log-probabilities), renormalised over the next tokens."""
    mean = {t: math.sqrt(TABLE[prefix][t] * TABLE2[prefix][t]) for t in TABLE[prefix]}
    return mean[token] / sum(mean.values())


def test_ensemble_scores_are_the_renormalised_mean_log_probs():
    ensemble = Ensemble([ScriptedModel(TABLE), ScriptedModel(TABLE2)])
    (s,) = score_ids(ensemble, SRC.tolist(), [[B_, A, EOS]], alpha=0.0)
    expected = [ensemble_prob((), B_), ensemble_prob((B_,), A), 1.0]
    assert s.token_log_probs == pytest.approx([math.log(p) for p in expected], abs=1e-6)


def test_ensemble_beam_search_hand_computed():
    # P(b) = sqrt(.4*.8) / (sqrt(.12) + sqrt(.32)) = .6202, P(a|b) = sqrt(.45) / (sqrt(.45) +
    # sqrt(.05)) = .75: "b a" .4651 beats "a" = .3798 * .6078 = .2309 (TABLE alone picks "a").
    ensemble = Ensemble([ScriptedModel(TABLE), ScriptedModel(TABLE2)])
    config = DecodeConfig(beam=2, alpha=0.0, max_len_a=0, max_len_b=3, nbest=2)
    hyps = beam_search(ensemble, SRC, config)[0]
    assert [h.tokens for h in hyps] == [[B_, A], [A]]
    p_ba = ensemble_prob((), B_) * ensemble_prob((B_,), A)
    p_a = ensemble_prob((), A) * ensemble_prob((A,), EOS)
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(p_ba), math.log(p_a)], abs=1e-6)
    assert beam_search(ScriptedModel(TABLE), SRC, config)[0][0].tokens == [A]


def test_ensemble_of_a_model_with_itself_is_the_model():
    model, src = tiny_model(), random_src()
    alone = beam_search(model, src, SHORT)
    twice = beam_search(Ensemble([model, model]), src, SHORT)
    assert [[h.tokens for h in hyps] for hyps in twice] == [
        [h.tokens for h in hyps] for hyps in alone
    ]
    for a, b in zip(alone, twice):
        assert [h.score for h in b] == pytest.approx([h.score for h in a], abs=1e-5)


def test_an_ensemble_keeps_nothing_between_calls():
    """Its models' memories (of two widths) and caches travel in the cache: a fresh Ensemble
    of the same models at every call, two batches decoded in turns, gives what one Ensemble
    gives decoding one batch after the other."""
    torch.manual_seed(3)
    wide = aiayn.Transformer(aiayn.ModelConfig.preset("tiny", d_model=48, vocab_size=100)).eval()
    models, batches = [tiny_model(), wide], [random_src(3), random_src(2, seed=4)]

    def decode(ensembles, order: list[int]) -> dict[int, list[torch.Tensor]]:
        caches = [
            next(ensembles).new_cache(next(ensembles).encode(src), models[0].src_mask(src))
            for src in batches
        ]
        tokens = [torch.full((src.size(0), 1), BOS) for src in batches]
        found: dict[int, list[torch.Tensor]] = {0: [], 1: []}
        for i in order:
            found[i].append(next(ensembles).decode_step(tokens[i], caches[i]))
            tokens[i] = found[i][-1].argmax(-1, keepdim=True)
        return found

    fresh = (Ensemble(models) for _ in itertools.count())
    turns, one_by_one = (
        decode(fresh, [0, 1, 0, 1, 0, 1]),
        decode(itertools.repeat(Ensemble(models)), [0, 0, 0, 1, 1, 1]),
    )
    for i in (0, 1):
        assert all(torch.equal(a, b) for a, b in zip(turns[i], one_by_one[i], strict=True))


# --- aiayn translate / score --checkpoint A --checkpoint B -----------------------------------------


@pytest.fixture
def inputs(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("In the beginning God created\nAnd the earth was\n", encoding="utf-8")
    return path


def test_translate_with_one_checkpoint_twice_prints_its_outputs(tiny_run, inputs, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ["translate", "--input", inputs, "--nbest", 2, "--format", "jsonl"]
    code, alone, err = run_cli(capsys, *argv, "--checkpoint", ckpt)
    assert code == 0, err
    code, twice, err = run_cli(capsys, *argv, "--checkpoint", ckpt, "--checkpoint", ckpt)
    assert code == 0, err
    for a, b in zip(alone.splitlines(), twice.splitlines()):
        ha, hb = json.loads(a)["hypotheses"], json.loads(b)["hypotheses"]
        assert [h["text"] for h in hb] == [h["text"] for h in ha]
        assert [h["score"] for h in hb] == pytest.approx([h["score"] for h in ha], abs=1e-5)


def test_ensemble_of_two_checkpoints_scores_the_renormalised_mean_of_theirs(
    tiny_run, inputs, capsys
):
    ckpts = sorted((tiny_run / "checkpoints").glob("update_*"))
    # fp32 as the teacher-forced sums below (a native-bf16 CPU's auto may score in bf16)
    argv = ["score", "--src", inputs, "--ref", inputs, "--format", "jsonl", "--precision", "fp32"]
    logps = []
    for chosen in ([ckpts[0]], [ckpts[-1]], [ckpts[0], ckpts[-1]]):
        code, out, err = run_cli(capsys, *argv, *[a for c in chosen for a in ("--checkpoint", c)])
        assert code == 0, err
        logps.append([json.loads(line)["log_prob"] for line in out.splitlines()])
    # by hand, teacher-forced: each model's log-softmax at every position, their mean
    # renormalised over the vocabulary, at the reference's tokens
    models = [load_transformer(c)[0] for c in (ckpts[0], ckpts[-1])]
    vocab = Vocab.load(ckpts[0] / VOCAB)
    lines = inputs.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(logps[2]) == 2
    for line, first, last, both in zip(lines, *logps):
        target = vocab.encode(line) + [EOS]
        src, tgt_in = torch.tensor([vocab.encode_source(line)]), torch.tensor([[BOS, *target[:-1]]])
        with torch.no_grad():
            mean = torch.stack([torch.log_softmax(m(src, tgt_in)[0], -1) for m in models]).mean(0)
        expected = torch.log_softmax(mean, -1).gather(1, torch.tensor(target)[:, None]).sum()
        assert both == pytest.approx(float(expected), abs=1e-4)
        assert abs(both - first) > 1e-3 and abs(both - last) > 1e-3  # neither model alone
        assert both >= (first + last) / 2 - 1e-4  # renormalising only raises the mean


def test_ensemble_refuses_checkpoints_with_other_vocabularies(tiny_run, inputs, capsys, tmp_path):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    other = shutil.copytree(ckpt, tmp_path / "other")
    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"word{i} other{i} thing" for i in range(200)), encoding="utf-8")
    Vocab.train([text], tmp_path / "spm", vocab_size=60)
    shutil.copy(tmp_path / "spm.model", other / VOCAB)
    for command in (["translate", "--input", inputs], ["score", "--src", inputs, "--ref", inputs]):
        code, _, err = run_cli(capsys, *command, "--checkpoint", ckpt, "--checkpoint", other)
        assert code == 2
        one_line_error(err, f"--checkpoint {other}", "another vocabulary", str(ckpt))
