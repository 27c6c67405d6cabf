"""``aiayn serve``: the HTTP API with dynamic batching and the attention page (``aiayn.serve``)."""

from __future__ import annotations

import argparse
import os
import sys

from .common import add_device_arg
from .decoding import (
    add_engine_arg,
    add_glossary_arg,
    add_precision_args,
    add_quantize_arg,
    open_translator,
)

API_KEY_ENV = "AIAYN_API_KEY"


def _serve(args: argparse.Namespace) -> None:
    try:
        from ..serve import Limits, run_server
        from ..serve.server import check_listen, is_loopback
    except ModuleNotFoundError as err:
        raise SystemExit(f"aiayn serve: needs {err.name}: pip install 'aiayn[serve]'") from None

    limits = Limits(
        max_chars=args.max_chars,
        max_sentences=args.max_sentences,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        deadline_s=args.deadline_s,
    )
    check_listen(args.host, args.port)  # before the model loads: a bad port costs no wait
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if api_key is None and not is_loopback(args.host):
        print(
            f"aiayn serve: warning: listening on {args.host} without an API key: anyone who can "
            f"reach port {args.port} can use it; set {API_KEY_ENV} (or --api-key)",
            file=sys.stderr,
        )
    translator = open_translator(args, "serve")
    run_server(
        translator,
        host=args.host,
        port=args.port,
        limits=limits,
        api_key=api_key,
        glossary=args.glossary,
    )


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="an HTTP API with dynamic batching and a page showing the attention"
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint or averaged directory")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)"
    )
    p.add_argument("--port", type=int, default=8000)
    add_device_arg(p)
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=4000,
        help="source tokens of the requests decoded together (0: each request alone)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        help="how long a request waits for others to join it",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests waiting for a decode at most; more are answered 503 with Retry-After",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=30.0,
        help="a request whose decode has not started this long after it came is answered 503",
    )
    p.add_argument("--max-chars", type=int, default=10_000, help="characters of text per request")
    p.add_argument("--max-sentences", type=int, default=64, help="sentences per request")
    p.add_argument(
        "--api-key",
        help=f"a key every request but /health must send (Authorization: Bearer KEY); the "
        f"environment variable {API_KEY_ENV} keeps it out of the process list",
    )
    add_quantize_arg(p)
    add_engine_arg(p)
    add_precision_args(p)
    add_glossary_arg(p)
    p.set_defaults(func=_serve)
