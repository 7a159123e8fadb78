"""`lightning-otel dashboard`: a small web page over the trace store, served on 127.0.0.1.

The page (dashboards/web/: plain HTML, JavaScript and inline SVG, nothing fetched from anywhere
else) is a SQL client of this server:

  GET  /, /app.js, ...     the static files of dashboards/web/
  GET  /v1/config          the span-schema names the page's SQL needs, and what this server offers
  POST /v1/query           {"sql": "SELECT ..."} -> {"columns", "rows", "truncated"}: one read-only
                           statement in the collector's sandbox, with its time limit and cap on
                           queries at once (collector.query_limits.QueryLimiter)
  POST /v1/detokenize      {"ids": [...]} -> {"tokens": [...]}, each id's text piece (--tokenizer)

With --query-token (or $LIGHTNING_OTEL_QUERY_TOKEN) the two POST routes want `Authorization:
Bearer T`; the page asks for it once (or takes it from `/?token=T`). POSTs must be JSON and, on a
loopback address, carry a loopback Host header: another web site open in the same browser can
then neither post a form here nor reach this server through DNS rebinding.

Only the standard library is imported here at import time: `lightning-otel --help` must work
without the dashboard's extras (duckdb, tokenizers).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from lightning_otel.collector.config import DEFAULT_QUERY_MAX_CONCURRENT, DEFAULT_QUERY_TIMEOUT_S
from lightning_otel.core.auth import bearer_ok

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().with_name("web")
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The browser may load nothing but this server's own files and talk to nothing else (no CDN, no
# fonts); inline style attributes stay allowed because the charts position elements with them.
CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self'; "
    "style-src 'self' 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
MAX_BODY_BYTES = 8 << 20
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
DEFAULT_PORT = 8050


class Detokenizer:
    """Token id -> the text it stands for, one id at a time, readable for byte-level BPE.

    Decoding ids one by one splits multi-byte characters; such a piece is shown as its bytes
    (`\\xe2\\x80`) instead of a replacement character, so no token looks empty or alike."""

    def __init__(self, model_dir: str | os.PathLike) -> None:
        from tokenizers import Tokenizer

        path = Path(model_dir)
        path = path if path.is_file() else path / "tokenizer.json"  # a model folder, or the file itself
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
        self._tokenizer = Tokenizer.from_file(str(path))
        self._vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self._byte_of_char = _byte_level_alphabet()
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()

    def pieces(self, ids: list[int]) -> list[str]:
        with self._lock:  # the cache is shared by the server's threads
            for token_id in set(ids) - self._cache.keys():
                if 0 <= token_id < self._vocab_size:  # the cache never outgrows the vocabulary
                    self._cache[token_id] = self._piece(token_id)
            return [self._cache.get(token_id, f"<id {token_id}>") for token_id in ids]

    def _piece(self, token_id: int) -> str:
        raw = self._tokenizer.id_to_token(token_id)
        if raw is None:
            return f"<id {token_id}>"
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        if text and "\ufffd" not in text:
            return text
        if all(ch in self._byte_of_char for ch in raw):  # a byte-level piece that is not whole UTF-8
            return "".join(f"\\x{self._byte_of_char[ch]:02x}" for ch in raw)
        return raw


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, reversed (what byte-level BPE pieces are made of)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def schema_names() -> dict[str, str]:
    """Every name of the span schema, so the page's SQL spells none itself."""
    from lightning_otel.core import schema

    return {name: value for name, value in vars(schema).items() if name.isupper() and isinstance(value, str)}


