"""``"stream": true`` in ``POST /translate``: NDJSON lines (or server-sent events) that join
into the whole answer byte for byte, in order, the first sent before the last part is decoded;
a client that hangs up stops the decoding; deadlines and failures as a whole answer's status
before the first line, as the last line after it. Held on events, never timed."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import aiayn  # noqa: E402
from aiayn.checkpoint import save_checkpoint  # noqa: E402
from aiayn.data import Vocab  # noqa: E402
from aiayn.serve import Adapter, Limits, create_app, make_server  # noqa: E402
from aiayn.translator import Translator  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VERSES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good.",
    "And God called the dry land Earth.",
    "And the earth brought forth grass.",
    "And God made two great lights.",
]


@pytest.fixture(scope="module")
def adapter(tiny_corpus, tmp_path_factory) -> Adapter:
    """A seeded random tiny model with the corpus fixture's vocabulary, as ``aiayn serve``
    opens it."""
    vocab = Vocab.load(tiny_corpus / "spm.model")
    torch.manual_seed(0)
    model = aiayn.Transformer(aiayn.ModelConfig.preset("tiny", vocab_size=len(vocab), max_len=40))
    meta = {"update": 1, "model_config": dataclasses.asdict(model.eval().cfg)}
    ckpt = save_checkpoint(tmp_path_factory.mktemp("ss") / "c", 1, model, meta, None, vocab.path)
    return Adapter(Translator(ckpt, workers=1, precision="fp32"))


def _lines(response: httpx.Response) -> list[dict]:
    assert response.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in response.text.splitlines()]


def test_a_streamed_document_joins_into_the_whole_answer_byte_for_byte(adapter):
    text = [f"  {VERSES[0]}  {VERSES[1]} ", "", " ".join(VERSES[2:]), "   "]
    body = {"text": text, "split": True, "beam": 2}
    with TestClient(create_app(adapter)) as c:
        whole = c.post("/translate", json=body).json()["translations"]
        lines = _lines(c.post("/translate", json={**body, "stream": True}))
    assert lines[-1] == {"done": True}
    pieces = lines[:-1]
    assert [(p["index"], p["sentence"]) for p in pieces] == [
        (0, 0),
        (0, 1),
        (1, None),
        *[(2, j) for j in range(len(whole[2]["sentences"]))],
        (3, None),
    ]
    for i, answer in enumerate(whole):
        mine = [p for p in pieces if p["index"] == i]
        joined = "".join(p["delta"] for p in mine)
        assert joined.encode() == answer["text"].encode()
        sentences = [
            {k: v for k, v in p.items() if k not in ("index", "sentence", "delta")}
            for p in mine
            if p["sentence"] is not None
        ]
        assert [s["text"] for s in sentences] == [s["text"] for s in answer["sentences"]]
        for got, expected in zip(sentences, answer["sentences"]):  # other batches: last bits
            assert got["score"] == pytest.approx(expected["score"])


def test_streamed_items_are_the_whole_answers_in_order(adapter):
    body = {"text": [*VERSES, "", VERSES[0]], "beam": 2, "nbest": 2}
    with TestClient(create_app(adapter)) as c:
        whole = c.post("/translate", json=body).json()["translations"]
        lines = _lines(c.post("/translate", json={**body, "stream": True}))
        events = c.post(
            "/translate",
            json={**body, "stream": True},
            headers={"Accept": "text/event-stream"},
        )
    assert [line.get("index") for line in lines] == [*range(len(whole)), None]
    assert [[n["text"] for n in line["nbest"]] for line in lines[:-1]] == [
        [n["text"] for n in a["nbest"]] for a in whole
    ]
    assert events.headers["content-type"].startswith("text/event-stream")
    frames = events.text.split("\n\n")
    assert frames[-1] == "" and all(f.startswith("data: ") for f in frames[:-1])
    assert [json.loads(f.removeprefix("data: "))["index"] for f in frames[:-2]] == [
        line["index"] for line in lines[:-1]
    ]


def test_samples_are_seeded_by_their_place_in_the_request_not_in_the_part(adapter):
    body = {"text": VERSES, "sample": True, "seed": 5, "nbest": 2}
    with TestClient(create_app(adapter)) as c:
        whole = c.post("/translate", json=body).json()["translations"]
        lines = _lines(c.post("/translate", json={**body, "stream": True}))
    assert [[n["text"] for n in line["nbest"]] for line in lines[:-1]] == [
        [n["text"] for n in a["nbest"]] for a in whole
    ]


# --- the parts against the batcher: a translator without a model, held on events ---------------


class Parts:
    """The app's translator without a model: a sentence's ids are its characters, answered in
    capitals; every decode call is recorded, and the call whose first sentence is in ``hold``
    waits for that event (``started`` says it began); a sentence "poison" fails its call."""

    max_source_tokens = 10_000

    def __init__(self, *held: str):
        self.calls: list[list[str]] = []
        self.hold = {text: threading.Event() for text in held}
        self.started = {text: threading.Event() for text in held}

    def encode(self, lines, target_lang=None):
        return [[ord(c) for c in line] for line in lines]

    def glossary_of(self, given):
        return None

    def with_glossary(self, job, text, glossary):
        return job

    def constraints(self, sources, config, prefixes, phrases):
        return None

    def check_supported(self, job, seed=False, glossary=False):
        return None

    def decode(self, jobs):
        texts = [["".join(map(chr, s)) for s in job.sources] for job in jobs]
        self.calls.append([t for job in texts for t in job])
        if (first := texts[0][0]) in self.hold:
            self.started[first].set()
            assert self.hold[first].wait(timeout=30)
        if any("poison" in t for job in texts for t in job):
            raise RuntimeError("simulated decoder fault")
        return [[{"text": t.upper()} for t in job] for job in texts]

    def info(self):
        return {}


def _eventually(condition, timeout=30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@contextmanager
def serving(app):
    """``app`` behind the uvicorn server ``aiayn serve`` runs; yields its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server(app, host="127.0.0.1", port=port, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _eventually(lambda: server.started)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)


