"""Target prefixes and lexical constraints (``aiayn.decode.constraints``): every output holds
what was asked, its score is a forced decode's, and ``translate --prefix/--constraints``."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _cli import one_line_error, run_cli
from _decode_helpers import B_, EOS, PAD, SRC, TABLE, A, PrefixCache, ScriptedModel
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.checkpoint import latest_checkpoint
from aiayn.decode import DecodeConfig, OutputConstraint, SampleConfig, beam_search, score_ids
from aiayn.decode.sample import sample
from aiayn.files import read_lines

V = 10  # pad, unk, bos, eos and the six content tokens 4..9


class HashedModel:
    """P(next | prefix) for every prefix: seeded random logits, keyed by the prefix (a scripted
    model over an unbounded table), eos made likely enough that outputs finish."""

    def encode(self, src):
        return torch.zeros(src.size(0), src.size(1), 1)

    def src_mask(self, src):
        return (src != PAD)[:, None, None, :]

    def new_cache(self, memory, src_mask, max_len=None):
        return PrefixCache([() for _ in range(memory.size(0))])

    def decode_step(self, tgt_in, cache):
        cache.rows = [
            p + tuple(x for x in r if x != 2) for p, r in zip(cache.rows, tgt_in.tolist())
        ]
        return torch.stack([self.logits(p) for p in cache.rows])

    @staticmethod
    def logits(prefix: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash(prefix) % (2**31))
        x = torch.randn(V, generator=g) * 2
        x[EOS] += 1.0
        return x


def contains(tokens: list[int], phrase: list[int]) -> bool:
    n = len(phrase)
    return any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


content = st.integers(4, V - 1)
phrases = st.lists(st.lists(content, min_size=1, max_size=3), min_size=0, max_size=3)
prefixes = st.lists(content, max_size=3)


@settings(max_examples=60, deadline=None)
@given(prefix=prefixes, phrases=phrases, beam=st.integers(1, 4), slack=st.integers(0, 4))
def test_every_beam_output_starts_with_the_prefix_and_holds_every_phrase(
    prefix, phrases, beam, slack
):
    need = len(prefix) + sum(map(len, phrases))
    config = DecodeConfig(
        beam=beam, alpha=0.6, max_len_a=0, max_len_b=max(1, need + slack), nbest=beam
    )
    constraint = OutputConstraint(prefix, phrases)
    hyps = beam_search(HashedModel(), SRC, config, constraint=constraint)[0]
    assert hyps
    for h in hyps:
        assert h.tokens[: len(prefix)] == prefix
        assert all(contains(h.tokens, p) for p in phrases)
        target = h.tokens + [EOS] * (h.length - len(h.tokens))
        (forced,) = score_ids(HashedModel(), SRC.tolist(), [target], alpha=0.6)
        assert h.log_prob == pytest.approx(forced.log_prob, abs=1e-4)
        assert h.score == pytest.approx(forced.score, abs=1e-4)


@settings(max_examples=30, deadline=None)
@given(prefix=prefixes, phrases=phrases, slack=st.integers(0, 4), seed=st.integers(0, 99))
def test_every_sample_starts_with_the_prefix_and_holds_every_phrase(prefix, phrases, slack, seed):
    need = len(prefix) + sum(map(len, phrases))
    config = DecodeConfig(beam=1, max_len_a=0, max_len_b=max(1, need + slack))
    sampling = SampleConfig(samples=4, seed=seed)
    constraint = OutputConstraint(prefix, phrases)
    for h in sample(HashedModel(), SRC, config, sampling, indices=[0], constraint=constraint)[0]:
        assert h.tokens[: len(prefix)] == prefix
        assert all(contains(h.tokens, p) for p in phrases)


def test_several_samples_of_each_sentence_keep_that_sentences_constraint():
    # A constraint per sentence and 3 samples each: rows are sentence * 3 + sample, so each
    # sentence's constraint must follow all three of its rows (it used to index past the list).
    src = torch.tensor([[7, 8, 9], [7, 8, PAD], [9, 9, 9]])
    wanted = [OutputConstraint([4, 5], []), None, OutputConstraint((), [[6, 7]])]
    config = DecodeConfig(beam=1, max_len_a=0, max_len_b=6)
    nbest = sample(
        HashedModel(), src, config, SampleConfig(samples=3, seed=2), indices=[0, 1, 2],
        constraint=wanted,
    )  # fmt: skip
    assert [len(hyps) for hyps in nbest] == [3, 3, 3]
    assert all(h.tokens[:2] == [4, 5] for h in nbest[0])
    assert all(contains(h.tokens, [6, 7]) for h in nbest[2])
    free = sample(HashedModel(), src[1:2], config, SampleConfig(samples=3, seed=2), indices=[1])
    assert [h.tokens for h in nbest[1]] == [h.tokens for h in free[0]]  # unconstrained


def test_scripted_constraint_forbids_eos_until_met_and_forces_in_time():
    # Unconstrained, beam 2 gives "a" (log .42). "b" must appear, max_len 3, beam 2. Step 2:
    # a-eos is forbidden; b a (.36), a a (.12) stay live, a b (.06) ranks third. Step 3: "a a"
    # must take b (no room left), which the model gives probability 0: only "b a eos" is left.
    config = DecodeConfig(beam=2, alpha=0.0, max_len_a=0, max_len_b=3, nbest=2)
    model = ScriptedModel(TABLE)
    hyps = beam_search(model, SRC, config, constraint=OutputConstraint((), [[B_]]))[0]
    assert [(h.tokens, h.length) for h in hyps] == [([B_, A], 3)]
    assert hyps[0].log_prob == pytest.approx(math.log(0.36))
    # With the prefix "a": a a (.12) and a b (.06) live after step 2; a a must take b: a b eos.
    hyps = beam_search(model, SRC, config, constraint=OutputConstraint([A], [[B_]]))[0]
    assert [(h.tokens, h.length) for h in hyps] == [([A, B_], 3)]
    assert hyps[0].log_prob == pytest.approx(math.log(0.06))


C = 6  # a third content token for the scripted model below
# P(a)=.5 P(c)=.3 P(b)=.2; after b: eos .9; after a or c: eos .8, each of the others .1.
UNLIKELY_START = {
    (): {A: 0.5, C: 0.3, B_: 0.2},
    (B_,): {EOS: 0.9, A: 0.1},
    (A,): {EOS: 0.8, A: 0.1, B_: 0.1},
    (C,): {EOS: 0.8, C: 0.1, B_: 0.1},
    **{(x, y): {EOS: 1.0} for x in (A, B_, C) for y in (A, B_, C)},
}


def test_banks_keep_the_prefix_that_placed_an_unlikely_phrase():
    # "b" must appear, beam 2. By log P alone, step 1 keeps a (.5) and c (.3) and drops b (.2),
    # so b can only come later: a b (.05) at best. Banked, b holds the bank of one constraint
    # token placed and goes on: b eos (.18), the best output that holds b.
    config = DecodeConfig(beam=2, alpha=0.0, max_len_a=0, max_len_b=3, nbest=2)
    model = ScriptedModel(UNLIKELY_START, vocab=7)
    hyps = beam_search(model, SRC, config, constraint=OutputConstraint((), [[B_]]))[0]
    assert [(h.tokens, h.length) for h in hyps][0] == ([B_], 2)
    assert hyps[0].log_prob == pytest.approx(math.log(0.18))
    assert all(B_ in h.tokens for h in hyps)


def test_a_sentence_without_phrases_decodes_as_alone_beside_one_with_phrases():
    # the banked search's candidates for a sentence with one bank are the k best, as unbanked
    src = torch.tensor([[7, 8, 9], [9, 8, PAD]])
    config = DecodeConfig(beam=3, alpha=0.6, max_len_a=0, max_len_b=6, nbest=3)
    both = beam_search(
        HashedModel(), src, config, constraint=[OutputConstraint((), [[5, 6]]), None]
    )
    alone = beam_search(HashedModel(), src[1:], config)[0]
    assert [(h.tokens, h.score) for h in both[1]] == [(h.tokens, h.score) for h in alone]
    assert all(contains(h.tokens, [5, 6]) for h in both[0])


def test_constraints_longer_than_the_output_are_refused():
    config = DecodeConfig(beam=2, max_len_a=0, max_len_b=3)
    constraint = OutputConstraint([4, 5], [[6, 7]], where="--constraints c.txt: line 2")
    with pytest.raises(
        ValueError, match="--constraints c.txt: line 2: .* 4 tokens, more than the 3"
    ):
        beam_search(HashedModel(), SRC, config, constraint=constraint)


# --- aiayn translate --prefix / --constraints ----------------------------------------------------


def test_translate_prefix_and_constraints(tiny_run, tmp_path, capsys, tiny_corpus):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    sources = read_lines(tiny_corpus.parent / "test.en")[:3]
    src, pre, con = tmp_path / "in.txt", tmp_path / "prefix.txt", tmp_path / "con.txt"
    src.write_text("\n".join(sources) + "\n", encoding="utf-8")
    pre.write_text("Y dijo\n\nEntonces\n", encoding="utf-8")
    con.write_text("Dios\ttierra\tcielo\n\n\tDios\n", encoding="utf-8")
    argv = ["translate", "--checkpoint", ckpt, "--input", src, "--beam", 2]
    code, out, err = run_cli(capsys, *argv, "--prefix", pre, "--constraints", con, "--nbest", 2)
    assert code == 0, err
    lines = [line.split(" ||| ") for line in out.splitlines()]
    assert [f[0] for f in lines] == ["0", "0", "1", "1", "2", "2"]
    for f in lines[:2]:
        assert f[1].startswith("Y dijo") and all(w in f[1] for w in ("Dios", "tierra", "cielo"))
    for f in lines[4:]:
        assert f[1].startswith("Entonces") and "Dios" in f[1]
    # the search's log-probs are those of a forced decode of its outputs (the token scores)
    code, out, err = run_cli(capsys, *argv, "--prefix", pre, "--constraints", con, "--token-scores")
    assert code == 0, err
    for line in out.splitlines():
        for h in json.loads(line)["hypotheses"]:
            assert math.fsum(lp for _, lp in h["tokens"]) == pytest.approx(h["log_prob"], abs=1e-3)


def test_translate_samples_several_outputs_with_a_prefix_or_constraints(tiny_run, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src, pre, con = tmp_path / "in.txt", tmp_path / "prefix.txt", tmp_path / "con.txt"
    src.write_text("Jesus wept.\nIn the beginning\n", encoding="utf-8")
    pre.write_text("Y\n\n", encoding="utf-8")
    con.write_text("\nDios\n", encoding="utf-8")
    argv = ["translate", "--checkpoint", ckpt, "--input", src, "--sample", "--nbest", 2]
    code, out, err = run_cli(capsys, *argv, "--prefix", pre, "--constraints", con)
    assert code == 0, err
    lines = [line.split(" ||| ") for line in out.splitlines()]
    assert [f[0] for f in lines] == ["0", "0", "1", "1"]
    assert all(f[1].startswith("Y") for f in lines[:2])
    assert all("Dios" in f[1] for f in lines[2:])


@pytest.mark.parametrize(
    "option,line,needle",
    [
        (
            "--constraints",
            "Dios\t中文",
            "the phrase '中文' has characters the vocabulary cannot spell",
        ),
        ("--prefix", "Y 中", "the prefix 'Y 中' has characters the vocabulary cannot spell ('中'"),
    ],
)
def test_translate_refuses_what_the_vocabulary_cannot_spell(
    tiny_run, tmp_path, capsys, option, line, needle
):
    # the unknown piece would stand in for it, and an output ending in " ⁇ " would "meet" it
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src, given = tmp_path / "in.txt", tmp_path / "given.txt"
    src.write_text("Jesus wept.\n", encoding="utf-8")
    given.write_text(line + "\n", encoding="utf-8")
    code, out, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", src, option, given
    )
    assert code == 2 and "⁇" not in out
    one_line_error(err, f"{option} {given}: line 1: {needle}")


def test_translate_refuses_a_prefix_file_of_another_length(tiny_run, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src, pre = tmp_path / "in.txt", tmp_path / "prefix.txt"
    src.write_text("one\ntwo\nthree\n", encoding="utf-8")
    pre.write_text("a\nb\n", encoding="utf-8")
    code, _, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", src, "--prefix", pre
    )
    assert code == 2
    one_line_error(err, f"--prefix {pre} has 2 lines", "3")
    pre.write_text("a\nb\nc\nd\n", encoding="utf-8")
    code, _, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", src, "--prefix", pre
    )
    assert code == 2
    one_line_error(err, f"--prefix {pre} has 4 lines", "3")


def test_translate_checks_a_prefix_files_lines_before_translating(tiny_run, tmp_path, capsys):
    # one line too many was found only after every input line was translated and printed
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src, con = tmp_path / "in.txt", tmp_path / "con.txt"
    src.write_text("one\ntwo\n", encoding="utf-8")
    con.write_text("Dios\n\nDios\n", encoding="utf-8")
    code, out, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", src, "--constraints", con
    )
    assert code == 2 and out == ""
    one_line_error(err, f"--constraints {con} has 3 lines, the input 2")
