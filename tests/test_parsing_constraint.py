"""Constrained decoding for parsing: the constraint admits exactly well-formed trees over the
source's words, and beam search under it returns only such trees."""

import random

import pytest
import torch
from _decode_helpers import hypotheses

import aiayn
from aiayn.decode import DecodeConfig, SearchRequest, beam_search, decode_ids
from aiayn.parsing import delinearize
from aiayn.parsing.constraint import TreeConstraint

PIECES = [
    "<pad>",
    "<unk>",
    "<s>",
    "</s>",
    "▁(S",
    "▁)S",
    "▁(NP",
    "▁)NP",
    "▁(VP",
    "▁)VP",
    "▁XX",
    "▁the",
    "▁dog",
    "s",
    "▁bark",
    "▁(ORPHAN",
]
ID = {p: i for i, p in enumerate(PIECES)}
EOS = 3
SOURCE = [ID["▁the"], ID["▁dog"], ID["s"], ID["▁bark"], EOS]  # 3 words: "the dogs bark"
WORDS = ["the", "dogs", "bark"]


def tokens(ids):
    return [PIECES[i][1:] for i in ids if i != EOS]


def walk(constraint, state, ids):
    for i in ids:
        assert i in set(constraint.allowed(state)), (tokens(ids), PIECES[i])
        state = constraint.advance(state, i)
    return state


def random_walk(constraint, source, rng, max_len=100):
    """Token ids of one complete output, each chosen at random among the allowed ones."""
    state, ids = constraint.start(source, max_len), []
    while not ids or ids[-1] != EOS:
        ids.append(rng.choice(list(constraint.allowed(state))))
        state = constraint.advance(state, ids[-1])
        assert len(ids) < 2 * max_len
    return ids


def test_counts_words_from_word_boundary_pieces():
    assert TreeConstraint(PIECES, EOS).start(SOURCE, 100).words == 3


def test_a_gold_tree_is_allowed_token_by_token_and_then_only_eos():
    c = TreeConstraint(PIECES, EOS)
    gold = ["▁(S", "▁(NP", "▁XX", "▁XX", "▁)NP", "▁(VP", "▁XX", "▁)VP", "▁)S"]
    state = walk(c, c.start(SOURCE, 100), [ID[p] for p in gold])
    assert list(c.allowed(state)) == [EOS]


@pytest.mark.parametrize(
    "prefix, refused",
    [
        ([], "</s>"),  # no empty output
        ([], "▁XX"),  # a leaf needs a constituent
        (["▁(S"], "▁)S"),  # no empty constituent
        (["▁(S", "▁(NP", "▁XX"], "▁)S"),  # closes the innermost only
        (["▁(S", "▁XX", "▁XX"], "▁)S"),  # the root waits for every word
        (["▁(S", "▁XX", "▁XX", "▁XX"], "▁XX"),  # one leaf per word
        (["▁(S", "▁XX", "▁XX", "▁XX"], "▁(NP"),  # nothing left to put in it
        (["▁(S", "▁XX", "▁XX", "▁XX", "▁)S"], "▁(S"),  # one root
        (["▁(S"], "s"),  # subword pieces are not tree tokens
        (["▁(S"], "▁(ORPHAN"),  # a label with no closing piece
    ],
)
def test_ill_formed_continuations_are_refused(prefix, refused):
    c = TreeConstraint(PIECES, EOS)
    state = walk(c, c.start(SOURCE, 100), [ID[p] for p in prefix])
    assert ID[refused] not in set(c.allowed(state))


def test_every_random_complete_walk_is_a_well_formed_tree():
    c, rng = TreeConstraint(PIECES, EOS), random.Random(0)
    for _ in range(300):
        ids = random_walk(c, SOURCE, rng)
        tree, repaired = delinearize(tokens(ids), WORDS)
        assert not repaired and tree.words() == WORDS


def test_no_bracket_is_opened_that_the_length_limit_could_not_close():
    c = TreeConstraint(PIECES, EOS)
    state = walk(c, c.start(SOURCE, 9), [ID["▁(S"], ID["▁(NP"]])  # needs 3 XX + 2 closes + eos = 6
    assert ID["▁(VP"] not in set(c.allowed(state)) and ID["▁XX"] in set(c.allowed(state))
    state = walk(c, c.start(SOURCE, 10), [ID["▁(S"], ID["▁(NP"]])
    assert ID["▁(VP"] in set(c.allowed(state))


TAG_PIECES = PIECES + ["▁DT", "▁NNS", "▁VBP"]


def test_tag_leaves_allow_any_tag_and_every_walk_is_a_well_formed_tree():
    c, rng = TreeConstraint(TAG_PIECES, EOS, leaf_tokens={"DT", "NNS", "VBP"}), random.Random(1)
    state = walk(c, c.start(SOURCE, 100), [TAG_PIECES.index(p) for p in ["▁(S", "▁(NP"]])
    assert {TAG_PIECES[i] for i in c.allowed(state)} >= {"▁DT", "▁NNS", "▁VBP"}
    assert ID["▁XX"] not in set(c.allowed(state))  # XX is not a leaf of this vocabulary
    for _ in range(200):
        ids = random_walk(c, SOURCE, rng)
        tree, repaired = delinearize(
            [TAG_PIECES[i][1:] for i in ids if i != EOS], WORDS, leaves="tags"
        )
        assert not repaired and tree.words() == WORDS and set(tree.tags()) <= {"DT", "NNS", "VBP"}


