"""The HTTP side: routes, request validation, limits and error messages (FastAPI + uvicorn).

    POST /translate  {"text": [...], "beam": 4, "alpha": 0.6, "nbest": 1, "attention": false,
                      "search_rules": "paper", "no_repeat_ngram_size": 0,
                      "repetition_penalty": 1.0, "split": false, "markup": null,
                      "placeholders": false, "prefix": [...], "constraints": [[...], ...],
                      "glossary": [[source, target], ...], "target_lang": "fr",
                      "alignments": false,
                      "alignment_layer": -1, "sample": false, "top_k": 0, "top_p": 1.0,
                      "temperature": 1.0, "seed": 0, "stream": false}
    GET  /health     {"status": "ok", "batches": ..., ...}
    GET  /info       model config, vocabulary, checkpoint, parameters, limits
    GET  /           the page: translate, then explore the attention (Figures 3-5)

Every error is JSON ``{"error": "one line"}``: 400 malformed JSON; 415 a body not sent as
JSON; 422 wrong type, unknown field, bad value, text that is not Unicode; 413 over a limit (a
body over ``Limits.max_body_bytes`` is refused unparsed, its rest read and dropped so that the
client, still sending, receives the 413: ``BodyLimit``); 500 when decoding that
request failed (the others in its batch are answered; the message names the request id under
which the log holds the traceback, never the exception's text); 503 while shutting down, and
503 with ``Retry-After`` when the server sheds load (``Limits.max_queue`` requests already
waiting, or the request's decode not started ``Limits.deadline_s`` after it came). Every
answer carries ``X-Request-ID`` (the client's own, when it sent a sane one). Decoding runs on
the batcher's worker thread, never on the event loop; a request whose client hangs up while
it waits is dropped undecoded.

``"stream": true`` answers as NDJSON (server-sent events when the client accepts only
``text/event-stream``): a line per item (per sentence with ``split``) as soon as it and all
before it are done, then ``{"done": true}``. The request is decoded in parts of 1, 2, 4, ...
sentences (``decode.translate.stream_windows``), each through the batcher as a request of its
own, so its limits and deadline hold for every part: what fails before the first line is the
status a whole answer gets; later, the last line is ``{"error": ..., "status": ...}``. A client
that hangs up stops the stream: the parts not yet decoding are never decoded.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import Annotated, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..decode import DECODE_PRESETS, DecodeConfig, SampleConfig
from ..decode import options as checks
from ..decode.capabilities import SERVER
from ..decode.rules import PAPER_RULES, SEARCH_RULES, search_rules
from ..decode.translate import stream_windows
from ..errors import UserError
from .adapter import Adapter, TranslateJob
from .batcher import Batcher, Overloaded, ShuttingDown
from .text import TextRequest, text_request

DEFAULT = DECODE_PRESETS["translation"]  # section 6.1: beam 4, alpha 0.6
MAX_BEAM = 32  # also the most samples per sentence
SAMPLING = ("top_k", "top_p", "temperature", "seed")  # the fields that need "sample": true
REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")  # a client's own X-Request-ID: no spaces
T = TypeVar("T")
DRAIN_BYTES = 16 * 2**20  # of an oversize body, read and dropped so that its 413 is received

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how the batcher groups requests."""

    max_chars: int = 10_000  # characters of text per request
    max_sentences: int = 64  # sentences per request
    max_batch_tokens: int = 4000  # source tokens of the requests decoded together; 0: no batching
    max_wait_ms: float = 5.0  # how long the first waiting request waits for company
    max_queue: int = 256  # requests waiting for a decode; more are refused (503) at once
    deadline_s: float = 30.0  # a request whose decode has not started by then gets a 503

    def __post_init__(self) -> None:
        for name, least in (
            ("max_chars", 1),
            ("max_sentences", 1),
            ("max_batch_tokens", 0),
            ("max_wait_ms", 0),
            ("max_queue", 1),
        ):
            if getattr(self, name) < least:
                raise UserError(f"{name} must be >= {least}, got {getattr(self, name)}")
        if not 0 < self.deadline_s < float("inf"):
            raise UserError(f"deadline_s must be > 0 and finite, got {self.deadline_s}")

    @property
    def max_body_bytes(self) -> int:
        """The largest body a request within the other limits needs: every character written
        as a JSON escaped surrogate pair (12 bytes), a few bytes around each sentence, and 4 KiB
        for the other fields."""
        return 12 * self.max_chars + 8 * self.max_sentences + 4096


