"""Beam search (beam 1 included) and translate, against hand-computed and exhaustive answers."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from _decode_helpers import (
    B_,
    BOS,
    EOS,
    PAD,
    SHORT,
    SRC,
    TABLE,
    UNK,
    A,
    ScriptedModel,
    hypotheses,
    random_src,
    tiny_model,
)

from aiayn.decode import (
    Batching,
    DecodeConfig,
    SearchRequest,
    beam_search,
    decode_ids,
    gnmt_length_penalty,
    translate,
)
from aiayn.decode.translate import length_batches

# the scripted model (_decode_helpers.TABLE) against hand-computed answers


def run(config: DecodeConfig, **kw):
    model = ScriptedModel(TABLE)
    return beam_search(model, SRC, config, **kw)[0], model.steps


def test_scripted_alpha0_stops_early():
    # Beam 2. Step 1 candidates: a .6, b .4 -> live [a, b].
    # Step 2 candidates by probability: a-eos .42, ba .36, aa .12, ab .06, b-eos .04. Rank 1 is
    # eos: "a" finishes with log .42 = -0.8675. Live: ba (.36), aa (.12).
    # alpha = 0: best live bound log .36 = -1.0217 <= -0.8675: stop after 2 steps.
    hyps, steps = run(DecodeConfig(beam=2, alpha=0.0, max_len_a=0, max_len_b=3, nbest=1))
    assert steps == 2
    assert [h.tokens for h in hyps] == [[A]]
    assert hyps[0].score == pytest.approx(math.log(0.42), abs=1e-6)
    assert hyps[0].length == 2


def test_scripted_alpha2_prefers_longer():
    # alpha = 2, max_len 3: lp(2) = (7/6)^2 = 1.3611, lp(3) = (8/6)^2 = 1.7778.
    # After step 2: "a" scores log .42 / lp(2) = -0.867501 / 1.361111 = -0.637348; bound for
    # ba: log .36 / lp(3) = -1.021651 / 1.777778 = -0.574679 > -0.637348, so decoding goes on.
    # Step 3: ba-eos (log .36) and aa-eos (log .12) rank 1 and 2, both finish: ba -0.574679,
    # aa -2.120264 / 1.777778 = -1.192648.
    hyps, steps = run(DecodeConfig(beam=2, alpha=2.0, max_len_a=0, max_len_b=3, nbest=2))
    assert steps == 3
    assert [h.tokens for h in hyps] == [[B_, A], [A]]
    assert [h.score for h in hyps] == pytest.approx([-0.574679, -0.637348], abs=1e-6)
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.36), math.log(0.42)], abs=1e-6)
    assert [h.length for h in hyps] == [3, 2]


def test_scripted_max_len_truncates():
    # max_len 2, alpha 0: at step 2 every top-2 candidate finishes: a-eos (.42, |Y|=2) and
    # the truncated "b a" (.36, |Y|=2, no eos).
    hyps, steps = run(DecodeConfig(beam=2, alpha=0.0, max_len_a=0, max_len_b=2, nbest=2))
    assert steps == 2
    assert [(h.tokens, h.length) for h in hyps] == [([A], 2), ([B_, A], 2)]
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.42), math.log(0.36)], abs=1e-6)


def test_scripted_min_len_forbids_early_eos():
    # min_len 3: eos impossible at step 2 (not renormalised). Step 2 live: ba .36, aa .12;
    # step 3: ba-eos .36 is best.
    hyps, _ = run(DecodeConfig(beam=2, alpha=0.0, max_len_a=0, max_len_b=3), min_len=3)
    assert [h.tokens for h in hyps] == [[B_, A]]
    assert hyps[0].log_prob == pytest.approx(math.log(0.36), abs=1e-6)


def test_scripted_beam1():
    # Beam 1: a (.6), then eos (.7): log .42; lp(2) with alpha .6 = (7/6)^.6. The live "aa"
    # (.12) cannot beat it: .12 < .42 and longer outputs are penalised at most lp(max) times.
    request = SearchRequest(DecodeConfig(beam=1, alpha=0.6))
    hyp = decode_ids(ScriptedModel(TABLE), SRC.tolist(), request)[0][0]
    assert (hyp.tokens, hyp.length) == ([A], 2)
    assert hyp.score == pytest.approx(math.log(0.42) / (7 / 6) ** 0.6, abs=1e-6)


def test_gnmt_penalty_values():
    assert gnmt_length_penalty(1, 0.6) == pytest.approx(1.0)
    assert gnmt_length_penalty(7, 0.6) == pytest.approx(2**0.6)
    assert gnmt_length_penalty(torch.tensor([1, 7]), 1.0).tolist() == pytest.approx([1.0, 2.0])


def test_presets():
    assert DecodeConfig.preset("translation") == DecodeConfig(4, 0.6, 1.0, 50, 1)
    assert DecodeConfig.preset("parsing") == DecodeConfig(21, 0.3, 1.0, 300, 1)
    assert DecodeConfig().max_len(torch.tensor([3, 10]), cap=55).tolist() == [53, 55]


# --- a tiny random Transformer -------------------------------------------------------------------


def test_eos_is_reached():
    lengths = [h[0].length for h in beam_search(tiny_model(), random_src(), SHORT)]
    assert any(n < 8 for n in lengths)  # the tests below exercise sentences leaving the batch


def argmax_chain(model, src: torch.Tensor, steps: int) -> list[list[int]]:
    """The most probable next token (never pad or bos) at every position, by full forwards
    without a cache, until eos or ``steps`` tokens: greedy search written as plainly as can be."""
    outputs = []
    for row in src:
        s, out = row[row != PAD][None], []
        while len(out) < steps and (not out or out[-1] != EOS):
            logits = model(s, torch.tensor([[BOS, *out]]))[0, -1]
            logits[[PAD, BOS]] = float("-inf")
            out.append(int(logits.argmax()))
        outputs.append(out[:-1] if out[-1] == EOS else out)
    return outputs


def test_beam1_alpha0_is_greedy():
    # decode_ids has one path: beam 1 is beam search with k = 1. With alpha = 0 a live
    # hypothesis can never beat a finished one (scores only drop), so it stops at the first
    # eos, as greedy search does. (With alpha > 0 beam 1 may rightly continue past an eos that
    # a longer, better-normalised hypothesis beats; greedy search would not: beam search is
    # what the paper's scoring asks for, so it is the one path.)
    model, src = tiny_model(), random_src()
    config = DecodeConfig(beam=1, alpha=0.0, max_len_a=1.0, max_len_b=6)
    with torch.no_grad():
        expected = argmax_chain(model, src, steps=int(config.max_len(torch.tensor([9]))))
    lengths = (src != PAD).sum(1).tolist()
    got = [
        h[0].tokens
        for h in decode_ids(
            model, [r[:n] for r, n in zip(src.tolist(), lengths)], SearchRequest(config)
        )
    ]
    assert got == [e[: int(config.max_len(torch.tensor([n])))] for e, n in zip(expected, lengths)]


class Uncached:
    """Wraps a model: every step recomputes the whole prefix with a fresh cache."""

    def __init__(self, model) -> None:
        self.model = model

    def encode(self, src):
        return self.model.encode(src)

    def src_mask(self, src):
        return self.model.src_mask(src)

    def new_cache(self, memory, src_mask, max_len=None):
        return _Prefixes(memory, src_mask, torch.empty(memory.size(0), 0, dtype=torch.long))

    def decode_step(self, tgt_in, cache):
        cache.rows = torch.cat([cache.rows, tgt_in], dim=1)
        return self.model.decode_step(cache.rows, self.model.new_cache(cache.memory, cache.mask))


class _Prefixes:
    """The rows' prefixes and the live sentences' memory, reordered as a cache is."""

    def __init__(self, memory, mask, rows) -> None:
        self.memory, self.mask, self.rows = memory, mask, rows

    def select(self, rows, sentences=None):
        self.rows = self.rows.index_select(0, rows)
        if sentences is not None:
            self.memory, self.mask = self.memory[sentences], self.mask[sentences]


def test_cached_equals_uncached():
    model, src = tiny_model(), random_src()
    assert hypotheses(beam_search(model, src, SHORT)) == hypotheses(
        beam_search(Uncached(model), src, SHORT)
    )


def test_batched_equals_one_by_one():
    model, src = tiny_model(), random_src()
    batched = beam_search(model, src, SHORT)
    single = [
        beam_search(model, src[i : i + 1, : int((src[i] != PAD).sum())], SHORT)[0]
        for i in range(len(src))
    ]
    assert hypotheses(batched) == hypotheses(single)


def test_large_beam_finds_exhaustive_optimum():
    # Vocabulary: pad, unk, bos, eos, a, b. Outputs use unk, a, b, eos (pad/bos impossible).
    # Enumerate every Y with |Y| <= 4: w eos (|w| <= 3) or 4 tokens cut at the limit.
    alpha, max_len = 0.6, 4
    model, src = tiny_model(vocab=6, seed=3), torch.tensor([[4, 5, 4, EOS]])
    words = [UNK, A, B_]
    outputs = [list(w) + [EOS] for n in range(max_len) for w in itertools.product(words, repeat=n)]
    outputs += [list(w) for w in itertools.product(words, repeat=max_len)]
    with torch.no_grad():

        def log_prob(y):
            tgt = torch.tensor([[BOS] + y])
            lp = torch.log_softmax(model(src, tgt[:, :-1]), -1)[0]
            return float(lp.gather(1, tgt[0, 1:, None]).sum())

        exhaustive = sorted(
            ((log_prob(y) / gnmt_length_penalty(len(y), alpha), y) for y in outputs), reverse=True
        )
    config = DecodeConfig(beam=len(outputs), alpha=alpha, max_len_a=0, max_len_b=max_len, nbest=3)
    hyps = beam_search(model, src, config)[0]
    for (score, y), hyp in zip(exhaustive[:3], hyps):
        assert hyp.tokens == [t for t in y if t != EOS]
        assert hyp.score == pytest.approx(score, abs=1e-5)


# --- translate ----------------------------------------------------------------------------------


class CharTokenizer:
    """'a'..'z' <-> 4..29."""

    def encode_source(self, text: str) -> list[int]:
        ids = [4 + ord(c) - ord("a") for c in text if c.isalpha()]
        return ids + [3] if ids else []

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i - 4) if 4 <= i < 30 else "?" for i in ids)


def test_translate_restores_order_and_empty_lines():
    model = tiny_model()
    lines = ["abc", "", "hello world", "   ", "xy", "abcdefghij"]
    config = DecodeConfig(beam=2, max_len_a=0, max_len_b=5)
    out = translate(
        model, lines, CharTokenizer(), SearchRequest(config, batching=Batching(max_tokens=12))
    )
    alone = SearchRequest(config, batching=Batching(batch_size=1))
    singles = [translate(model, [line], CharTokenizer(), alone)[0] for line in lines]
    assert out == singles
    assert out[1] == "" and out[3] == ""
    assert all(out[i] for i in (0, 2, 4, 5))


def test_overlong_source_truncated_with_warning():
    model = tiny_model()  # tiny: max_len 256 positions
    with pytest.warns(UserWarning, match="truncated"):
        hyps = decode_ids(
            model,
            [[5] * 300 + [EOS]],
            SearchRequest(DecodeConfig(beam=2, max_len_a=0, max_len_b=3)),
        )
    assert len(hyps[0]) == 1


def test_overlong_sources_go_to_on_truncate_instead_of_a_warning(recwarn):
    model = tiny_model()  # tiny: max_len 256 positions
    told = []
    sources = [[5, EOS], [5] * 300 + [EOS], [6] * 257]
    config = DecodeConfig(beam=1, max_len_a=0, max_len_b=2)
    hyps = decode_ids(model, sources, SearchRequest(config), on_truncate=lambda *a: told.append(a))
    assert told == [(1, 301, 256), (2, 257, 256)] and not recwarn.list
    assert len(hyps) == 3 and all(len(h) == 1 for h in hyps)


@pytest.mark.parametrize(
    "batch_size,max_tokens,expected",
    [
        (2, None, [[1, 3], [0, 2], [4]]),
        (None, 10, [[1], [3, 0], [2, 4]]),
    ],
)
def test_length_batches(batch_size, max_tokens, expected):
    # lengths 4, 6, 3, 5, 1: sorted longest first = 1, 3, 0, 2, 4.
    assert list(length_batches([4, 6, 3, 5, 1], batch_size, max_tokens)) == expected


def test_finished_sentences_give_their_places_to_the_last_ones():
    """``fill_from_tail``: the live sentences, each done one among the first n' replaced by a
    live one from after them; ``tail_moves`` reads back just those moves, and refuses others."""
    from aiayn.decode.beam import fill_from_tail
    from aiayn.decode.cache import tail_moves

    done = torch.tensor([False, True, False, True, False, False, True])
    order = fill_from_tail(done)
    assert order.tolist() == [0, 4, 2, 5]
    holes, movers = tail_moves(order)
    assert holes == [1, 3] and movers == [4, 5]
    assert fill_from_tail(torch.tensor([False, False, True])).tolist() == [0, 1]
    assert fill_from_tail(torch.tensor([True, True])).tolist() == []
    assert tail_moves(torch.tensor([1, 0])) is None  # a swap: a mover from the kept places
    assert tail_moves(torch.tensor([0, 2, 1])) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_log_probs_in_the_workspace_equal_a_fresh_tensor(dtype):
    """The search's log-probabilities: float32 logits normalised in place (``_Workspace.take``
    hands them back), bf16 ones cast into the kept buffer; either way bit for bit what
    ``output_log_probs`` computes into a fresh tensor, pad and bos (and eos before min_len)
    impossible, the rest those of ``log_softmax``."""
    from aiayn.decode.beam import _Workspace, output_log_probs

    torch.manual_seed(0)
    logits = (torch.randn(37, 1_003) * 4).to(dtype)
    fresh = output_log_probs(logits.clone(), 2, 3, PAD, BOS, EOS)
    space = _Workspace(torch.device("cpu"))
    given = logits.clone()
    out = space.take(given)
    assert out.dtype == torch.float32 and (out is given) == (dtype == torch.float32)
    lprobs = output_log_probs(given, 2, 3, PAD, BOS, EOS, out)
    assert lprobs.data_ptr() == out.data_ptr()
    assert torch.equal(lprobs, fresh)
    assert lprobs[:, [PAD, BOS, EOS]].eq(float("-inf")).all()
    others = torch.ones(1_003, dtype=torch.bool)
    others[[PAD, BOS, EOS]] = False
    full = torch.log_softmax(logits.float(), dim=-1)
    torch.testing.assert_close(lprobs[:, others], full[:, others], rtol=0, atol=1e-6)
