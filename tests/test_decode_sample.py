"""Sampling (``aiayn.decode.sample``): the cuts and the temperature on a scripted model, the
model's own scores, and reproducibility that does not depend on the batch."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from _cli import one_line_error, run_cli
from _decode_helpers import (
    B_,
    EOS,
    PAD,
    SRC,
    TABLE,
    A,
    Close,
    PrefixCache,
    ScriptedModel,
    random_src,
    tiny_model,
)

from aiayn.checkpoint import latest_checkpoint
from aiayn.decode import (
    Batching,
    DecodeConfig,
    SampleConfig,
    SearchRequest,
    decode_ids,
    sample,
    score_ids,
)
from aiayn.decode.sample import sampling_log_weights

LONG = DecodeConfig(beam=1, alpha=0.6, max_len_a=0, max_len_b=3)


def draws(n: int, **cfg) -> Counter:
    hyps = sample(ScriptedModel(TABLE), SRC, LONG, SampleConfig(samples=n, **cfg), indices=[0])[0]
    return Counter(tuple(h.tokens) for h in hyps)


def test_top_k_1_is_greedy():
    assert draws(20, top_k=1) == {(A,): 20}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # p = .5: "a" (.6) alone reaches it, then eos (.7): always "a".
    assert draws(20, top_p=0.5) == {(A,): 20}
    # p = .7: a (.6) and b; after a, eos (.7) alone; after b, a (.9) alone.
    counts = draws(400, top_p=0.7)
    assert set(counts) == {(A,), (B_, A)}
    assert counts[(A,)] / 400 == pytest.approx(0.6, abs=0.1)


def test_samples_follow_the_distribution_at_a_temperature():
    # T = 1: P(a) = .42, P(b a) = .36, P(a a) = .12, P(a b) = .06, P(b) = .04.
    counts = draws(2000)
    for y, p in {(A,): 0.42, (B_, A): 0.36, (A, A): 0.12, (A, B_): 0.06, (B_,): 0.04}.items():
        assert counts[y] / 2000 == pytest.approx(p, abs=0.04)
    # T = 2 flattens: first token a with .6^.5 / (.6^.5 + .4^.5) = .5505
    first_a = sum(c for y, c in draws(2000, temperature=2.0).items() if y[0] == A)
    assert first_a / 2000 == pytest.approx(0.5505, abs=0.04)


def test_sample_scores_are_the_models_own():
    hyps = sample(
        ScriptedModel(TABLE), SRC, LONG, SampleConfig(samples=50, top_p=0.7, temperature=0.5),
        indices=[3],
    )[0]  # fmt: skip
    for h in hyps:
        target = h.tokens + [EOS] * (h.length - len(h.tokens))
        (forced,) = score_ids(ScriptedModel(TABLE), SRC.tolist(), [target], alpha=LONG.alpha)
        assert h.log_prob == pytest.approx(forced.log_prob, abs=1e-6)
        assert h.score == pytest.approx(forced.score, abs=1e-6)
    # top-p 0.7 at T 0.5 leaves two outputs: a (.42) and b a (.36)
    assert all(Close(h.log_prob) in (math.log(0.42), math.log(0.36)) for h in hyps)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_sampling_config_refuses_nonsense():
    bad_ones = (dict(samples=0), dict(temperature=0.0), dict(top_k=-1), dict(top_p=0.0))
    for bad in (*bad_ones, dict(seed=-1)):  # numpy's SeedSequence takes no negative seed
        with pytest.raises(ValueError):
            SampleConfig(**bad)


def test_top_k_keeps_ties_and_top_p_the_most_probable():
    lprobs = torch.log(torch.tensor([[0.4, 0.3, 0.3, 0.0], [0.9, 0.05, 0.05, 0.0]]))
    kept = sampling_log_weights(lprobs, SampleConfig(top_k=2)) > float("-inf")
    assert kept.tolist() == [[True, True, True, False], [True, True, True, False]]
    kept = sampling_log_weights(lprobs, SampleConfig(top_p=0.05)) > float("-inf")
    assert kept.tolist() == [[True, False, False, False], [True, False, False, False]]


# --- reproducibility -----------------------------------------------------------------------------


def sampled(batch_size: int, seed: int = 7, first_index: int = 0, sources=None):
    sources = sources if sources is not None else _sources()
    config = DecodeConfig(beam=1, alpha=0.6, max_len_a=1.0, max_len_b=6)
    request = SearchRequest(
        config, batching=Batching(batch_size=batch_size), first_index=first_index,
        sampling=SampleConfig(samples=3, top_k=20, seed=seed),
    )  # fmt: skip
    nbest = decode_ids(tiny_model(), sources, request)
    return [[(tuple(h.tokens), Close(h.log_prob)) for h in hyps] for hyps in nbest]


def _sources() -> list[list[int]]:
    src = random_src(batch=6)
    return [[t for t in row if t] + [EOS] for row in src.tolist()]


def test_same_seed_same_samples_whatever_the_batch():
    one_by_one, batched = sampled(batch_size=1), sampled(batch_size=4)
    assert batched == one_by_one
    assert sampled(batch_size=4) == batched  # the same seed again
    assert sampled(batch_size=4, seed=8) != batched
    assert len({h[0] for hyps in batched for h in hyps}) > len(batched)  # samples differ


def test_a_sentence_samples_by_its_index_in_the_input():
    sources = _sources()
    whole = sampled(batch_size=6, sources=sources)
    chunks = sampled(2, sources=sources[:2]) + sampled(2, first_index=2, sources=sources[2:])
    assert chunks == whole


class SourceHashedModel:
    """Logits that are a function of the row's own source and prefix only (seeded by their
    hash), whatever the batch: what sampling draws from when float rounding plays no part."""

    def encode(self, src):
        return src.float().unsqueeze(-1)  # (n, S, 1): each row's source, for new_cache

    def src_mask(self, src):
        return (src != PAD)[:, None, None, :]

    def new_cache(self, memory, src_mask, max_len=None):
        sources = [tuple(int(t) for t in row if t) for row in memory.squeeze(-1).tolist()]
        return PrefixCache([(source, ()) for source in sources])  # (source, prefix) per row

    def decode_step(self, tgt_in, cache):
        cache.rows = [(s, p + tuple(r)) for (s, p), r in zip(cache.rows, tgt_in.tolist())]
        logits = []
        for source, prefix in cache.rows:
            g = torch.Generator().manual_seed(hash((source, prefix)) % 2**31)
            x = torch.randn(12, generator=g) * 2
            x[EOS] += 1.0
            logits.append(x)
        return torch.stack(logits)


def test_a_sentences_draws_do_not_depend_on_its_batch_mates():
    # Equal logits give equal samples, bit for bit, whatever the batch size, the order of the
    # batches and the sentences around: each sentence draws from its own stream.
    sources = [[5 + i % 7] * (1 + i % 4) + [EOS] for i in range(7)]
    config = DecodeConfig(beam=1, alpha=0.6, max_len_a=0, max_len_b=6)
    sampling = SampleConfig(samples=3, seed=9, top_p=0.9)

    def drawn(batch_size, srcs=sources, first_index=0):
        request = SearchRequest(
            config, batching=Batching(batch_size=batch_size), sampling=sampling,
            first_index=first_index,
        )  # fmt: skip
        nbest = decode_ids(SourceHashedModel(), srcs, request)
        return [[(h.tokens, h.log_prob, h.score) for h in hyps] for hyps in nbest]

    alone = [drawn(1, [s], first_index=i)[0] for i, s in enumerate(sources)]
    for batch_size in (1, 2, 3, 7):
        assert drawn(batch_size) == alone
    assert len({tuple(tokens) for hyps in alone for tokens, _, _ in hyps}) > 3  # they differ


def test_with_batch_size_1_a_sentences_samples_are_its_own_bit_for_bit():
    # A real model's log-probabilities change in the last bits with the batch (docs/decoding.md):
    # one sentence a batch, its samples and their scores do not depend on the other lines.
    sources = _sources()
    config = DecodeConfig(beam=1, alpha=0.6, max_len_a=1.0, max_len_b=6)
    sampling = SampleConfig(samples=3, top_k=20, seed=7)
    model = tiny_model()
    request = SearchRequest(config, sampling=sampling)
    whole = decode_ids(model, sources, replace(request, batching=Batching(batch_size=1)))
    for i in (0, 3, 5):
        (alone,) = decode_ids(model, [sources[i]], replace(request, first_index=i))
        assert [(h.tokens, h.log_prob) for h in alone] == [(h.tokens, h.log_prob) for h in whole[i]]


# --- aiayn translate --sample ------------------------------------------------------------------------


def test_translate_sample_nbest(tiny_run, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_text("In the beginning\nGod created\n", encoding="utf-8")
    argv = ["translate", "--checkpoint", ckpt, "--input", src, "--sample", "--seed", 3]
    code, out, err = run_cli(capsys, *argv, "--nbest", 4, "--top-p", 0.9)
    assert code == 0, err
    ids = [line.split(" ||| ")[0] for line in out.splitlines()]
    assert ids == ["0"] * 4 + ["1"] * 4
    code, again, _ = run_cli(capsys, *argv, "--nbest", 4, "--top-p", 0.9, "--window", 1)
    fields = [line.split(" ||| ") for line in out.splitlines()]
    fields_again = [line.split(" ||| ") for line in again.splitlines()]
    assert [f[:2] for f in fields_again] == [f[:2] for f in fields]  # ids and texts
    assert [float(f[3]) for f in fields_again] == pytest.approx([float(f[3]) for f in fields])
    code, plain, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert len(plain.splitlines()) == 2


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--top-k", "5"], "--top-k needs --sample"),
        (["--sample", "--beam", "3"], "--beam has no effect with --sample"),
        (["--sample", "--top-p", "1.5"], "top-p must be in (0, 1]"),
        (["--sample", "--seed", "-1"], "seed must be >= 0, got -1"),
    ],
)
def test_translate_sample_options_checked(tiny_run, tmp_path, capsys, extra, needle):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_text("In the beginning\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", src, *extra)
    assert code == 2
    one_line_error(err, needle)
