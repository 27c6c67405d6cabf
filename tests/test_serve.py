"""`aiayn serve`: the batcher alone, the API through FastAPI's test client, the real server in a
subprocess (SIGTERM, CLI errors), and the page in headless Chromium."""

import asyncio
import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

import aiayn
from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.data import Vocab
from aiayn.decode import (
    DecodeConfig,
    OutputConstraint,
    SampleConfig,
    SearchRequest,
    decode_ids,
    nbest_outputs,
    translate,
)
from aiayn.errors import UserError
from aiayn.serve import (
    Adapter,
    Batcher,
    DeadlinePassed,
    Limits,
    QueueFull,
    ShuttingDown,
    TranslateJob,
    create_app,
    make_server,
)
from aiayn.serve.app import DRAIN_BYTES
from aiayn.translator import Translator as Library


def served(checkpoint, **options) -> Adapter:
    """The server's adapter of ``aiayn.Translator(checkpoint)``, as ``aiayn serve`` opens it
    (one process, fp32 unless asked)."""
    return Adapter(Library(checkpoint, workers=1, **{"precision": "fp32", **options}))


SENTENCES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good.",
    "And God called the light Day, and the darkness he called Night.",
    "And the evening and the morning were the first day.",
    "Let the waters under the heaven be gathered together unto one place.",
    "And God called the dry land Earth.",
    "And the earth brought forth grass.",
    "And God made two great lights.",
    "And God set them in the firmament of the heaven.",
    "And God created great whales.",
]


# --- the batcher alone --------------------------------------------------------------------------


def _run_batcher(items, handle, **kwargs):
    """Submit ``items`` at once; return (results or exceptions, the batcher's stats)."""

    async def main():
        batcher = Batcher(
            handle,
            **{
                "cost": len,
                "key": lambda item: item[0],
                "max_cost": 100,
                "max_wait_s": 0.2,
                **kwargs,
            },
        )
        try:
            return await asyncio.gather(
                *(batcher.submit(i) for i in items), return_exceptions=True
            ), batcher.stats
        finally:
            batcher.close()

    return asyncio.run(main())


def test_batcher_groups_by_key_in_arrival_order():
    calls = []

    def handle(items):
        calls.append(list(items))
        return [item.upper() for item in items]

    results, stats = _run_batcher(["ab", "bc", "ad", "bd", "ae"], handle)
    assert results == ["AB", "BC", "AD", "BD", "AE"]
    assert calls == [["ab", "ad", "ae"], ["bc", "bd"]]  # one call per key, one window
    assert (stats.requests, stats.batches, stats.largest) == (5, 2, 3)


def test_batcher_keeps_to_the_cost_budget_and_runs_an_oversize_item_alone():
    calls = []

    def handle(items):
        calls.append(list(items))
        return [len(item) for item in items]

    results, _ = _run_batcher(["aaa", "aaa", "aaa", "aaaaaaaaaa", "a"], handle, max_cost=6)
    assert results == [3, 3, 3, 10, 1]
    assert calls == [["aaa", "aaa"], ["aaa"], ["aaaaaaaaaa"], ["a"]]


def test_batcher_with_zero_budget_decodes_each_item_alone():
    calls = []
    results, stats = _run_batcher(
        ["ab", "ac", "ad"], lambda items: calls.append(items) or items, max_cost=0
    )
    assert (
        results == ["ab", "ac", "ad"] and calls == [["ab"], ["ac"], ["ad"]] and stats.largest == 1
    )


def test_a_failing_item_fails_alone_and_the_others_are_answered():
    def handle(items):
        if "a!" in items:
            raise ValueError("cannot decode a!")
        return [item * 2 for item in items]

    results, stats = _run_batcher(["ab", "a!", "ac"], handle)
    assert results[0] == "abab" and results[2] == "acac"
    assert isinstance(results[1], ValueError) and str(results[1]) == "cannot decode a!"
    assert stats.failures == 1


def test_close_finishes_what_is_queued_then_refuses():
    async def main():
        batcher = Batcher(
            lambda items: [i + 1 for i in items],
            cost=lambda i: 1,
            key=lambda i: 0,
            max_cost=10,
            max_wait_s=0.5,
        )
        pending = [asyncio.ensure_future(batcher.submit(i)) for i in range(3)]
        await asyncio.sleep(0.05)  # queued, the worker still waiting for company
        await asyncio.get_running_loop().run_in_executor(None, batcher.close)
        with pytest.raises(ShuttingDown):
            await batcher.submit(9)
        return await asyncio.gather(*pending)

    assert asyncio.run(main()) == [1, 2, 3]


class SlowHandle:
    """A decode function the test holds: each call is recorded, and the one for ``slow`` waits
    until ``release`` is set (a long batch decoding)."""

    def __init__(self, slow):
        self.slow, self.calls = slow, []
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, items):
        self.calls.append(list(items))
        if self.slow in items:
            self.started.set()
            assert self.release.wait(timeout=30)
        return [item.upper() for item in items]