def _unicode(line: str) -> str:
    """JSON can escape a lone surrogate (``"\\ud800"``), which no tokenizer (nor UTF-8) encodes."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError(
            f"character {err.start} is a lone surrogate {line[err.start]!r}, not Unicode text"
        ) from None
    return line


Unicode = Annotated[str, AfterValidator(_unicode)]


class TranslateRequest(BaseModel):
    """The body of ``POST /translate``: types are strict (``"4"`` is not a beam size)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    text: list[Unicode] = Field(min_length=1, description="sentences to translate, one per item")
    beam: int = Field(
        DEFAULT.beam, ge=1, le=MAX_BEAM, description="beam size (1: beam search with one beam)"
    )
    alpha: float = Field(DEFAULT.alpha, ge=0.0, le=10.0, description="GNMT length penalty alpha")
    nbest: int = Field(
        1, ge=1, description="hypotheses per sentence, at most beam (with sample: samples)"
    )
    search_rules: str = Field(
        PAPER_RULES.name,
        description="whose beam-search rules: the paper's, or fairseq's, Hugging Face's or "
        f"CTranslate2's length penalty, stopping rule and length limit ({', '.join(SEARCH_RULES)})",
    )
    no_repeat_ngram_size: int = Field(
        0, ge=0, description="never repeat an n-gram of this size in the output (0: off)"
    )
    repetition_penalty: float = Field(  # its range is the library's one rule (DecodeConfig)
        1.0, description="> 1 penalises tokens already in the output (1: off; at most 10)"
    )
    split: bool = Field(
        False, description="split each text into sentences and join their translations back"
    )
    markup: Literal["xml", "html"] | None = Field(
        None, description="the texts carry tags: put them back around the aligned words"
    )
    placeholders: bool = Field(
        False, description="keep format strings, URLs, e-mail, numbers, entities verbatim"
    )
    attention: bool = Field(
        False, description="return the best hypothesis' encoder-decoder attention"
    )
    prefix: list[Unicode] | None = Field(
        None, description='one per sentence: the fixed start of its translation ("": none)'
    )
    constraints: list[list[Unicode]] | None = Field(
        None, description="one list per sentence: words or phrases its translation must contain"
    )
    glossary: list[list[Unicode]] | dict[Unicode, Unicode] | None = Field(
        None,
        description="terms [[source, target], ...] or {source: target}: where a source occurs "
        "(whole words, case-sensitive), the translation holds its target; over the server's",
    )
    target_lang: Unicode | None = Field(
        None, description="the language to translate into (a model with >>xx<< tokens)"
    )
    alignments: bool = Field(
        False, description="Pharaoh 'i-j' word alignments of every hypothesis (source word i)"
    )
    alignment_layer: int | None = Field(
        None, description="the decoder layer whose attention aligns (default -1: the last)"
    )
    sample: bool = Field(
        False, description="draw nbest samples instead of beam search (not in the paper)"
    )
    top_k: int | None = Field(None, ge=0, description="draw among the k most probable (0: all)")
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, description="draw among the fewest tokens of probability >= p"
    )
    temperature: float | None = Field(None, gt=0.0, description="< 1 sharpens, > 1 flattens")
    seed: int | None = Field(None, ge=0, description="the same seed gives the same samples")
    stream: bool = Field(
        False,
        description="answer as NDJSON lines, one per item (per sentence with split), each as "
        'soon as it and those before it are done, then {"done": true}',
    )

    @model_validator(mode="after")
    def _search_or_samples(self) -> TranslateRequest:
        """The library's rules (``decode.options``, ``DecodeConfig``), named by the fields."""
        search_rules(self.search_rules, option="search_rules")
        if self.sampling() is not None and self.nbest > MAX_BEAM:
            raise UserError(f"nbest ({self.nbest}) samples: at most {MAX_BEAM} per sentence")
        self.decode_config()  # nbest at most beam
        if "alignment_layer" in self.model_fields_set and not self.alignments:
            raise UserError('alignment_layer needs "alignments": true')
        return self

    @model_validator(mode="after")
    def _one_per_sentence(self) -> TranslateRequest:
        for name in ("prefix", "constraints"):
            per_sentence = getattr(self, name)
            if per_sentence is not None and len(per_sentence) != len(self.text):
                raise UserError(
                    f"{name} has {len(per_sentence)} items but text has {len(self.text)}: give "
                    "one per sentence"
                )
        return self

    def decode_config(self) -> DecodeConfig:
        """The search's settings; a sampled request keeps only alpha (its scores) and the
        length limit, so that sampled requests of one ``sampling`` share a decode call."""
        return DecodeConfig(
            beam=1 if self.sample else self.beam,
            alpha=self.alpha,
            max_len_a=DEFAULT.max_len_a,
            max_len_b=DEFAULT.max_len_b,
            nbest=1 if self.sample else self.nbest,
            rules=search_rules(self.search_rules),
            no_repeat_ngram_size=self.no_repeat_ngram_size,
            repetition_penalty=self.repetition_penalty,
        )

    def sampling(self) -> SampleConfig | None:
        """The draw ``"sample": true`` asks for (``nbest`` samples), or None: beam search."""
        beam = self.beam if "beam" in self.model_fields_set else None  # given: refused
        drawing = {name: getattr(self, name) for name in SAMPLING}
        return checks.sampling(
            SERVER.name, self.sample, beam, self.nbest, self.search_rules, drawing
        )


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class BodyLimit:
    """ASGI middleware: a request's body, at most ``max_bytes`` of it, is read before the app
    parses it. A body over the limit (declared by Content-Length, or reached while a chunked
    body streams in) is answered 413.

    The rest of an oversize body, up to ``DRAIN_BYTES``, is read and dropped before the 413 is
    sent: a server that closes with unread bytes in its socket sends a TCP reset, and a client
    still sending (urllib, http.client, requests, httpx) then loses the answer. A client that
    asked ``Expect: 100-continue`` (curl) has sent nothing yet and is answered at once; a body
    over ``DRAIN_BYTES`` is answered at once too, with ``Connection: close``.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            message = (
                f"the body is {declared} bytes; the limit is {self.max_bytes} bytes per request"
            )
            waiting = headers.get("expect", "").lower() == "100-continue"
            drained = not waiting and int(declared) <= DRAIN_BYTES and await _drain(receive, 0)
            return await _refuse(message, drained, scope, receive, send)
        body, more = bytearray(), True
        while more:
            event = await receive()
            if event["type"] == "http.disconnect":
                return  # the client left before its body was in: nobody to answer
            body += event.get("body", b"")
            more = event.get("more_body", False)
            if len(body) > self.max_bytes:
                message = f"the body is over {self.max_bytes} bytes, the limit per request"
                drained = not more or await _drain(receive, len(body))
                return await _refuse(message, drained, scope, receive, send)
        if (problem := _not_utf8(bytes(body), headers.get("content-type"))) is not None:
            return await _error(400, problem)(scope, receive, send)
        await self.app(scope, _replay(bytes(body), receive), send)


def _not_utf8(body: bytes, content_type: str | None) -> str | None:
    """Why a JSON body is not UTF-8 text, which JSON must be (RFC 8259); FastAPI's own answer
    names nothing ("There was an error parsing the body")."""
    if not _is_json(content_type) or json.detect_encoding(body) != "utf-8":
        return None  # not JSON (415 later), or UTF-16/32, which the parser reads
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"the body is not UTF-8 text: byte {err.start} ({body[err.start]:#04x}) {err.reason}"
    return None


async def _drain(receive: Receive, read: int) -> bool:
    """Read and drop the rest of a body, ``read`` bytes of which are in: True once it is all
    in, False when the client left or it went past ``DRAIN_BYTES``."""
    while read <= DRAIN_BYTES:
        event = await receive()
        if event["type"] == "http.disconnect":
            return False
        read += len(event.get("body", b""))
        if not event.get("more_body", False):
            return True
    return False


async def _refuse(message: str, drained: bool, scope: Scope, receive: Receive, send: Send) -> None:
    """The 413; a connection whose body was not all read is closed after it."""
    headers = None if drained else {"connection": "close"}
    await _error(413, message, headers=headers)(scope, receive, send)


class ApiKey:
    """ASGI middleware: a request must carry the server's key, as ``Authorization: Bearer KEY``
    or ``X-API-Key: KEY``, else 401; ``/health`` (for load balancers) and the page (which asks
    for the key, holding no data) are open. Compared in constant time; never logged."""

    OPEN = ("/health", "/")

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN:
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        given = bearer if scheme.lower() == "bearer" else headers.get("x-api-key", "")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), self.key):
            message = "this server needs its API key: send Authorization: Bearer KEY"
            answer = _error(401, message, headers={"WWW-Authenticate": "Bearer"})
            return await answer(scope, receive, send)
        await self.app(scope, receive, send)


class RequestId:
    """ASGI middleware: every answer carries an ``X-Request-ID`` header, the client's own when
    it is sane (``REQUEST_ID``), else a new one; the app reads it as ``request.state.request_id``
    to name the request in the log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = Headers(scope=scope).get("x-request-id", "")
        request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        scope = {**scope, "state": {**scope.get("state", {}), "request_id": request_id}}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app: the body read already, then the client's (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule for a JSON body: application/json or application/*+json."""
    mime = (content_type or "").split(";")[0].strip().lower()
    return mime == "application/json" or (
        mime.startswith("application/") and mime.endswith("+json")
    )


