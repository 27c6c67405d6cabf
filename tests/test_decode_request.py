"""One typed way to ask for a search (``aiayn.decode.request``): the record, its one batching
policy, and the one place an engine refuses what it cannot do."""

from __future__ import annotations

import inspect

import pytest

from aiayn.decode import (
    Batching,
    DecodeConfig,
    OutputConstraint,
    SampleConfig,
    SearchRequest,
    decode_ids,
)
from aiayn.decode.capabilities import check_supported
from aiayn.decode.engine import Engine, TorchEngine
from aiayn.decode.request import BATCH_SIZE, MAX_TOKENS
from aiayn.decode.translate import length_batches, translate, translate_corpus
from aiayn.errors import UserError


def test_every_search_entry_point_takes_one_request_and_a_handful_of_parameters():
    for function in (decode_ids, translate, translate_corpus, Engine.decode_ids):
        params = inspect.signature(function).parameters
        assert "request" in params, function
        assert len(params) <= 9, (function, list(params))  # translate_corpus: window, outputs...
    assert list(inspect.signature(decode_ids).parameters) == [
        "model",
        "sources",
        "request",
        "progress",
        "on_truncate",
    ]


def test_the_one_batching_policy_shrinks_tokens_with_the_rows_of_a_wide_beam():
    assert Batching().batch_size == BATCH_SIZE
    assert Batching().tokens(rows=1) == Batching().tokens(rows=4) == MAX_TOKENS
    assert Batching().tokens(rows=21) == MAX_TOKENS * 4 // 21  # parsing's beam
    assert Batching(max_tokens=100).tokens(rows=21) == 100  # given: taken as it is
    request = SearchRequest(DecodeConfig.preset("parsing"))
    assert request.rows == 21
    assert SearchRequest(sampling=SampleConfig(samples=8)).rows == 8
    # 40 sources of 50 tokens: 8,000 tokens hold 160 at beam 4, 1,523 tokens 30 at beam 21
    wide = list(length_batches([50] * 40, BATCH_SIZE, Batching().tokens(request.rows)))
    assert [len(b) for b in wide] == [30, 10]
    with pytest.raises(UserError, match="max_tokens must be at least 1, got 0"):
        Batching(max_tokens=0)


def test_a_request_is_immutable_and_per_source_lists_become_tuples():
    one, two = OutputConstraint((5,)), OutputConstraint((), [(6, 7)])
    request = SearchRequest(constraints=[one, None, two], first_index=[3, 1, 2])
    assert request.constraints == (one, None, two) and request.first_index == (3, 1, 2)
    assert request.constraints_of([2, 0]) == [two, one]
    assert request.indices([1, 2]) == [1, 2]
    assert SearchRequest(first_index=10).indices([0, 2]) == [10, 12]
    with pytest.raises(AttributeError):
        request.min_len = 3  # type: ignore[misc]
    assert request.features() == {"prefixes", "lexical_constraints"}


def test_an_engine_refuses_what_it_does_not_support_in_one_line_naming_it():
    prefix_only = frozenset({"prefixes"})
    check_supported(SearchRequest(constraints=OutputConstraint((5,))).features(), "x", prefix_only)
    phrases = OutputConstraint((), [(6, 7)], where="c.txt: line 2")
    with pytest.raises(UserError) as refused:
        request = SearchRequest(constraints=(None, phrases), min_len=2)
        check_supported(request.features(), "x", prefix_only, where=request.where())
    message = str(refused.value)
    assert message.startswith("c.txt: line 2: the x engine cannot do: lexical_constraints (")
    assert "; min_len (a minimum output length is our search's);" in message
    assert "\n" not in message
    # ours supports every feature a request can ask for
    check_supported(
        SearchRequest(
            constraints=phrases,
            min_len=2,
            max_src_len=9,
            sampling=SampleConfig(),
            shortlist=object(),  # type: ignore[arg-type]
        ).features(),
        "torch",
        TorchEngine(model=None).supports,
    )