async def _until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _eventually(condition, timeout=60.0) -> None:
    """Wait until ``condition()`` holds: a state to reach, not a time to guess, so a busy
    machine makes the test slower, never wrong."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class HeldFirstDecode:
    """A translator's ``decode`` whose first call (the first batch) waits for ``release``: the
    requests sent meanwhile queue behind it, then form the next batch together, however slowly
    they arrived."""

    def __init__(self, decode):
        self.decode, self.held = decode, True
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, jobs):
        if self.held:
            self.held = False
            self.started.set()
            assert self.release.wait(timeout=60)
        return self.decode(jobs)


def test_requests_cancelled_while_queued_are_dropped_undecoded():
    handle = SlowHandle("a")

    async def main():
        batcher = Batcher(handle, cost=len, key=lambda i: 0, max_cost=100, max_wait_s=0)
        first = asyncio.ensure_future(batcher.submit("a"))
        await _until(handle.started.is_set)  # "a" is decoding; the next two wait behind it
        gone = asyncio.ensure_future(batcher.submit("b"))
        after = asyncio.ensure_future(batcher.submit("c"))
        await asyncio.sleep(0.05)
        gone.cancel()  # what the app does when b's client hangs up
        await asyncio.sleep(0.05)
        handle.release.set()
        try:
            return await first, await after, gone.cancelled(), batcher.stats
        finally:
            batcher.close()

    first, after, cancelled, stats = asyncio.run(main())
    assert (first, after, cancelled) == ("A", "C", True)
    assert handle.calls == [["a"], ["c"]]  # b was never decoded
    assert (stats.requests, stats.cancelled) == (2, 1)


def test_stop_refuses_new_requests_and_fails_those_still_queued_at_the_deadline():
    handle = SlowHandle("a")

    async def main():
        batcher = Batcher(handle, cost=len, key=lambda i: 0, max_cost=0, max_wait_s=0)
        decoding = asyncio.ensure_future(batcher.submit("a"))
        await _until(handle.started.is_set)
        queued = [asyncio.ensure_future(batcher.submit(i)) for i in ("b", "c")]
        await asyncio.sleep(0.05)
        start = time.monotonic()
        batcher.stop(0.3)
        with pytest.raises(ShuttingDown):
            await batcher.submit("d")
        refused = await asyncio.gather(*queued, return_exceptions=True)
        waited = time.monotonic() - start
        assert not decoding.done()  # refused while "a" still decodes, not after it
        handle.release.set()
        try:
            return await decoding, refused, waited
        finally:
            await asyncio.get_running_loop().run_in_executor(None, batcher.close)

    answer, refused, waited = asyncio.run(main())
    assert answer == "A" and handle.calls == [["a"]]
    assert all(isinstance(r, ShuttingDown) and "not decoded" in str(r) for r in refused)
    # not before the deadline; how long after, a busy machine decides (the refusal came while
    # "a" was still decoding, which main checks)
    assert waited > 0.25


def test_a_full_queue_refuses_at_once_and_frees_up_as_requests_leave():
    handle = SlowHandle("a")

    async def main():
        batcher = Batcher(handle, cost=len, key=lambda i: 0, max_cost=0, max_wait_s=0, max_queue=2)
        decoding = asyncio.ensure_future(batcher.submit("a"))
        await _until(handle.started.is_set)  # "a" decoding is not waiting: the queue is empty
        queued = [asyncio.ensure_future(batcher.submit(i)) for i in ("b", "c")]
        await _until(lambda: batcher.waiting == 2)
        with pytest.raises(QueueFull, match="2 requests are waiting already") as full:
            await batcher.submit("d")
        queued[0].cancel()  # a client that left makes room
        await _until(lambda: batcher.waiting == 1)
        late = asyncio.ensure_future(batcher.submit("e"))
        await _until(lambda: batcher.waiting == 2)
        handle.release.set()
        try:
            return full.value, await decoding, await queued[1], await late, batcher.stats
        finally:
            batcher.close()

    full, *answers, stats = asyncio.run(main())
    assert full.retry_after_s >= 1 and answers == ["A", "C", "E"]
    assert handle.calls == [["a"], ["c"], ["e"]]  # b cancelled, d refused: neither decoded
    assert (stats.rejected, stats.cancelled, stats.requests) == (1, 1, 3)


def test_a_request_whose_decode_has_not_started_by_its_deadline_is_answered_then_undecoded():
    handle = SlowHandle("a")

    async def main():
        batcher = Batcher(
            handle, cost=len, key=lambda i: 0, max_cost=100, max_wait_s=0, deadline_s=0.5
        )
        decoding = asyncio.ensure_future(batcher.submit("a"))
        await _until(handle.started.is_set)
        start = time.monotonic()
        with pytest.raises(DeadlinePassed, match="waited 0.5 s, its deadline") as late:
            await batcher.submit("b")  # behind "a", which the test holds past b's deadline
        waited = time.monotonic() - start
        assert not decoding.done()  # answered at its deadline, not when "a" is done
        handle.release.set()
        try:
            return late.value, waited, await decoding, batcher.stats
        finally:
            batcher.close()

    late, waited, answer, stats = asyncio.run(main())
    assert answer == "A" and handle.calls == [["a"]]  # b never decoded
    assert waited >= 0.5 and late.retry_after_s >= 1
    assert (stats.expired, stats.requests) == (1, 1) and stats.longest_wait_s < 0.5


def test_a_poison_item_is_found_by_bisection_not_by_decoding_each_alone():
    calls = []

    def handle(items):
        calls.append(list(items))
        if "a!" in items:
            raise ValueError("cannot decode a!")
        return [item * 2 for item in items]

    items = [f"a{i:x}" for i in range(16)]
    items[11] = "a!"
    results, stats = _run_batcher(items, handle)
    assert [r for i, r in enumerate(results) if i != 11] == [x * 2 for x in items if x != "a!"]
    assert isinstance(results[11], ValueError) and stats.failures == 1
    # the batch of 16, then two halves per level down to the poison: 1 + 2 log2(16); one at a
    # time would be 1 + 16
    assert calls[0] == items and len(calls) == 1 + 2 * 4
    assert (stats.batches, stats.requests) == (1, 16)  # one batch as far as the stats go


# --- a tiny checkpoint and the API through the test client ------------------------------------------


# tiny ops on a busy 2-core machine: a second intra-op thread only adds waiting
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tiny_corpus, tmp_path_factory) -> Path:
    """A seeded random tiny Transformer with the 300-piece vocabulary of the corpus fixture:
    its translations are nonsense, but they and their scores depend on the input."""
    vocab = Vocab.load(tiny_corpus / "spm.model")
    torch.manual_seed(0)
    # 40 positions: room for every test sentence, and outputs (capped there) decode quickly.
    model = aiayn.Transformer(
        aiayn.ModelConfig.preset("tiny", vocab_size=len(vocab), max_len=40)
    ).eval()
    meta = {"update": 7, "model_config": dataclasses.asdict(model.cfg)}
    return save_checkpoint(
        tmp_path_factory.mktemp("serve") / "ckpts", 7, model, meta, None, vocab.path
    )


@pytest.fixture(scope="module")
def translator(checkpoint) -> Adapter:
    return served(checkpoint)


@contextmanager
def client(translator: Adapter, **limits):
    with TestClient(create_app(translator, Limits(**limits))) as c:
        yield c


def _alone(translator: Adapter, lines: list[str], **config) -> list[dict]:
    """The answers for ``lines`` decoded by themselves, outside the server."""
    return translator.decode([TranslateJob(translator.encode(lines), DecodeConfig(**config))])[0]


def _by_sentence(translator: Adapter, lines: list[str], **config) -> dict[str, dict]:
    """The library's answer for each of ``lines`` (decoded together, in one call)."""
    return dict(zip(lines, _alone(translator, lines, **config)))


def _same(got: list[dict], expected: list[dict]) -> bool:
    return [a["text"] for a in got] == [a["text"] for a in expected] and all(
        (a["score"] is None and b["score"] is None) or abs(a["score"] - b["score"]) < 1e-4
        for a, b in zip(got, expected)
    )


def test_translations_are_the_librarys(translator):
    lines = [SENTENCES[0], "", SENTENCES[1]]
    with client(translator) as c:
        r = c.post("/translate", json={"text": lines, "beam": 3, "alpha": 1.0})
    assert r.status_code == 200
    answers = r.json()["translations"]
    request = SearchRequest(DecodeConfig(beam=3, alpha=1.0))
    assert [a["text"] for a in answers] == translate(
        translator.model, lines, translator.vocab, request
    )
    assert answers[1] == {"text": "", "score": None, "nbest": []}  # a blank line touches no model
    hyps = decode_ids(translator.model, translator.encode(lines), request)
    assert answers[0]["score"] == pytest.approx(hyps[0][0].score, abs=1e-5)
    assert "attention" not in answers[0]


def test_answers_cut_at_the_length_limit_say_so_as_the_commands_json_lines_do(translator):
    lines = SENTENCES[:4]
    with client(translator) as c:
        answers = c.post("/translate", json={"text": lines, "beam": 3, "nbest": 3}).json()
    request = SearchRequest(DecodeConfig(beam=3, nbest=3))
    hyps = decode_ids(translator.model, translator.encode(lines), request)
    expected = [[len(h.tokens) == h.length for h in hs] for hs in hyps]
    assert any(any(cuts) for cuts in expected), "the random model runs to its 40 positions"
    got = answers["translations"]
    assert [[h.get("cut", False) for h in a["nbest"]] for a in got] == expected
    assert [a.get("cut", False) for a in got] == [cuts[0] for cuts in expected]
    # only where true, as the JSON lines: an answer that ended with eos has no "cut" at all
    assert all(("cut" in h) == cut for a, c in zip(got, expected) for h, cut in zip(a["nbest"], c))


def test_int8_server_answers_as_the_int8_library(checkpoint):
    """``aiayn serve --quantize int8`` decodes with the same int8 model as ``aiayn translate
    --quantize int8``, loaded from safetensors and quantized after loading."""
    quantized = served(checkpoint, quantize="int8")
    assert any(
        isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in quantized.model.modules()
    )
    lines = SENTENCES[:3]
    with client(quantized) as c:
        r = c.post("/translate", json={"text": lines, "beam": 2})
        info = c.get("/info").json()
    assert r.status_code == 200 and info["quantized"] == "int8"
    # one request: batched exactly as the library call below, so even int8 output matches
    assert [a["text"] for a in r.json()["translations"]] == translate(
        quantized.model, lines, quantized.vocab, SearchRequest(DecodeConfig(beam=2))
    )