async def _unless_hung_up(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None once the client hangs up (``work`` is then cancelled)."""

    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() else None


def _validation_message(err: RequestValidationError) -> tuple[int, str]:
    """FastAPI's error list -> (status, one line naming each offending field)."""
    problems = []
    for e in err.errors():
        if e["type"] == "json_invalid":
            return (
                400,
                f"malformed JSON: {e.get('ctx', {}).get('error', e['msg'])} at character {e['loc'][-1]}",
            )
        where = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}"
            for part in e["loc"]
            if part != "body"
        ).removeprefix(".")  # text[0], as the app's own messages name an item
        if not where and e["type"] == "string_unicode":
            problems.append("a field name is not Unicode text (it holds a lone surrogate)")
        elif not where and e["type"] in ("model_attributes_type", "dict_type", "model_type"):
            problems.append('the body must be a JSON object, e.g. {"text": ["a sentence"]}')
        elif not where:
            problems.append(e["msg"].removeprefix("Value error, "))
        elif e["type"] == "extra_forbidden":
            problems.append(f"unknown field {where!r}")
        elif e["type"] == "missing":
            problems.append(f"missing field {where!r}")
        else:
            problems.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
    return 422, "; ".join(problems)


def _not_json(request: Request, err: RequestValidationError) -> str | None:
    """Why a body was not read as JSON, if its content type is the reason.

    Strict on purpose: a browser sends a text/plain POST from any web page without asking the
    server first (no CORS preflight), so accepting one would let any page use a local server.
    """
    content_type = request.headers.get("content-type")
    if not isinstance(err.body, bytes) or _is_json(content_type):  # bytes: left unparsed
        return None
    given = repr(content_type) if content_type else "none"
    return f"the body must be JSON with Content-Type: application/json, not {given}"


