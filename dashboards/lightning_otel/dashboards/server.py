"""`lightning-otel dashboard`: a small web page over the trace store, served on 127.0.0.1.

The command line lives here; the server (aiohttp: routes, the query-token guard, the static files,
bounded SQL through the collector's QueryLimiter) in dashboard_app.py. Only the standard library is
imported here at import time: `lightning-otel --help` must work, and quickly, without the
dashboard's extras (aiohttp's server, duckdb, tokenizers); `DashboardServer` is imported on first use.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from lightning_otel.collector.config import DEFAULT_QUERY_MAX_CONCURRENT, DEFAULT_QUERY_TIMEOUT_S

DEFAULT_PORT = 8050


def __getattr__(name: str):
    if name == "DashboardServer":
        from lightning_otel.dashboards.dashboard_app import DashboardServer

        return DashboardServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from lightning_otel.collector.store import Store
    from lightning_otel.dashboards.dashboard_app import DashboardServer
    from lightning_otel.dashboards.detokenizer import Detokenizer

    try:
        detokenizer = Detokenizer(args.tokenizer) if args.tokenizer else None
    except FileNotFoundError as exc:
        print(f"lightning-otel dashboard: --tokenizer: {exc}", file=sys.stderr)
        return 2
    server = DashboardServer(
        args.host,
        args.port,
        args.data_dir,
        args.query_token or None,
        detokenizer,
        args.query_timeout_s,
        args.query_max_concurrent,
    )
    # SIGTERM and Ctrl-C stop serving and close connections; shutdown() must come from another thread.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    empty = "" if Store(args.data_dir).has_data() else " (no spans yet; the page fills in as they arrive)"
    login = " (open /?token=<query token> once)" if args.query_token else ""
    print(f"lightning-otel dashboard: {server.url}{login}; data {args.data_dir}{empty}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def add_parser(sub, data_dir: str) -> None:
    env = os.environ.get
    p = sub.add_parser(
        "dashboard",
        help="web dashboard over the trace store: overview, training, rollout explorer",
        description="Reads the trace store (--data-dir) with SQL; sends no spans.",
    )
    p.add_argument("--data-dir", default=data_dir, help="trace store [$LIGHTNING_OTEL_DATA_DIR]")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--tokenizer",
        default=env("LIGHTNING_OTEL_TOKENIZER"),
        help="model folder with tokenizer.json: the token view shows text, not ids [$LIGHTNING_OTEL_TOKENIZER]",
    )
    p.add_argument(
        "--query-token",
        default=env("LIGHTNING_OTEL_QUERY_TOKEN"),
        help="bearer token the page must send (prefer the environment variable) [$LIGHTNING_OTEL_QUERY_TOKEN]",
    )
    p.add_argument(
        "--query-timeout-s",
        type=float,
        default=float(env("LIGHTNING_OTEL_QUERY_TIMEOUT_S", DEFAULT_QUERY_TIMEOUT_S)),
        help="seconds a POST /v1/query statement may run before it is stopped (504) [$LIGHTNING_OTEL_QUERY_TIMEOUT_S]",
    )
    p.add_argument(
        "--query-max-concurrent",
        type=int,
        default=int(env("LIGHTNING_OTEL_QUERY_MAX_CONCURRENT", DEFAULT_QUERY_MAX_CONCURRENT)),
        help="POST /v1/query statements running at once before 429 [$LIGHTNING_OTEL_QUERY_MAX_CONCURRENT]",
    )
    p.set_defaults(func=_cmd_dashboard)