MARKED = ["▁<1>", "▁<2>", "▁<3>"]
INDEX_PIECES = PIECES + MARKED
INDEX_SOURCE = [
    len(PIECES),
    ID["▁the"],
    len(PIECES) + 1,
    ID["▁dog"],
    ID["s"],
    len(PIECES) + 2,
    ID["▁bark"],
    EOS,
]


def test_index_leaves_must_come_in_word_order_and_count_the_words():
    c = TreeConstraint(INDEX_PIECES, EOS, leaf_tokens=["<1>", "<2>", "<3>"], indexed=True)
    state = c.start(INDEX_SOURCE, 100)
    assert state.words == 3  # the markers, not the six word-initial pieces
    state = walk(c, state, [ID["▁(S"]])
    assert [INDEX_PIECES[i] for i in c.allowed(state) if i >= len(PIECES)] == ["▁<1>"]
    state = walk(c, state, [len(PIECES), ID["▁(NP"]])
    assert [INDEX_PIECES[i] for i in c.allowed(state) if i >= len(PIECES)] == ["▁<2>"]
    rng = random.Random(2)
    for _ in range(100):
        ids = random_walk(c, INDEX_SOURCE, rng)
        out = [INDEX_PIECES[i][1:] for i in ids if i != EOS]
        assert [t for t in out if t.startswith("<")] == ["<1>", "<2>", "<3>"]
        assert not delinearize(out, WORDS, leaves="index")[1]


def test_word_leaves_copy_the_source_piece_by_piece():
    c = TreeConstraint(PIECES, EOS, copy_words=True)
    state = c.start(SOURCE, 100)
    assert state.words == 3 and state.source == (
        (ID["▁the"],),
        (ID["▁dog"], ID["s"]),
        (ID["▁bark"],),
    )
    state = walk(c, state, [ID["▁(S"], ID["▁(NP"], ID["▁the"], ID["▁dog"]])
    assert list(c.allowed(state)) == [ID["s"]]  # a word is finished before anything else
    state = walk(c, state, [ID["s"]])
    assert ID["▁bark"] in set(c.allowed(state)) and ID["▁the"] not in set(c.allowed(state))
    rng = random.Random(3)
    for _ in range(100):
        ids = random_walk(c, SOURCE, rng)
        out = "".join(PIECES[i] for i in ids if i != EOS).replace("▁", " ").split()
        tree, repaired = delinearize(out, WORDS, leaves="words")
        assert not repaired and [t for t in out if t[0] not in "()"] == WORDS


def test_at_most_max_open_run_brackets_in_a_row():
    c = TreeConstraint(PIECES, EOS, max_open_run=3)
    state = walk(c, c.start(SOURCE, 100), [ID["▁(S"], ID["▁(NP"]])
    assert ID["▁(VP"] in set(c.allowed(state))
    state = walk(c, state, [ID["▁(VP"]])
    assert ID["▁(NP"] not in set(c.allowed(state)) and ID["▁XX"] in set(c.allowed(state))
    state = walk(c, state, [ID["▁XX"]])  # a leaf ends the run
    assert ID["▁(NP"] in set(c.allowed(state))


def test_a_vocabulary_without_brackets_is_refused():
    with pytest.raises(ValueError, match="not a parsing vocabulary"):
        TreeConstraint(["<pad>", "<unk>", "<s>", "</s>", "▁the"], EOS)


def _model(seed):
    torch.manual_seed(seed)
    cfg = aiayn.ModelConfig(
        N_enc=1, N_dec=1, d_model=16, d_ff=32, h=2, vocab_size=len(PIECES), P_drop=0.0
    )
    return aiayn.Transformer(cfg).eval()


@pytest.mark.parametrize("beam", [1, 4])
def test_constrained_search_of_an_untrained_model_returns_well_formed_trees(beam):
    c = TreeConstraint(PIECES, EOS)
    for seed in range(5):
        request = SearchRequest(DecodeConfig(beam=beam, alpha=0.3, max_len_b=40), constraints=c)
        ((hyp,),) = decode_ids(_model(seed), [SOURCE], request)
        tree, repaired = delinearize(tokens(hyp.tokens), WORDS)
        assert not repaired, tokens(hyp.tokens)


class AllowAll:
    def start(self, source, max_len):
        return None

    def allowed(self, state):
        return range(len(PIECES))

    def advance(self, state, token):
        return state


def test_a_constraint_that_allows_everything_changes_nothing():
    model = _model(0)
    src = torch.tensor([SOURCE, SOURCE[:2] + [EOS, 0, 0]])
    config = DecodeConfig(beam=3, alpha=0.6, max_len_b=10, nbest=3)
    plain = beam_search(model, src, config)
    allowed = beam_search(model, src, config, constraint=AllowAll())
    assert hypotheses(plain) == hypotheses(allowed)
