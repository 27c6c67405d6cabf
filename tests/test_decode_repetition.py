"""The repetition guards (``aiayn.decode.repetition``): each one's effect on a scripted model,
worked by hand, and, under Hugging Face's search rules, transformers' ``generate`` exactly."""

import math
from dataclasses import replace

import peer_search as bench
import pytest
import torch
from _decode_helpers import B_, EOS, SRC, A, ScriptedModel

from aiayn.decode import DecodeConfig, SearchRequest, beam_search, decode_ids
from aiayn.decode.capabilities import check_supported
from aiayn.decode.repetition import ban_repeated_ngrams, penalize_repeats
from aiayn.decode.rules import SEARCH_RULES
from aiayn.errors import UserError

# a b a b ... loops: after "a b a" the model wants b again (.6), then eos.
LOOP = {
    (): {A: 1.0},
    (A,): {B_: 1.0},
    (A, B_): {A: 0.9, EOS: 0.1},
    (A, B_, A): {B_: 0.6, EOS: 0.4},
    (A, B_, A, B_): {EOS: 1.0},
}


def best(table, **config):
    hyps = beam_search(ScriptedModel(table), SRC, DecodeConfig(beam=1, alpha=0.0, **config))
    return hyps[0][0].tokens, hyps[0][0].log_prob


def test_no_repeat_ngram_bans_the_token_that_would_repeat_an_ngram():
    assert best(LOOP)[0] == [A, B_, A, B_]
    # "a b" occurred; after "a b a" the b would make "a b" again: banned, eos it is.
    tokens, log_prob = best(LOOP, no_repeat_ngram_size=2)
    assert tokens == [A, B_, A]
    assert log_prob == pytest.approx(math.log(0.9) + math.log(0.4))
    # trigrams: "b a b" is new, so the loop stands.
    assert best(LOOP, no_repeat_ngram_size=3)[0] == [A, B_, A, B_]


def test_repetition_penalty_multiplies_seen_tokens_log_probabilities():
    # After "a b": a was seen (log .9 * 2), eos was not (log .1): -0.21 > -0.23, a still wins;
    # after "a b a": b was seen, log .6 * 2 = -1.02 < log .4 = -0.92, so eos.
    tokens, log_prob = best(LOOP, repetition_penalty=2.0)
    assert tokens == [A, B_, A]
    assert log_prob == pytest.approx(2 * math.log(0.9) + math.log(0.4))


def test_guards_on_hand_made_rows():
    lprobs = torch.tensor([[-1.0, -2.0, 0.0, -4.0], [-1.0, -2.0, -3.0, -4.0]])
    prefixes = torch.tensor([[1, 2, 1], [3, 3, 3]])
    expected = torch.tensor([[-1.0, -3.0, 0.0, -4.0], [-1.0, -2.0, -3.0, -6.0]])
    assert torch.equal(penalize_repeats(lprobs, prefixes, 1.5), expected)
    # bigrams: row 0 ends in 1, and "1 2" occurred: 2 banned; row 1: "3 3": 3 banned
    banned = ban_repeated_ngrams(lprobs, prefixes, 2)
    assert torch.isinf(banned).nonzero().tolist() == [[0, 2], [1, 3]]
    # unigrams: every token already out is banned
    assert torch.isinf(ban_repeated_ngrams(lprobs, prefixes, 1)).sum().item() == 3


@pytest.mark.parametrize("rules", list(SEARCH_RULES))
def test_every_search_rule_applies_the_guards(rules):
    found, _ = best(LOOP, rules=SEARCH_RULES[rules], no_repeat_ngram_size=2)
    assert found == [A, B_, A]


def test_decode_config_refuses_bad_guards():
    with pytest.raises(UserError, match="no_repeat_ngram_size must be >= 0"):
        DecodeConfig(no_repeat_ngram_size=-1)
    with pytest.raises(UserError, match="repetition_penalty must be a finite number > 0"):
        DecodeConfig(repetition_penalty=0.0)