TEXT = [f"s{i}" for i in range(10)]  # parts of 1, 2, 4 and 3 sentences


def test_the_first_line_is_sent_before_the_last_part_is_decoded():
    translator = Parts("s3")  # the third part, sentences 3-6, held
    with serving(create_app(translator, Limits(max_wait_ms=0))) as port:
        body = {"text": TEXT, "stream": True}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/translate", json=body) as r:
            lines = r.iter_lines()
            first = json.loads(next(lines))
            assert first == {"index": 0, "text": "S0"}
            assert translator.started["s3"].wait(timeout=30)
            assert translator.calls == [["s0"], ["s1", "s2"], ["s3", "s4", "s5", "s6"]]
            translator.hold["s3"].set()
            rest = [json.loads(line) for line in lines]
    assert [line.get("index") for line in rest] == [*range(1, 10), None]
    assert translator.calls[-1] == ["s7", "s8", "s9"]


def test_a_client_that_hangs_up_mid_stream_stops_the_decoding():
    translator = Parts("s1", "slow")
    app = create_app(translator, Limits(max_wait_ms=0, max_batch_tokens=0))
    results: dict = {}
    with serving(app) as port:
        batcher, url = app.state.batcher, f"http://127.0.0.1:{port}/translate"
        body = json.dumps({"text": TEXT, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(
                b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert translator.started["s1"].wait(timeout=30)  # the second part decoding
            slow = threading.Thread(
                target=lambda: results.update(slow=httpx.post(url, json={"text": ["slow"]}))
            )
            slow.start()
            _eventually(lambda: batcher.waiting == 1)
            translator.hold["s1"].set()  # "slow" decodes next, and the third part queues
            received = b""
            while b'"S2"' not in received:
                received += s.recv(65536)
            _eventually(lambda: batcher.waiting == 1)
        _eventually(lambda: batcher.stats.cancelled == 1)  # hung up: out of the queue
        translator.hold["slow"].set()
        slow.join(timeout=30)
        after = httpx.post(url, json={"text": ["next"]})
    assert after.json() == {"translations": [{"text": "NEXT"}]}
    assert translator.calls == [["s0"], ["s1", "s2"], ["slow"], ["next"]]


def _in_thread(c: TestClient, body: dict, results: dict, name: str) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: results.update({name: c.post("/translate", json=body)})
    )
    thread.start()
    return thread


def test_a_first_part_past_its_deadline_is_a_whole_answers_503():
    translator = Parts("slow")
    limits = Limits(max_wait_ms=0, max_batch_tokens=0, deadline_s=0.5)
    results: dict = {}
    with TestClient(create_app(translator, limits)) as c:
        slow = _in_thread(c, {"text": ["slow"]}, results, "slow")
        assert translator.started["slow"].wait(timeout=30)
        late = c.post("/translate", json={"text": TEXT, "stream": True})
        translator.hold["slow"].set()
        slow.join(timeout=30)
    assert late.status_code == 503 and int(late.headers["retry-after"]) >= 1
    assert "waited 0.5 s, its deadline" in late.json()["error"]
    assert translator.calls == [["slow"]]


def test_a_later_part_past_its_deadline_ends_the_stream_with_an_error_line():
    translator = Parts("s0", "slow")
    limits = Limits(max_wait_ms=0, max_batch_tokens=0, deadline_s=0.5)
    results: dict = {}
    with TestClient(create_app(translator, limits)) as c:
        stream = _in_thread(c, {"text": TEXT, "stream": True}, results, "stream")
        assert translator.started["s0"].wait(timeout=30)  # the first part decoding
        slow = _in_thread(c, {"text": ["slow"]}, results, "slow")
        _eventually(lambda: c.app.state.batcher.waiting == 1)  # queued behind it
        translator.hold["s0"].set()  # then "slow" decodes, and the second part waits
        stream.join(timeout=30)  # answered at its deadline, while "slow" still decodes
        translator.hold["slow"].set()
        slow.join(timeout=30)
    lines = _lines(results["stream"])
    assert results["stream"].status_code == 200 and lines[0] == {"index": 0, "text": "S0"}
    assert lines[1]["status"] == 503 and "its deadline" in lines[1]["error"]
    assert len(lines) == 2 and translator.calls == [["s0"], ["slow"]]


def test_a_part_that_fails_ends_the_stream_with_an_error_line_naming_the_request():
    translator = Parts()
    text = ["ok", "fine", "poison", "never"]
    with TestClient(create_app(translator, Limits(max_wait_ms=0))) as c:
        r = c.post(
            "/translate", json={"text": text, "stream": True}, headers={"X-Request-ID": "p-1"}
        )
    lines = _lines(r)
    assert r.status_code == 200 and [line.get("text") for line in lines[:1]] == ["OK"]
    assert lines[-1] == {
        "error": "decoding failed; the server's log has the details under request id p-1",
        "status": 500,
    }
    assert ["never"] not in translator.calls and len(lines) == 2