def _finite(value: object) -> object:
    """JSON has no NaN or Infinity (the browser's JSON.parse refuses them): they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    return value


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120
    server: DashboardServer

    def log_message(self, fmt: str, *args) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)

    def _reply(self, code: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, payload: object, headers: dict | None = None) -> None:
        body = json.dumps(_finite(payload), default=str, allow_nan=False).encode()
        self._reply(code, body, "application/json", headers)

    def _host_ok(self) -> bool:
        if not self.server.loopback_only:
            return True
        host = (self.headers.get("Host") or "").strip()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name in LOOPBACK_NAMES

    def do_GET(self) -> None:
        route = self.path.split("?", 1)[0]
        if route == "/health":
            self._reply(200, b"ok", "text/plain")
        elif route == "/v1/config":
            self._json(
                200,
                {
                    "schema": schema_names(),
                    "tokenizer": self.server.detokenizer is not None,
                    "token_required": bool(self.server.query_token),
                    "max_concurrent_queries": self.server.query_max_concurrent,
                },
            )
        else:
            self._static(route)

    def _static(self, route: str) -> None:
        name = "index.html" if route == "/" else route.lstrip("/")
        path = self.server.static_files.get(name)
        if path is None:
            self._json(404, {"error": f"no route {route}"})
            return
        self._reply(200, path.read_bytes(), CONTENT_TYPES[path.suffix])

    def do_POST(self) -> None:
        route = self.path.split("?", 1)[0]
        if route not in ("/v1/query", "/v1/detokenize"):
            self._json(404, {"error": f"no route {route}"})
            return
        if not self._host_ok():
            self._json(403, {"error": "this server answers loopback Host names only"})
            return
        if not bearer_ok(self.headers.get("Authorization"), self.server.query_token):
            self._json(401, {"error": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"})
            return
        if (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower() != "application/json":
            self._json(415, {"error": "send application/json"})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._json(411, {"error": "Content-Length required"})
            return
        if length > MAX_BODY_BYTES:
            self._json(413, {"error": f"body exceeds {MAX_BODY_BYTES} bytes"})
            return
        body = self.rfile.read(length)
        if route == "/v1/query":
            self._query(body)
        else:
            self._detokenize(body)

    def _query(self, body: bytes) -> None:
        code, payload, headers = self.server.queries().answer(body)
        self._json(code, payload, headers)

    def _detokenize(self, body: bytes) -> None:
        if self.server.detokenizer is None:
            self._json(404, {"error": "no tokenizer: start the dashboard with --tokenizer MODEL_DIR"})
            return
        try:
            ids = json.loads(body)["ids"]
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError("'ids' must be a list of integers")
        except (ValueError, KeyError, TypeError) as exc:
            self._json(400, {"error": str(exc)})
            return
        self._json(200, {"tokens": self.server.detokenizer.pieces(ids)})


class DashboardServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        host: str,
        port: int,
        data_dir: str,
        query_token: str | None = None,
        detokenizer: Detokenizer | None = None,
        query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        query_max_concurrent: int = DEFAULT_QUERY_MAX_CONCURRENT,
    ) -> None:
        self.data_dir = data_dir
        self.query_token = query_token
        self.detokenizer = detokenizer
        self.query_timeout_s = query_timeout_s
        self.query_max_concurrent = query_max_concurrent
        self._queries = None  # made at the first query: it imports duckdb
        self._queries_lock = threading.Lock()
        self.loopback_only = host in LOOPBACK_NAMES
        # Served by name from a fixed list: no path from a request ever reaches the file system.
        self.static_files = {p.name: p for p in WEB_DIR.iterdir() if p.is_file() and p.suffix in CONTENT_TYPES}
        super().__init__((host, port), _Handler)

    def queries(self):
        """The same limits as the collector's POST /v1/query: time, queries at once, memory."""
        with self._queries_lock:
            if self._queries is None:
                from lightning_otel.collector.query_limits import QueryLimiter

                self._queries = QueryLimiter(self.data_dir, self.query_timeout_s, self.query_max_concurrent)
            return self._queries

    def server_close(self) -> None:
        super().server_close()
        with self._queries_lock:
            if self._queries is not None:
                self._queries.close()  # its query worker processes

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from lightning_otel.collector.store import Store

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
    # SIGTERM stops serving like Ctrl-C does; shutdown() must come from another thread.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    empty = "" if Store(args.data_dir).has_data() else " (no spans yet; the page fills in as they arrive)"
    login = " (open /?token=<query token> once)" if args.query_token else ""
    print(f"lightning-otel dashboard: {server.url}{login}; data {args.data_dir}{empty}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
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