def test_engines_without_the_guards_refuse_them():
    request = SearchRequest(DecodeConfig(no_repeat_ngram_size=3, repetition_penalty=1.2))
    assert request.features() == {"no_repeat_ngram", "repetition_penalty"}
    check_supported(
        replace(request, decode=DecodeConfig(no_repeat_ngram_size=3)).features(),
        "x",
        frozenset({"no_repeat_ngram"}),
    )
    with pytest.raises(UserError, match="cannot do: repetition_penalty .CTranslate2 applies"):
        check_supported(request.features(), "ctranslate2", frozenset({"no_repeat_ngram"}))


LIMIT = 30  # outputs reach it; the rules' own hundreds of tokens would only take longer


@pytest.mark.slow
def test_hf_rules_with_guards_equal_transformers_generate(tiny_corpus):
    pytest.importorskip("transformers")
    from _export_models import corpus_lines, trained_like_model

    from aiayn.data import Vocab

    vocab = Vocab.load(tiny_corpus / "spm.model")
    model = trained_like_model(len(vocab), eos_scale=4.0)
    sources = [vocab.encode_source(line) for line in corpus_lines("test", 0, 200)]
    rules = replace(SEARCH_RULES["hf"], max_len=LIMIT)
    plain = DecodeConfig(beam=bench.BEAM, alpha=bench.ALPHA, rules=rules)
    guarded = replace(plain, no_repeat_ngram_size=3, repetition_penalty=1.2)
    mine, unguarded = (
        [h[0].tokens if h else [] for h in decode_ids(model, sources, SearchRequest(c))]
        for c in (guarded, plain)
    )
    theirs = bench.hf_outputs(
        model, sources, max_len=LIMIT, no_repeat_ngram_size=3, repetition_penalty=1.2
    )
    assert theirs == mine
    assert sum(a != b for a, b in zip(mine, unguarded)) > 20  # the guards changed outputs


def test_cli_refuses_repetition_penalty_on_ctranslate2_before_exporting(capsys, tmp_path):
    from aiayn.cli.main import main

    argv = ["translate", "--checkpoint", str(tmp_path), "--engine", "ctranslate2"]
    for option, value in (("--repetition-penalty", "1.2"), ("--no-repeat-ngram-size", "3")):
        with pytest.raises(SystemExit):
            main([*argv, option, value])
        assert f"ctranslate2 engine cannot do: {option} (" in capsys.readouterr().err


def test_ctranslate2_bans_the_same_ngrams_but_renormalises(tiny_corpus, tmp_path):
    """Why the CTranslate2 engine refuses the ban: under its own rules with one beam (the
    argmax, which renormalising cannot change) it picks our tokens, so the banned sets agree;
    with four its scores, renormalised over the tokens left, rank the beams otherwise."""
    pytest.importorskip("ctranslate2")
    from _export_models import corpus_lines, trained_like_model

    from aiayn.data import Vocab

    vocab = Vocab.load(tiny_corpus / "spm.model")
    model = trained_like_model(len(vocab), eos_scale=4.0)
    sources = [vocab.encode_source(line) for line in corpus_lines("test", 0, 48)]
    rules = replace(SEARCH_RULES["ct2"], max_len=LIMIT)
    same = {}
    for beam in (1, 4):
        config = DecodeConfig(beam=beam, alpha=bench.ALPHA, rules=rules, no_repeat_ngram_size=2)
        ours = [h[0].tokens if h else [] for h in decode_ids(model, sources, SearchRequest(config))]
        theirs = bench.ct2_outputs(
            model,
            vocab,
            sources,
            tmp_path / str(beam),
            max_len=LIMIT,
            beam_size=beam,
            no_repeat_ngram_size=2,
        )
        same[beam] = sum(a == b for a, b in zip(ours, theirs))
    assert same[1] == len(sources) and same[4] < len(sources)