def test_nbest_lists_the_beams_best_first(translator):
    with client(translator) as c:
        answer = c.post("/translate", json={"text": [SENTENCES[2]], "beam": 4, "nbest": 3}).json()[
            "translations"
        ][0]
    scores = [h["score"] for h in answer["nbest"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert (answer["nbest"][0]["text"], answer["nbest"][0]["score"]) == (
        answer["text"],
        answer["score"],
    )
    assert len({h["text"] for h in answer["nbest"]}) == 3


def test_search_rules_are_another_toolkits_search_as_the_library_runs_it(translator):
    """``search_rules``: the request's hypotheses and scores are those of ``decode_ids`` with
    that toolkit's rules, and the scores are its length penalty's, not the paper's."""
    from aiayn.decode.rules import SEARCH_RULES

    vocab, model = translator.vocab, translator.model
    sources = [vocab.encode_source(line) for line in SENTENCES[:3]]
    with client(translator) as c:
        answers = {
            rules: c.post(
                "/translate", json={"text": SENTENCES[:3], "beam": 2, "search_rules": rules}
            ).json()["translations"]
            for rules in ("paper", "fairseq")
        }
    for rules, answer in answers.items():
        config = DecodeConfig(beam=2, rules=SEARCH_RULES[rules])
        hyps = decode_ids(model, sources, SearchRequest(config).with_ids(vocab))
        assert [a["text"] for a in answer] == [vocab.decode(h[0].tokens) for h in hyps]
        assert [a["score"] for a in answer] == [h[0].score for h in hyps]
        for a, h in zip(answer, hyps):  # |Y| counts the eos in both rules
            penalty = config.rules.length_penalty(h[0].length, config.alpha)
            assert a["score"] == pytest.approx(a["nbest"][0]["log_prob"] / penalty)
    assert [a["score"] for a in answers["paper"]] != [a["score"] for a in answers["fairseq"]]


def test_attention_is_the_best_hypothesis_against_its_source(translator):
    with client(translator) as c:
        answer = c.post("/translate", json={"text": [SENTENCES[3]], "attention": True}).json()[
            "translations"
        ][0]
    att, cfg, vocab = answer["attention"], translator.model.cfg, translator.vocab
    source_ids = vocab.encode(SENTENCES[3]) + [vocab.eos_id]
    assert att["source"] == [vocab.id_to_piece(i) for i in source_ids]
    best = decode_ids(translator.model, [source_ids], SearchRequest())[0][0]
    ended = (
        ["</s>"] if best.length > len(best.tokens) else []
    )  # stopped by eos, not by the length limit
    assert att["target"] == [vocab.id_to_piece(i) for i in best.tokens] + ended
    assert vocab.sp.decode_pieces(att["target"][: len(best.tokens)]) == answer["text"]
    weights = torch.tensor(att["weights"])  # (N_dec, h, T, S)
    assert weights.shape == (cfg.N_dec, cfg.h, len(att["target"]), len(att["source"]))
    assert torch.allclose(
        weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-3
    )  # softmax rows
    assert weights.std() > 0.01  # not uniform: the heads look at different source tokens


LONG = " ".join(["light"] * 40)  # under the character limit, over the model's 40 positions


@pytest.mark.parametrize(
    "body, status, message",
    [
        ('{"text": ["a",', 400, "malformed JSON"),
        ("not json", 400, "malformed JSON"),
        ('["a sentence"]', 422, "the body must be a JSON object"),
        ('{"beam": 2}', 422, "missing field 'text'"),
        ('{"text": "a sentence"}', 422, "text: Input should be a valid list"),
        ('{"text": [1, "b"]}', 422, "text[0]: Input should be a valid string"),
        ('{"text": []}', 422, "text: List should have at least 1 item"),
        ('{"text": ["a"], "beam": "4"}', 422, "beam: Input should be a valid integer"),
        ('{"text": ["a"], "beam": 4.5}', 422, "beam: Input should be a valid integer"),
        ('{"text": ["a"], "alpha": "0.6"}', 422, "alpha: Input should be a valid number"),
        ('{"text": ["a"], "attention": "yes"}', 422, "attention: Input should be a valid boolean"),
        ('{"text": ["a"], "length_penalty": 0.7}', 422, "unknown field 'length_penalty'"),
        ('{"text": ["a"], "temperature": 0.7}', 422, 'temperature needs "sample"'),
        ('{"text": ["a"], "top_k": 5, "seed": 1}', 422, 'top_k needs "sample"'),
        ('{"text": ["a"], "sample": "yes"}', 422, "sample: Input should be a valid boolean"),
        (
            '{"text": ["a"], "search_rules": "moses"}',
            422,
            "search_rules 'moses': choose one of paper, fairseq, hf, ct2, marian",
        ),
        ('{"text": ["a"], "search_rules": 1}', 422, "search_rules: Input should be a valid string"),
        (
            '{"text": ["a"], "sample": true, "search_rules": "hf"}',
            422,
            "search_rules hf is a beam search's",
        ),
        ('{"text": ["a"], "sample": true, "beam": 2}', 422, 'beam has no effect with "sample"'),
        ('{"text": ["a"], "sample": true, "nbest": 33}', 422, "nbest (33) samples: at most 32"),
        (
            '{"text": ["a"], "sample": true, "top_k": -1}',
            422,
            "top_k: Input should be greater than or equal to 0",
        ),
        (
            '{"text": ["a"], "sample": true, "top_p": 0}',
            422,
            "top_p: Input should be greater than 0",
        ),
        (
            '{"text": ["a"], "sample": true, "temperature": 0}',
            422,
            "temperature: Input should be greater than 0",
        ),
        (
            '{"text": ["a"], "sample": true, "seed": 1.5}',
            422,
            "seed: Input should be a valid integer",
        ),
        (
            '{"text": ["a", "b"], "prefix": ["x"]}',
            422,
            "prefix has 1 items but text has 2: give one per sentence",
        ),
        ('{"text": ["a"], "prefix": [3]}', 422, "prefix[0]: Input should be a valid string"),
        (
            '{"text": ["a"], "constraints": ["x"]}',
            422,
            "constraints[0]: Input should be a valid list",
        ),
        (
            '{"text": ["a"], "constraints": [["x"], []]}',
            422,
            "constraints has 2 items but text has 1: give one per sentence",
        ),
        (
            json.dumps({"text": ["a"], "constraints": [[" ".join(["light"] * 20)]]}),
            422,
            "text[0]: the prefix and phrases take 60 tokens, more than the 40 this output may have",
        ),
        (
            json.dumps({"text": ["a"], "constraints": [["Dios", "中文"]]}),
            422,
            "text[0]: the phrase '中文' has characters the vocabulary cannot spell",
        ),
        (
            json.dumps({"text": ["a"], "prefix": ["Y 中"]}),
            422,
            "text[0]: the prefix 'Y 中' has characters the vocabulary cannot spell ('中'",
        ),
        ('{"text": ["a"], "alignment_layer": 0}', 422, 'alignment_layer needs "alignments": true'),
        (
            '{"text": ["a"], "alignments": true, "alignment_layer": 2}',
            422,
            "alignment_layer 2: the model has 2 decoder layer(s) (0..1, or -1 for the last)",
        ),
        ('{"text": ["a"], "beam": 0}', 422, "beam: Input should be greater than or equal to 1"),
        ('{"text": ["a"], "beam": 33}', 422, "beam: Input should be less than or equal to 32"),
        (
            '{"text": ["a"], "alpha": -0.1}',
            422,
            "alpha: Input should be greater than or equal to 0",
        ),
        ('{"text": ["a"], "beam": 4, "nbest": 5}', 422, "nbest must be in [1, beam=4], got 5"),
        (
            '{"text": ["ok", "a\\ud800b"]}',
            422,
            "text[1]: character 1 is a lone surrogate '\\ud800', not Unicode text",
        ),
        ('{"text": ["a"], "\\udfff": 1}', 422, "a field name is not Unicode text"),
        (
            json.dumps({"text": ["a"], "pad": "x" * 6000}),
            413,
            "the body is 6026 bytes; the limit is 5360 bytes per request",
        ),
        (json.dumps({"text": ["a"] * 9}), 413, "text has 9 sentences; the limit is 8 per request"),
        (
            json.dumps({"text": ["a" * 60, "b" * 41]}),
            413,
            "text has 101 characters; the limit is 100 per request",
        ),
        (
            json.dumps({"text": ["a", LONG]}),
            413,
            "text[1] is 121 subword tokens; the model reads at most 40",
        ),
    ],
)
def test_bad_requests_get_one_line_json_errors(translator, body, status, message):
    limits = (
        {"max_sentences": 8, "max_chars": 100} if status == 413 and "text[" not in message else {}
    )
    with client(translator, **limits) as c:
        r = c.post("/translate", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == status
        error = r.json()
        assert list(error) == ["error"] and message in error["error"] and "\n" not in error["error"]
        assert c.get("/health").json()["requests"] == 0  # rejected before any decoding


def _texts(answer: dict) -> list[str]:
    return [h["text"] for h in answer["nbest"]]


def test_prefixes_and_constraints_are_the_librarys(translator):
    lines, vocab = [SENTENCES[0], SENTENCES[1], SENTENCES[2]], translator.vocab
    prefix, constraints = ["Y dijo", "", ""], [[], ["Dios", " "], []]
    with client(translator) as c:
        r = c.post("/translate", json={"text": lines, "prefix": prefix, "constraints": constraints})
    assert r.status_code == 200, r.json()
    answers = r.json()["translations"]
    assert answers[0]["text"].startswith("Y dijo") and "Dios" in answers[1]["text"]
    wanted = [
        OutputConstraint(vocab.encode("Y dijo"), [], eos_id=vocab.eos_id),
        OutputConstraint((), [vocab.encode("Dios")], eos_id=vocab.eos_id),
        None,
    ]
    library = translate(translator.model, lines, vocab, SearchRequest(constraints=wanted))
    assert [a["text"] for a in answers] == library
    assert answers[2]["text"] == translate(translator.model, lines[2:], vocab)[0]


def test_samples_are_the_librarys_and_do_not_depend_on_the_batch(translator):
    lines = [SENTENCES[3], "", SENTENCES[4]]
    body = {"text": lines, "sample": True, "nbest": 3, "seed": 5, "top_k": 20}
    with client(translator) as c:
        answers = c.post("/translate", json=body).json()["translations"]
        again = c.post("/translate", json=body).json()["translations"]
        other = c.post("/translate", json={**body, "seed": 6}).json()["translations"]
    sampling = SampleConfig(samples=3, seed=5, top_k=20)
    library = nbest_outputs(
        translator.model, lines, translator.vocab, SearchRequest(sampling=sampling)
    )
    assert [_texts(a) for a in answers] == [[o.text for o in outs] for outs in library]
    assert answers == again and [_texts(a) for a in other] != [_texts(a) for a in answers]
    assert answers[1]["nbest"] == [] and len(answers[0]["nbest"]) == 3
    # decoded with another request in one call, a request's samples stay its own
    job = TranslateJob(translator.encode(lines), DecodeConfig(), sampling=sampling)
    other_job = TranslateJob(translator.encode(SENTENCES[5:9]), DecodeConfig(), sampling=sampling)
    alone = translator.decode([job])[0]
    together = translator.decode([other_job, job])[1]
    assert [_texts(a) for a in together] == [_texts(a) for a in alone]  # scores: up to padding
    assert [a["score"] for a in together] == pytest.approx([a["score"] for a in alone], abs=1e-4)
    assert [_texts(a) for a in alone] == [_texts(a) for a in answers]


def test_several_samples_with_prefixes_and_constraints(translator):
    lines = [SENTENCES[0], SENTENCES[1]]
    body = {"text": lines, "sample": True, "nbest": 2, "seed": 3}
    body |= {"prefix": ["Y dijo", ""], "constraints": [[], ["Dios"]]}
    with client(translator) as c:
        r = c.post("/translate", json=body)
    assert r.status_code == 200, r.json()
    first, second = (_texts(a) for a in r.json()["translations"])
    assert len(first) == len(second) == 2
    assert all(t.startswith("Y dijo") for t in first) and all("Dios" in t for t in second)


def test_alignments_are_the_librarys(translator):
    lines = [SENTENCES[5], ""]
    body = {"text": lines, "beam": 2, "nbest": 2, "alignments": True, "alignment_layer": 0}
    with client(translator) as c:
        answers = c.post("/translate", json=body).json()["translations"]
    config = DecodeConfig(beam=2, nbest=2)
    library = nbest_outputs(
        translator.model, lines, translator.vocab, SearchRequest(config), alignment_layer=0
    )
    assert [h["alignment"] for h in answers[0]["nbest"]] == [o.alignment for o in library[0]]
    assert answers[0]["alignment"] == library[0][0].alignment != ""
    assert answers[1] == {"text": "", "score": None, "nbest": [], "alignment": None}


def test_unknown_routes_and_methods_answer_json(translator):
    with client(translator) as c:
        assert (c.get("/nowhere").status_code, c.get("/nowhere").json()) == (
            404,
            {"error": "Not Found"},
        )
        assert (c.get("/translate").status_code, c.get("/translate").json()) == (
            405,
            {"error": "Method Not Allowed"},
        )


@pytest.mark.parametrize(
    "content_type, status, message",
    [
        ("application/json; charset=utf-8", 200, None),
        ("application/vnd.api+json", 200, None),
        (
            "text/plain",
            415,
            "the body must be JSON with Content-Type: application/json, not 'text/plain'",
        ),
        (
            "application/x-www-form-urlencoded",  # what curl -d sends without -H
            415,
            "not 'application/x-www-form-urlencoded'",
        ),
        (None, 415, "the body must be JSON with Content-Type: application/json, not none"),
    ],
)
def test_the_body_must_be_sent_as_json(translator, content_type, status, message):
    """Strict on purpose: a browser sends a text/plain POST from any page without asking (no
    CORS preflight), so accepting it would let any web page drive a local server."""
    headers = {"Content-Type": content_type} if content_type else {}
    with client(translator) as c:
        r = c.post("/translate", content='{"text": ["Hello."]}', headers=headers)
    assert r.status_code == status
    if message is not None:
        assert list(r.json()) == ["error"] and message in r.json()["error"]
    else:
        assert len(r.json()["translations"]) == 1


def test_health_info_and_page(translator, checkpoint):
    with client(translator, max_wait_ms=1.0) as c:
        assert c.get("/health").json() == {
            "status": "ok",
            "requests": 0,
            "batches": 0,
            "largest": 0,
            "failures": 0,
            "cancelled": 0,
            "rejected": 0,
            "expired": 0,
            "longest_wait_s": 0.0,
            "longest_decode_s": 0.0,
        }
        info = c.get("/info").json()
        page = c.get("/")
    cfg = translator.model.cfg
    unique = {
        id(p): p.numel() for p in aiayn.Transformer(cfg).parameters()
    }  # served: packed, no Linear params
    assert info["parameters"] == sum(unique.values()) == aiayn.count_parameters(cfg)
    assert info["model_config"] == dataclasses.asdict(cfg) and info["update"] == 7
    assert info["checkpoint"] == str(checkpoint) and info["vocabulary"]["size"] == 300
    assert info["limits"]["max_wait_ms"] == 1.0 and info["decode_defaults"]["beam"] == 4
    assert (info["limits"]["max_queue"], info["limits"]["deadline_s"]) == (256, 30.0)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="heatmap"' in page.text and '"/translate"' in page.text


def _post_together(
    c: TestClient, bodies: list[dict], headers: list[dict] | None = None
) -> list[httpx.Response]:
    """POST every body (with its ``headers``) from its own thread, all released at once."""
    responses: list = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def send(i: int) -> None:
        start.wait()
        responses[i] = c.post("/translate", json=bodies[i], headers=headers[i] if headers else None)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return responses


def _batched_behind_a_held_decode(
    c: TestClient, held: HeldFirstDecode, bodies: list[dict], headers: list[dict] | None = None
):
    """POST ``bodies`` together while the server decodes a first request that ``held`` holds,
    and release it once all of them are queued; their responses, in order."""
    first = threading.Thread(target=c.post, args=("/translate",), kwargs={"json": {"text": ["x"]}})
    first.start()
    assert held.started.wait(timeout=60)
    responses: list = []
    sender = threading.Thread(target=lambda: responses.extend(_post_together(c, bodies, headers)))
    sender.start()
    _eventually(lambda: c.app.state.batcher.waiting == len(bodies))
    held.release.set()
    sender.join(timeout=60)
    first.join(timeout=60)
    return responses


def test_concurrent_clients_get_their_own_answers_in_order_batched(translator, monkeypatch):
    held = HeldFirstDecode(translator.decode)
    monkeypatch.setattr(translator, "decode", held)
    bodies = [{"text": [SENTENCES[i], SENTENCES[(i + 5) % 12]], "beam": 2} for i in range(12)]
    with client(translator, max_wait_ms=0, max_batch_tokens=100_000) as c:
        responses = _batched_behind_a_held_decode(c, held, bodies)
        stats = c.get("/health").json()
    assert all(r.status_code == 200 for r in responses)
    expected = _by_sentence(translator, SENTENCES, beam=2)
    for body, r in zip(bodies, responses):
        assert _same(r.json()["translations"], [expected[line] for line in body["text"]])
    assert (
        len({r.json()["translations"][0]["score"] for r in responses}) == 12
    )  # all different answers
    # the held first request, then the twelve decoded together in one call
    assert (stats["requests"], stats["batches"], stats["largest"]) == (13, 2, 12)


def test_without_batching_each_request_is_decoded_alone(translator):
    bodies = [{"text": [s], "beam": 2} for s in SENTENCES[:4]]
    with client(translator, max_wait_ms=200, max_batch_tokens=0) as c:
        responses = _post_together(c, bodies)
        stats = c.get("/health").json()
    expected = _by_sentence(translator, SENTENCES[:4], beam=2)
    for body, r in zip(bodies, responses):
        assert _same(r.json()["translations"], [expected[line] for line in body["text"]])
    assert (stats["requests"], stats["batches"], stats["largest"]) == (4, 4, 1)


def test_a_poison_request_fails_alone_bisected_and_its_error_names_only_its_id(
    checkpoint, monkeypatch, caplog
):
    translator = served(checkpoint)
    poison_text = "Zebras quote Quixote."
    poison = set(translator.encode([poison_text])[0]) - {
        t
        for s in translator.encode([*SENTENCES, "x"])
        for t in s  # "x": the held request
    }
    real_encode = translator.model.encode

    def encode(src):
        if any(int(t) in poison for t in src.flatten()):
            raise RuntimeError("simulated decoder fault in /secret/path")
        return real_encode(src)

    monkeypatch.setattr(translator.model, "encode", encode)
    calls = []
    real_decode = translator.decode
    held = HeldFirstDecode(lambda jobs: calls.append(len(jobs)) or real_decode(jobs))
    monkeypatch.setattr(translator, "decode", held)
    bodies = [{"text": [s], "beam": 1} for s in SENTENCES[:8]]
    bodies[5] = {"text": [poison_text], "beam": 1}
    headers = [{}] * 8
    headers[5] = {"X-Request-ID": "poison-5"}
    with caplog.at_level("ERROR", logger="aiayn.serve.app"):
        with client(translator, max_wait_ms=0, max_batch_tokens=100_000) as c:
            responses = _batched_behind_a_held_decode(c, held, bodies, headers)
            after = c.post("/translate", json={"text": [SENTENCES[2]], "beam": 1})
            stats = c.get("/health").json()
    decode_calls = list(calls)
    assert responses[5].status_code == 500 and responses[5].headers["x-request-id"] == "poison-5"
    assert responses[5].json() == {
        "error": "decoding failed; the server's log has the details under request id poison-5"
    }
    [record] = [r for r in caplog.records if "poison-5" in r.getMessage()]
    assert "simulated decoder fault" in str(record.exc_info[1])  # the log has it, the answer not
    expected = _by_sentence(translator, SENTENCES[:8], beam=1)
    for i, (body, r) in enumerate(zip(bodies, responses)):
        if i != 5:
            assert r.status_code == 200
            assert _same(r.json()["translations"], [expected[body["text"][0]]])
    assert after.status_code == 200 and _same(
        after.json()["translations"], [expected[SENTENCES[2]]]
    )
    # the held first request, the batch of 8 (in arrival order, which the threads decide), two
    # halves per level down to the poison (2 log2 8), then the one after: not 8 calls more of
    # decoding each alone
    assert decode_calls[:2] == [1, 8] and sorted(decode_calls[2:-1]) == [1, 1, 2, 2, 4, 4]
    assert decode_calls[-1] == 1
    assert stats["failures"] == 1


def test_an_overloaded_server_answers_503_with_retry_after_undecoded():
    translator = SlowTranslator("slow")
    limits = Limits(max_wait_ms=0, max_batch_tokens=0, max_queue=1, deadline_s=0.8)
    results = {}
    with TestClient(create_app(translator, limits)) as c:
        batcher = c.app.state.batcher
        send = lambda text: results.update({text: c.post("/translate", json={"text": [text]})})  # noqa: E731
        decoding = threading.Thread(target=send, args=("slow",))
        decoding.start()
        assert translator.handle.started.wait(timeout=30)
        queued = threading.Thread(target=send, args=("queued",))
        start = time.monotonic()
        queued.start()
        _eventually(lambda: batcher.waiting == 1)
        full = c.post("/translate", json={"text": ["one too many"]})
        queued.join(timeout=30)  # answered at its deadline, while "slow" still decodes
        assert time.monotonic() - start >= 0.8 and decoding.is_alive()
        translator.handle.release.set()
        decoding.join(timeout=30)
        stats = c.get("/health").json()
    assert full.status_code == 503 and int(full.headers["retry-after"]) >= 1
    assert full.json() == {"error": "the server is overloaded: 1 requests are waiting already"}
    late = results["queued"]
    assert late.status_code == 503 and int(late.headers["retry-after"]) >= 1
    assert late.json() == {
        "error": "the server is overloaded: this request waited 0.8 s, its deadline, and was "
        "not decoded"
    }
    assert results["slow"].json() == {"translations": [{"text": "SLOW"}]}
    assert translator.handle.calls == [["slow"]]
    assert (stats["rejected"], stats["expired"], stats["requests"]) == (1, 1, 1)


@pytest.mark.parametrize(
    "given, kept",
    [("trace-42.a:b/c+d=", True), ("has space", False), ("x" * 129, False), ("", False)],
)
def test_every_answer_carries_a_request_id_the_clients_when_sane(given, kept):
    with TestClient(create_app(SlowTranslator("slow"), Limits(max_sentences=1))) as c:
        headers = {"X-Request-ID": given} if given else {}
        answers = [
            c.get("/health", headers=headers),
            c.get("/nowhere", headers=headers),
            c.post("/translate", json={"text": ["a", "b"]}, headers=headers),  # 413
            c.post("/translate", json={"text": []}, headers=headers),  # 422
            c.post("/translate", content=b"x" * 10**6, headers=headers),  # 413 unread
        ]
    assert [a.status_code for a in answers] == [200, 404, 413, 422, 413]
    ids = [a.headers["x-request-id"] for a in answers]
    if kept:
        assert ids == [given] * 5
    else:
        assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == 5


# --- the real server: CLI, SIGTERM, and the page in a browser ------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(checkpoint: Path, *args: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(aiayn.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiayn",
            "serve",
            "--checkpoint",
            str(checkpoint),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start within 60 s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_body_that_is_not_utf8_is_a_400_naming_the_byte(translator):
    with client(translator) as c:
        r = c.post(
            "/translate",
            content=b'{"text": ["a\xff"]}',
            headers={"Content-Type": "application/json"},
        )
        utf16 = c.post(
            "/translate",
            content='{"text": ["a"]}'.encode("utf-16-le"),
            headers={"Content-Type": "application/json"},
        )
    assert (r.status_code, r.json()) == (
        400,
        {"error": "the body is not UTF-8 text: byte 12 (0xff) invalid start byte"},
    )
    assert utf16.status_code == 200  # JSON's other encodings still parse


def test_fastapis_pages_that_load_a_cdn_are_off(translator):
    with client(translator) as c:
        assert [c.get(path).status_code for path in ("/docs", "/redoc")] == [404, 404]
        assert c.get("/openapi.json").status_code == 200  # the schema itself loads nothing


def test_an_api_key_guards_every_route_but_health_and_the_page(translator):
    body = {"text": [SENTENCES[0]], "beam": 1}
    with TestClient(create_app(translator, api_key="s3cret")) as c:
        assert c.get("/health").status_code == 200
        page = c.get("/")
        assert page.status_code == 200 and 'id="key"' in page.text
        refused = [
            c.get("/info"),
            c.post("/translate", json=body),
            c.post("/translate", json=body, headers={"Authorization": "Bearer wrong"}),
            c.post("/translate", json=body, headers={"Authorization": "Basic s3cret"}),
            c.post("/translate", json=body, headers={"X-API-Key": "s3cre"}),
            c.get("/nowhere"),
        ]
        assert [r.status_code for r in refused] == [401] * len(refused)
        assert refused[0].json() == {
            "error": "this server needs its API key: send Authorization: Bearer KEY"
        }
        assert refused[0].headers["www-authenticate"] == "Bearer"
        bearer = c.post("/translate", json=body, headers={"Authorization": "Bearer s3cret"})
        header = c.post("/translate", json=body, headers={"X-API-Key": "s3cret"})
        info = c.get("/info", headers={"Authorization": "bearer s3cret"})
    assert [bearer.status_code, header.status_code, info.status_code] == [200, 200, 200]
    assert bearer.json() == header.json()


@pytest.mark.parametrize("key", ["ключ", "tab\there", "é"])
def test_an_api_key_no_header_can_carry_is_refused_at_start(translator, key):
    with pytest.raises(UserError, match="the API key must be printable ASCII"):
        create_app(translator, api_key=key)


def test_the_cli_takes_the_key_from_the_environment_and_warns_without_one_beyond_loopback(
    checkpoint, capsys, monkeypatch
):
    got = {}
    monkeypatch.setattr("aiayn.serve.run_server", lambda checkpoint, **kw: got.update(kw))
    monkeypatch.delenv("AIAYN_API_KEY", raising=False)
    main(["serve", "--checkpoint", str(checkpoint), "--port", "0", "--host", "0.0.0.0"])
    assert got["api_key"] is None
    assert capsys.readouterr().err == (
        "aiayn serve: warning: listening on 0.0.0.0 without an API key: anyone who can reach "
        "port 0 can use it; set AIAYN_API_KEY (or --api-key)\n"
    )
    main(["serve", "--checkpoint", str(checkpoint), "--port", "0"])  # loopback: no warning
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("AIAYN_API_KEY", "from-env")
    main(["serve", "--checkpoint", str(checkpoint), "--port", "0", "--host", "0.0.0.0"])
    assert got["api_key"] == "from-env" and "from-env" not in "".join(capsys.readouterr())
    argv = ["serve", "--checkpoint", str(checkpoint), "--port", "0", "--api-key", "opt"]
    main(argv)
    assert got["api_key"] == "opt"


# --- uvicorn as `aiayn serve` configures it, in a thread: bodies, timeouts, hang-ups, shutdown ---


class SlowTranslator:
    """``Translator`` for the app without a model: a sentence's ids are its characters, and
    one-sentence jobs are decoded by a ``SlowHandle`` (which answers in capitals)."""

    max_source_tokens = 10_000

    def __init__(self, slow: str):
        self.handle = SlowHandle(slow)

    def encode(self, lines, target_lang=None):
        return [[ord(c) for c in line] for line in lines]

    def constraints(self, sources, config, prefixes, phrases):
        return None

    def glossary_of(self, given):
        return None

    def with_glossary(self, job, texts, glossary):
        return job

    def check_supported(self, job, **asked):
        return None  # it decodes whatever it is given

    def decode(self, jobs):
        return [[{"text": t}] for t in self.handle(["".join(map(chr, j.sources[0])) for j in jobs])]

    def info(self):
        return {}


@contextmanager
def serving(app, **server_args):
    """``app`` behind the uvicorn server that ``aiayn serve`` runs; yields (server, host, port).

    Leaving sets ``should_exit``, which is what SIGTERM does to uvicorn's server."""
    port = _free_port()
    server = make_server(app, host="127.0.0.1", port=port, log_level="warning", **server_args)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield server, "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive()


def _post_in_thread(port: int, text: str, results: dict) -> threading.Thread:
    def send():
        results[text] = httpx.post(
            f"http://127.0.0.1:{port}/translate", json={"text": [text]}, timeout=30
        )

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _read_response(sock: socket.socket) -> bytes:
    """One response of a keep-alive connection: its headers, then Content-Length bytes."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    _, headers, body = _parse(data)
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return data.partition(b"\r\n\r\n")[0] + b"\r\n\r\n" + body


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


HEADERS = b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"


def test_a_body_past_what_is_drained_is_refused_before_it_is_read():
    assert 50_000_000 > DRAIN_BYTES
    limit = Limits().max_body_bytes
    with serving(create_app(SlowTranslator("slow"))) as (_, host, port):
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(HEADERS + b"Content-Length: 50000000\r\n\r\n" + b'{"text": ["')
            status, headers, body = _parse(_read_until_closed(s))  # answered, not waiting
        assert (status, headers["connection"]) == (413, "close")
        assert json.loads(body) == {
            "error": f"the body is 50000000 bytes; the limit is {limit} bytes per request"
        }


def _post_urllib(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post_http_client(url: str, body: bytes) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("POST", parts.path, body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def _post_httpx(url: str, body: bytes) -> tuple[int, bytes]:
    answer = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    return answer.status_code, answer.content


def _post_curl(url: str, body: bytes) -> tuple[int, bytes]:
    done = subprocess.run(
        [
            "curl",
            "-sS",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
            "-w",
            "\\n%{http_code}",
            url,
        ],
        input=body,
        capture_output=True,
        timeout=60,
        check=True,
    )
    answer, _, status = done.stdout.rpartition(b"\n")
    return int(status), answer


CLIENTS = {"urllib": _post_urllib, "http.client": _post_http_client, "httpx": _post_httpx}
if shutil.which("curl"):
    CLIENTS["curl"] = _post_curl

# `aiayn serve`'s app and server around a translator that upper-cases, in a process of its own
UPPER_SERVER = """
import sys
from aiayn.serve.app import create_app
from aiayn.serve.server import make_server

class Upper:
    max_source_tokens = 10_000
    def encode(self, lines, target_lang=None): return [[ord(c) for c in line] for line in lines]
    def constraints(self, *args): return None
    def glossary_of(self, given): return None
    def with_glossary(self, job, texts, glossary): return job
    def check_supported(self, job, **asked): return None
    def decode(self, jobs): return [[{"text": "".join(map(chr, j.sources[0])).upper()}] for j in jobs]
    def info(self): return {}

make_server(create_app(Upper()), port=int(sys.argv[1]), log_level="warning").run()
"""


@pytest.mark.parametrize("size", [10**6, 5 * 10**6])
@pytest.mark.slow
def test_every_client_still_sending_an_oversize_body_reads_its_413(size, tmp_path):
    limit = Limits().max_body_bytes
    body = b'{"text": ["' + b"x" * size + b'"]}'
    expected = {"error": f"the body is {len(body)} bytes; the limit is {limit} bytes per request"}
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(aiayn.__file__).parents[1])}
    (script := tmp_path / "upper_server.py").write_text(UPPER_SERVER)
    proc = subprocess.Popen([sys.executable, str(script), str(port)], env=env)
    url = f"http://127.0.0.1:{port}/translate"
    try:
        _eventually(lambda: _answers(f"http://127.0.0.1:{port}/health"))
        for name, post in CLIENTS.items():
            for _ in range(5):  # a reset loses the answer most times, not every time
                status, answer = post(url, body)
                assert (status, json.loads(answer)) == (413, expected), name
        for name, post in CLIENTS.items():  # and the server is well after
            status, answer = post(url, json.dumps({"text": ["ok"]}).encode())
            assert (status, json.loads(answer)) == (200, {"translations": [{"text": "OK"}]}), name
    finally:
        _stop(proc)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_an_oversize_body_is_read_to_its_end_before_the_413_so_the_client_gets_it():
    limit = Limits().max_body_bytes
    body = b"x" * (4 * limit)
    with serving(create_app(SlowTranslator("slow"))) as (_, host, port):
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(HEADERS + b"Content-Length: %d\r\n\r\n" % len(body) + body[: 2 * limit])
            s.settimeout(1)
            with pytest.raises(TimeoutError):  # answered only once the client is done sending
                s.recv(1)
            s.settimeout(5)
            s.sendall(body[2 * limit :])
            status, headers, answer = _parse(_read_response(s))
            assert (status, "connection" in headers) == (413, False)  # the connection lives on
            ok = b'{"text": ["ok"]}'
            s.sendall(HEADERS + b"Content-Length: %d\r\n\r\n%s" % (len(ok), ok))
            status, _, answer = _parse(_read_response(s))
        assert json.loads(answer) == {"translations": [{"text": "OK"}]}
        chunk = b"x" * 16384
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(HEADERS + b"Transfer-Encoding: chunked\r\n\r\n")
            for _ in range(2 * limit // len(chunk)):  # past the limit, then the end
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            s.sendall(b"0\r\n\r\n")
            status, headers, _ = _parse(_read_response(s))
        assert (status, "connection" in headers) == (413, False)


def test_half_sent_headers_are_cut_off_and_a_long_decode_is_not():
    translator = SlowTranslator("slow")
    with serving(create_app(translator), header_timeout_s=0.5) as (_, host, port):
        # cut off by the server: the socket's own 60 s timeout would raise first otherwise
        with socket.create_connection((host, port), timeout=60) as s:
            start = time.monotonic()
            s.sendall(HEADERS)  # and never the blank line that ends them
            assert _read_until_closed(s) == b""
            assert time.monotonic() - start > 0.4  # not before the header timeout
        with socket.create_connection((host, port), timeout=5) as s:  # a keep-alive connection
            s.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
            assert _parse(_read_response(s))[0] == 200
            s.sendall(b"GET /health HTTP/1.1\r\n")
            assert _read_until_closed(s) == b""
        results = {}
        sender = _post_in_thread(port, "slow", results)
        assert translator.handle.started.wait(timeout=10)
        time.sleep(1.0)  # decoding for twice the header timeout
        translator.handle.release.set()
        sender.join(timeout=10)
    assert results["slow"].json() == {"translations": [{"text": "SLOW"}]}


def test_a_client_that_hangs_up_is_not_decoded():
    translator = SlowTranslator("slow")
    app = create_app(translator, Limits(max_wait_ms=0))
    with serving(app) as (_, host, port):
        batcher = app.state.batcher
        results = {}
        first = _post_in_thread(port, "slow", results)
        assert translator.handle.started.wait(timeout=10)
        body = b'{"text": ["gone"]}'
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(HEADERS + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            _eventually(lambda: batcher.waiting == 1)  # queued behind "slow"; then it hangs up
        _eventually(lambda: batcher.stats.cancelled == 1)  # the app noticed: out of the queue
        assert batcher.waiting == 0
        after = _post_in_thread(port, "next", results)
        _eventually(lambda: batcher.waiting == 1)
        translator.handle.release.set()
        first.join(timeout=10)
        after.join(timeout=10)
        stats = httpx.get(f"http://127.0.0.1:{port}/health").json()
    assert results["next"].json() == {"translations": [{"text": "NEXT"}]}
    assert translator.handle.calls == [["slow"], ["next"]]
    assert stats["cancelled"] == 1


def test_shutdown_answers_503_for_what_it_will_not_decode_and_finishes_the_rest():
    translator = SlowTranslator("slow")
    app = create_app(translator, Limits(max_batch_tokens=0, max_wait_ms=0))
    results = {}
    with serving(app, shutdown_timeout_s=1.5) as (server, _, port):
        decoding = _post_in_thread(port, "slow", results)
        assert translator.handle.started.wait(timeout=10)
        queued = [_post_in_thread(port, text, results) for text in ("queued", "also queued")]
        _eventually(lambda: app.state.batcher.waiting == 2)
        start = time.monotonic()
        server.should_exit = True  # what SIGTERM does
        for sender in queued:
            sender.join(timeout=30)
        refused_after = time.monotonic() - start
        assert decoding.is_alive()  # refused while "slow" is still decoding
        translator.handle.release.set()  # past the shutdown timeout: the batch in flight finishes
        decoding.join(timeout=10)
    assert refused_after > 1.3  # at the shutdown timeout, not before
    for text in ("queued", "also queued"):
        assert results[text].status_code == 503
        assert results[text].json() == {
            "error": "the server is shutting down; this request was not decoded"
        }
    assert results["slow"].status_code == 200
    assert results["slow"].json() == {"translations": [{"text": "SLOW"}]}
    assert translator.handle.calls == [["slow"]]


def test_cli_rejects_a_missing_checkpoint_and_bad_limits_in_one_line(tmp_path, checkpoint, capsys):
    for args, message in [
        (
            ["--checkpoint", str(tmp_path / "none")],
            f"{tmp_path / 'none'} is not a checkpoint: meta.json is missing",
        ),
        (
            ["--checkpoint", str(checkpoint), "--max-wait-ms", "-1"],
            "max_wait_ms must be >= 0, got -1.0",
        ),
        (["--checkpoint", str(checkpoint), "--max-queue", "0"], "max_queue must be >= 1, got 0"),
        (
            ["--checkpoint", str(checkpoint), "--deadline-s", "inf"],
            "deadline_s must be > 0 and finite, got inf",
        ),
    ]:
        with pytest.raises(SystemExit) as exit:
            main(["serve", "--port", "0", *args])  # 0: any free port, so 8000 in use is no matter
        assert (
            exit.value.code == 2 and capsys.readouterr().err == f"aiayn serve: error: {message}\n"
        )


def test_a_port_or_address_the_server_cannot_listen_on_is_one_line_before_the_model_loads(
    checkpoint, capsys, monkeypatch
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the address was checked")

    monkeypatch.setattr(Library, "_load", no_model)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        in_use = taken.getsockname()[1]
        for args, message in [
            (["--port", "70000"], "--port 70000: a port is a number from 0 to 65535"),
            (["--port", "-1"], "--port -1: a port is a number from 0 to 65535"),
            (
                ["--port", str(in_use)],
                f"--host 127.0.0.1 --port {in_use}: cannot listen there (Address already in use)",
            ),
            (
                ["--host", "192.0.2.1"],  # TEST-NET-1: no machine's own address
                "--host 192.0.2.1 --port 8000: cannot listen there (Cannot assign requested address)",
            ),
        ]:
            with pytest.raises(SystemExit) as exit:
                main(["serve", "--checkpoint", str(checkpoint), *args])
            assert (exit.value.code, capsys.readouterr().err) == (
                2,
                f"aiayn serve: error: {message}\n",
            )


def test_cli_passes_the_queue_bound_and_the_deadline_to_the_server(checkpoint, monkeypatch):
    got = {}
    monkeypatch.setattr("aiayn.serve.run_server", lambda checkpoint, **kw: got.update(kw))
    main(
        [
            "serve",
            "--checkpoint",
            str(checkpoint),
            "--port",
            "0",
            "--max-queue",
            "7",
            "--deadline-s",
            "2.5",
        ]
    )
    assert (got["limits"].max_queue, got["limits"].deadline_s) == (7, 2.5)
    main(["serve", "--checkpoint", str(checkpoint), "--port", "0"])
    assert (got["limits"].max_queue, got["limits"].deadline_s) == (
        Limits.max_queue,
        Limits.deadline_s,
    )  # the CLI's defaults are the library's


@pytest.mark.slow
def test_sigterm_finishes_the_request_in_flight(checkpoint, translator):
    proc, url = _start_server(
        checkpoint, "--max-wait-ms", "1500", "--precision", "fp32"
    )  # the request waits 1.5 s in the batcher; fp32 as the library's translator (auto may be bf16)
    try:
        result = {}
        sender = threading.Thread(
            target=lambda: result.update(
                r=httpx.post(url + "/translate", json={"text": [SENTENCES[4]]}, timeout=60)
            )
        )
        sender.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        sender.join(timeout=60)
        assert result["r"].status_code == 200
        assert _same(result["r"].json()["translations"], _alone(translator, [SENTENCES[4]]))
        assert proc.wait(timeout=30) in (
            0,
            -signal.SIGTERM,
        )  # uvicorn re-raises the signal once done
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
        log = proc.stdout.read()
        assert "Finished server process" in log and "Traceback" not in log
    finally:
        _stop(proc)


def _browser():
    chromium, driver = (
        shutil.which("chromium") or shutil.which("chromium-browser"),
        shutil.which("chromedriver"),
    )
    if not (chromium and driver):
        pytest.skip(
            "no chromium + chromedriver on PATH (Debian: apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1100,1300",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=driver)
    )


HEATMAP_PIXELS = """
const c = document.getElementById('heatmap'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
const colours = new Set();
for (let i = 0; i < d.length; i += 4 * 7) colours.add(d[i] << 16 | d[i + 1] << 8 | d[i + 2]);
return [colours.size, c.toDataURL()];
"""


@pytest.mark.slow
def test_the_page_translates_and_draws_the_attention(checkpoint, translator, tmp_path):
    browser = _browser()
    proc, url = _start_server(checkpoint)
    try:
        browser.get(url + "/")
        WebDriverWait(browser, 30).until(
            lambda b: "parameters" in b.find_element(By.ID, "model").text
        )
        box = browser.find_element(By.ID, "source")
        box.clear()
        box.send_keys(SENTENCES[7])
        browser.find_element(By.ID, "beam").clear()
        browser.find_element(By.ID, "beam").send_keys("2")
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 60).until(
            lambda b: b.find_elements(By.CSS_SELECTOR, "#output .result .text")
        )
        shown = browser.find_element(By.CSS_SELECTOR, "#output .result .text").text
        expected = _alone(translator, [SENTENCES[7]], beam=2)[0]["text"]
        assert shown == expected.strip() and shown
        heatmap = browser.find_element(By.ID, "heatmap")
        source = translator.encode([SENTENCES[7]])[0]
        assert int(heatmap.get_attribute("data-cols")) == len(source)
        assert int(heatmap.get_attribute("data-rows")) >= 2
        colours, before = browser.execute_script(HEATMAP_PIXELS)
        assert colours > 20  # a painted heatmap, not a blank canvas
        heads = Select(browser.find_element(By.ID, "head"))
        assert [o.text for o in heads.options] == ["mean of heads"] + [
            str(i + 1) for i in range(translator.model.cfg.h)
        ]
        assert (
            len(Select(browser.find_element(By.ID, "layer")).options) == translator.model.cfg.N_dec
        )
        heads.select_by_visible_text("2")
        assert browser.execute_script(HEATMAP_PIXELS)[1] != before  # another head, another picture
        assert "head 2" in browser.find_element(By.ID, "caption").text
        browser.save_screenshot(str(tmp_path / "serve_page.png"))
        assert (tmp_path / "serve_page.png").stat().st_size > 10_000
        if os.environ.get("AIAYN_SCREENSHOT"):  # to look at it: AIAYN_SCREENSHOT=/tmp/page.png
            shutil.copy(tmp_path / "serve_page.png", os.environ["AIAYN_SCREENSHOT"])
    finally:
        browser.quit()
        _stop(proc)


def test_the_ctranslate2_engine_serves_our_answers_batched_with_our_attention(
    tiny_corpus, tmp_path
):
    """``aiayn serve --engine ctranslate2``: the same texts and scores as our search, batched
    by the same batcher; attention and alignments come from our model on its outputs."""
    pytest.importorskip("ctranslate2", reason="the engine needs ctranslate2")
    from _export_models import trained_like_model

    from aiayn.config import to_dict

    vocab = Vocab.load(tiny_corpus / "spm.model")
    model = trained_like_model(len(vocab), max_len=40)
    ckpt = save_checkpoint(
        tmp_path, 1, model, {"model_config": to_dict(model.cfg)}, None, vocab.path
    )
    ours = served(ckpt)
    theirs = served(ckpt, engine="ctranslate2")
    bodies = [{"text": [SENTENCES[i], SENTENCES[i + 4]], "beam": 2, "nbest": 2} for i in range(4)]
    held = HeldFirstDecode(theirs.decode)
    theirs.decode = held
    with client(theirs, max_wait_ms=0, max_batch_tokens=100_000) as c:
        responses = _batched_behind_a_held_decode(c, held, bodies)
        stats = c.get("/health").json()
        attention = c.post("/translate", json={"text": [SENTENCES[3]], "attention": True})
        refused = c.post("/translate", json={"text": [SENTENCES[0]], "constraints": [["Dios"]]})
        seeded = c.post("/translate", json={"text": [SENTENCES[0]], "sample": True, "seed": 1})
        ruled = c.post("/translate", json={"text": [SENTENCES[0]], "search_rules": "fairseq"})
        both = c.post(
            "/translate",
            json={"text": [SENTENCES[0]], "constraints": [["Dios"]], "search_rules": "hf"},
        )
        sampled = c.post("/translate", json={"text": [SENTENCES[0]], "sample": True, "nbest": 2})
        info = c.get("/info").json()
    expected = _by_sentence(ours, SENTENCES, beam=2, nbest=2)
    for body, r in zip(bodies, responses):
        got = r.json()["translations"]
        assert _same(got, [expected[line] for line in body["text"]])
        assert [[h["text"] for h in a["nbest"]] for a in got] == [
            [h["text"] for h in expected[line]["nbest"]] for line in body["text"]
        ]
    assert (stats["requests"], stats["batches"], stats["largest"]) == (5, 2, 4)  # together
    with client(ours) as c:
        our_attention = c.post("/translate", json={"text": [SENTENCES[3]], "attention": True})
    assert (
        attention.json()["translations"][0]["attention"]
        == (our_attention.json()["translations"][0]["attention"])
    )
    assert refused.status_code == 422
    assert refused.json()["error"] == (
        "constraints[0]: the ctranslate2 engine cannot do: constraints (CTranslate2 has target "
        "prefixes but no lexical constraints); the server's own search (without --engine) does "
        "every one"
    )
    assert seeded.status_code == 422 and "cannot do: seed (CTranslate2 seeds its" in seeded.text
    assert ruled.status_code == 422 and "engine cannot do: search_rules" in ruled.text
    assert both.status_code == 422  # one refusal names all that the engine lacks
    assert "cannot do: constraints (" in both.json()["error"]
    assert "); search_rules (" in both.json()["error"]
    assert sampled.status_code == 200 and len(sampled.json()["translations"][0]["nbest"]) == 2
    assert info["engine"] == "ctranslate2"


def test_repetition_penalty_has_the_librarys_one_rule(translator):
    """The server, the command line and ``aiayn.Translator`` refuse the same penalties, with
    the library's words (``DecodeConfig``), where the server once had a bound of its own."""
    from aiayn.decode.config import MAX_REPETITION_PENALTY

    with client(translator) as c:
        over = c.post("/translate", json={"text": ["a"], "repetition_penalty": 1e30})
        at = c.post("/translate", json={"text": ["a"], "repetition_penalty": 10.0})
    assert over.status_code == 422 and at.status_code == 200
    assert over.json()["error"] == (
        f"repetition_penalty must be a finite number > 0 and at most {MAX_REPETITION_PENALTY:g}, "
        "got 1e+30"
    )