def create_app(
    translator: Adapter, limits: Limits = Limits(), api_key: str | None = None
) -> FastAPI:
    """The app for one loaded ``translator``; its batcher thread lives as long as the app runs.
    ``api_key``: every route but ``/health`` and the page needs it (``ApiKey``).

    ``app.state.batcher.stop(drain_s)`` begins a shutdown (``server.make_server`` calls it).
    """
    if api_key is not None and not (api_key.isascii() and api_key.isprintable()):
        # a header's bytes arrive as Latin-1: a UTF-8 client's key would never match
        raise UserError("the API key must be printable ASCII: an HTTP header carries it")
    app = FastAPI(
        title="aiayn",
        summary="Transformer translation with dynamic batching",
        lifespan=_lifespan(translator, limits),
        docs_url=None,  # FastAPI's pages load their scripts from a CDN: blank offline
        redoc_url=None,
    )
    if api_key:  # inside BodyLimit: a refused body is read (bounded) before its 401 too
        app.add_middleware(ApiKey, key=api_key)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.add_middleware(RequestId)  # the outermost: every answer names its request
    _add_error_handlers(app)
    _add_routes(app, translator, limits)
    return app


def _lifespan(
    translator: Adapter, limits: Limits
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.batcher = Batcher(
            translator.decode,
            cost=lambda job: job.tokens,
            key=lambda job: job.key,
            max_cost=limits.max_batch_tokens,
            max_wait_s=limits.max_wait_ms / 1000,
            max_queue=limits.max_queue,
            deadline_s=limits.deadline_s,
        )
        try:
            yield
        finally:  # uvicorn has let the requests in flight finish; decode what is still queued
            await asyncio.to_thread(app.state.batcher.close)

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        if (problem := _not_json(request, err)) is not None:
            return _error(415, problem)
        return _error(*_validation_message(err))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        return _error(err.status_code, str(err.detail))

    @app.exception_handler(_Refused)
    async def refused(request: Request, err: _Refused) -> JSONResponse:
        return _error(err.status, str(err))


def _add_routes(app: FastAPI, translator: Adapter, limits: Limits) -> None:
    page = files(__package__).joinpath("page.html").read_text(encoding="utf-8")

    @app.post("/translate")
    async def translate(body: TranslateRequest, request: Request) -> Response:
        try:
            text = text_request(body, translator)  # split, markup, placeholders (serve/text.py)
        except UserError as err:
            raise _Refused(422, str(err)) from None
        sources = _sources(translator, limits, text.body)
        job = _translate_job(translator, text.body, sources)
        if body.stream:
            return await _streamed(request, job, text)
        return await _decoded(request, job, text)

    @app.get("/health")
    async def health(request: Request) -> dict:
        return {"status": "ok", **asdict(request.app.state.batcher.stats)}

    @app.get("/info")
    async def info() -> dict:
        return {
            **translator.info(),
            "limits": asdict(limits),
            "max_beam": MAX_BEAM,
            "decode_defaults": asdict(DEFAULT),
        }

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page


class _Refused(Exception):
    """A request answered with an error before any decoding."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _sources(translator: Adapter, limits: Limits, body: TranslateRequest) -> list[list[int]]:
    """The request's source ids, or ``_Refused`` (413) when it is over a limit."""
    if len(body.text) > limits.max_sentences:
        raise _Refused(
            413,
            f"text has {len(body.text)} sentences; the limit is {limits.max_sentences} per request",
        )
    chars = sum(len(line) for line in body.text)
    if chars > limits.max_chars:
        raise _Refused(
            413, f"text has {chars} characters; the limit is {limits.max_chars} per request"
        )
    try:
        sources = translator.encode(body.text, body.target_lang)
    except UserError as err:
        raise _Refused(422, str(err)) from None
    for i, src in enumerate(sources):
        if len(src) > translator.max_source_tokens:
            raise _Refused(
                413,
                f"text[{i}] is {len(src)} subword tokens; the model reads at most "
                f"{translator.max_source_tokens}",
            )
    return sources


def _translate_job(
    translator: Adapter, body: TranslateRequest, sources: list[list[int]]
) -> TranslateJob:
    """What the batcher hands to ``translator.decode``: the one place a request's decoding
    settings are built, each mistake a 422 (``_Refused``) before any decoding."""
    try:
        config = body.decode_config()  # the library's checks of the settings, one rule each
        glossary = translator.glossary_of(body.glossary)
        constraints = translator.constraints(sources, config, body.prefix, body.constraints)
        layer = translator.alignment_layer(body.alignment_layer) if body.alignments else None
        job = TranslateJob(
            sources,
            config,
            body.attention,
            sampling=body.sampling(),
            constraints=constraints,
            alignment_layer=layer,
        )
    except UserError as err:
        raise _Refused(422, str(err)) from None
    _check_supported(translator, body, job)
    try:  # the terms join the constraints once the engine is known to take them
        return translator.with_glossary(job, body.text, glossary)
    except UserError as err:
        raise _Refused(422, str(err)) from None


def _check_supported(translator: Adapter, body: TranslateRequest, job: TranslateJob) -> None:
    """The engine's refusals, all in one, before the queue, named by the request's fields."""
    try:
        translator.check_supported(
            job, seed=body.seed is not None, glossary=body.glossary is not None
        )
    except UserError as err:
        raise _Refused(422, str(err)) from None


@dataclass(frozen=True)
class _Failed:
    """Why a job got no answers: a whole answer's status, message and headers."""

    status: int
    message: str
    headers: dict[str, str] | None = None

    def response(self) -> JSONResponse:
        return _error(self.status, self.message, self.headers)

    def line(self) -> dict[str, object]:
        """The last line of a streamed answer that failed after its first line."""
        return {"error": self.message, "status": self.status}


async def _decode(request: Request, job: TranslateJob, *, watch: bool = True) -> list | _Failed:
    """``job``'s answers through the batcher, or why not; a failure's traceback goes to the log
    under the request's id, never into the answer (it may hold server paths or input).
    ``watch``: give up once the client hangs up (a stream's own response watches instead)."""
    batcher: Batcher = request.app.state.batcher
    try:
        work = batcher.submit(job)
        answers = await (_unless_hung_up(request, work) if watch else work)
    except ShuttingDown as err:
        return _Failed(503, str(err))
    except Overloaded as err:
        return _Failed(503, str(err), {"Retry-After": str(err.retry_after_s)})
    except Exception as err:  # this request only: the batcher answered the others
        request_id = request.state.request_id
        log.error("request %s: decoding failed", request_id, exc_info=err)
        return _Failed(
            500, f"decoding failed; the server's log has the details under request id {request_id}"
        )
    if answers is None:  # nobody reads this; 499 is what access logs call a hang-up
        return _Failed(499, "the client closed the connection")
    return answers


async def _decoded(request: Request, job: TranslateJob, text: TextRequest) -> JSONResponse:
    """``job`` through the batcher, as the answer to send."""
    answers = await _decode(request, job)
    if isinstance(answers, _Failed):
        return answers.response()
    return JSONResponse({"translations": text.finish(answers)})


async def _streamed(request: Request, job: TranslateJob, text: TextRequest) -> Response:
    """``job`` answered piece by piece, its parts decoded in turn (``stream_windows``). The
    first part is decoded before the answer starts, so what stops it is a whole answer's
    status; a later part's failure is the stream's last line."""
    parts = _parts(len(job.sources))
    first = await _decode(request, job.part(*parts[0]))
    if isinstance(first, _Failed):
        return first.response()

    async def lines() -> AsyncIterator[dict]:
        answers, sent = list(first), 0
        for i, (start, end) in enumerate(parts):
            if i:  # a hang-up cancels this wait: StreamingResponse watches the client
                got = await _decode(request, job.part(start, end), watch=False)
                if isinstance(got, _Failed):
                    yield got.line()
                    return
                answers += got
            pieces = text.ready(answers, sent)
            sent += len(pieces)
            for piece in pieces:
                yield piece.line()
        yield {"done": True}

    events = _accepts_events_only(request.headers.get("accept", ""))
    frame = _event if events else _ndjson
    return StreamingResponse(
        (frame(line) async for line in lines()),
        media_type="text/event-stream" if events else "application/x-ndjson",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},  # proxies: no buffer
    )


def _parts(n: int) -> list[tuple[int, int]]:
    """[start, end) of each part of a streamed job of ``n`` sentences."""
    parts: list[tuple[int, int]] = []
    sizes = stream_windows()
    while not parts or parts[-1][1] < n:
        start = parts[-1][1] if parts else 0
        parts.append((start, min(n, start + next(sizes))))
    return parts


def _accepts_events_only(accept: str) -> bool:
    """Server-sent events when the client asks for them and not for NDJSON or anything."""
    types = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return "text/event-stream" in types and not types & {"application/x-ndjson", "*/*"}


def _json(line: dict) -> str:
    """A line as JSONResponse writes its body: UTF-8, no spaces."""
    return json.dumps(line, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _ndjson(line: dict) -> str:
    return _json(line) + "\n"


def _event(line: dict) -> str:
    return f"data: {_json(line)}\n\n"
