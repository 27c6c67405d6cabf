"""The uvicorn side of ``aiayn serve``: timeouts, and a shutdown that answers every request.

Two holes in uvicorn's defaults are closed here:

- uvicorn times out only an idle keep-alive connection, so a client that sends half its
  headers holds a connection for ever; here a request's headers must be in
  ``header_timeout_s`` after the connection opens or the previous answer went out.
- On SIGTERM uvicorn cancels what is not done after its graceful timeout: requests still in
  the batcher's queue got plain-text 500s, and a response being sent was cut. Here the batcher
  is told first (``Batcher.stop``): what has not started decoding ``shutdown_timeout_s`` after
  the signal is answered 503 JSON, and the batch decoding then and the responses being sent
  get as long again to finish.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import os
import socket
from typing import TYPE_CHECKING

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import UserError
from .adapter import Adapter
from .app import Limits, create_app

if TYPE_CHECKING:
    from .. import translator as library

HEADER_TIMEOUT_S = 10.0  # for a request's line and headers, which a client sends at once
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this long (uvicorn's default)
MAX_HEADER_BYTES = 16 * 1024  # request line and headers; h11 answers 400 past it


class _HeaderDeadline(H11Protocol):
    """uvicorn's h11 connection, closed when a request's headers are not in by a deadline."""

    header_timeout_s = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        self._arm()  # before uvicorn starts on a pipelined request, which disarms it again
        super().on_response_complete()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class _Server(uvicorn.Server):
    """uvicorn's server, which tells the app's batcher when a shutdown begins."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_s: float) -> None:
        super().__init__(config)
        self._app, self.drain_s = app, drain_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._app.state.batcher.stop(self.drain_s)
        await super().shutdown(sockets)


def check_listen(host: str, port: int) -> None:
    """``UserError`` naming ``--host``/``--port`` when the server could not listen there: a
    port outside 0-65535, one in use, an address this machine does not have. Tried with a
    socket bound as uvicorn binds its own, then closed, so the mistake is one line before a
    model loads rather than uvicorn's error after it."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: a port is a number from 0 to 65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn sets it
        try:
            sock.bind((host, port))
        except socket.gaierror as err:
            raise UserError(f"--host {host}: not an address ({err.strerror})") from None
        except OSError as err:
            raise UserError(
                f"--host {host} --port {port}: cannot listen there ({err.strerror})"
            ) from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: resolved by the system, maybe to anything
        return False


def make_server(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_timeout_s: float = 30.0,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    log_level: str = "info",
) -> uvicorn.Server:
    """A uvicorn server for ``app`` (from ``create_app``); ``run()`` serves until SIGINT/SIGTERM
    (or ``should_exit``)."""
    protocol = type("HeaderDeadline", (_HeaderDeadline,), {"header_timeout_s": header_timeout_s})
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        timeout_keep_alive=KEEP_ALIVE_S,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        # the queue's time, then as long again (uvicorn counts whole seconds)
        timeout_graceful_shutdown=math.ceil(2 * shutdown_timeout_s),
        log_level=log_level,
    )
    return _Server(config, app, drain_s=shutdown_timeout_s)


def run_server(
    translator: library.Translator,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits | None = None,
    shutdown_timeout_s: float = 30.0,
    api_key: str | None = None,
    glossary: str | os.PathLike | None = None,
) -> None:
    """Serve ``translator`` (``aiayn.Translator``: a checkpoint loaded as ``aiayn translate``
    loads it, with its engine) until SIGINT/SIGTERM (see the module docstring); ``api_key``:
    the key every route but ``/health`` and the page needs (``app.ApiKey``); ``glossary``: a
    file of terms every request uses (``Adapter``), read and checked before serving."""
    server = make_server(
        create_app(Adapter(translator, glossary), limits or Limits(), api_key),
        host=host,
        port=port,
        shutdown_timeout_s=shutdown_timeout_s,
    )
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises a captured SIGINT once it has shut down
        pass
    if not server.started:
        raise SystemExit(3)  # uvicorn.run's status when the app or the socket failed to start
