"""The dashboard's web server: aiohttp on an event loop, like the collector's and the gateway's.

The page (dashboards/web/: plain HTML, JavaScript and inline SVG, nothing fetched from anywhere
else) is a SQL client of this server:

  GET  /, /app.js, ...     the static files of dashboards/web/
  GET  /v1/config          the span-schema names the page's SQL needs, and what this server offers
  POST /v1/query           {"sql": "SELECT ..."} -> {"columns", "rows", "truncated"}: one read-only
                           statement in the collector's sandbox, with its time limit and cap on
                           queries at once (collector.query_limits.QueryLimiter); with
                           "rollout_ids": [...] over the views narrowed to those rollouts (the
                           rollout page sends its rollout's id)
  POST /v1/detokenize      {"ids": [...]} -> {"tokens": [...]}, each id's text piece (--tokenizer)

With a query token the two POST routes want `Authorization: Bearer T`; the page asks for it once
(or takes it from `/?token=T`). POSTs must be JSON and, on a loopback address, carry a loopback
Host header: another web site open in the same browser can then neither post a form here nor
reach this server through DNS rebinding. Every reply carries a Content-Security-Policy that lets
the browser load nothing but this server's own files.

Nothing slow runs on the event loop: a query waits for its worker process on a thread of its own
(the first one also imports DuckDB there), and decoding token ids and encoding query results run on
the loop's default thread pool.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from lightning_otel.collector.client_errors import ClientErrorLog, http_server_logger
from lightning_otel.collector.config import DEFAULT_QUERY_MAX_CONCURRENT, DEFAULT_QUERY_TIMEOUT_S
from lightning_otel.collector.http_body import BodyTimeout, BodyTooLarge, read_body
from lightning_otel.core.auth import bearer_ok
from lightning_otel.dashboards.detokenizer import Detokenizer

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
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
MAX_BODY_BYTES = 8 << 20
READ_TIMEOUT_S = 120.0  # a client silent this long (headers, within a body, idle) loses its connection
BODY_TIMEOUT_S = 300.0  # the most one request body may take to arrive (408 past it)
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
POST_ROUTES = ("/v1/query", "/v1/detokenize")


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


def _encode(payload: object) -> bytes:
    return json.dumps(_finite(payload), default=str, allow_nan=False).encode()


def _json(code: int, payload: object, headers: dict | None = None) -> web.Response:
    return web.Response(status=code, body=_encode(payload), content_type="application/json", headers=headers)


async def _json_off_loop(code: int, payload: object, headers: dict | None = None) -> web.Response:
    """A reply whose encoding may take a while (up to the query row cap): on the loop's threads."""
    body = await asyncio.get_running_loop().run_in_executor(None, _encode, payload)
    return web.Response(status=code, body=body, content_type="application/json", headers=headers)


def _token_ids(body: bytes) -> list[int]:
    ids = json.loads(body)["ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError("'ids' must be a list of integers")
    return ids


class DashboardServer:
    """Binds at once (OSError if it cannot); `serve_forever()` serves on the calling thread until
    `shutdown()` is called from another one; `server_close()` frees the port and the query workers.
    The same lifecycle as the standard library's socketservers, which tests and the CLI rely on."""

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
        self.loopback_only = host in LOOPBACK_NAMES
        # Served by name from a fixed list: no path from a request ever reaches the file system.
        self.static_files = {p.name: p for p in WEB_DIR.iterdir() if p.is_file() and p.suffix in CONTENT_TYPES}
        self._queries = None  # made at the first query: it imports duckdb and starts worker processes
        self._queries_lock = threading.Lock()
        self._query_pool = ThreadPoolExecutor(max(1, query_max_concurrent), thread_name_prefix="dashboard-query")
        self._client_errors = ClientErrorLog()
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self.socket = socket.create_server((host.strip("[]"), port), family=family, backlog=128)
        self.server_address = self.socket.getsockname()[:2]
        self._state = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._shutdown_requested = False
        self._finished = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"

    def queries(self):
        """The same limits as the collector's POST /v1/query: time, queries at once, memory."""
        with self._queries_lock:
            if self._queries is None:
                from lightning_otel.collector.query_limits import QueryLimiter

                self._queries = QueryLimiter(self.data_dir, self.query_timeout_s, self.query_max_concurrent)
            return self._queries

    # Lifecycle ------------------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until shutdown(). `poll_interval` is socketserver's; an event loop needs none."""
        with self._state:
            if self._shutdown_requested:
                self._finished.set()
                return
            loop = self._loop = asyncio.new_event_loop()
            stop = self._stop = asyncio.Event()
        try:
            serving = loop.create_task(self._serve(stop))
            try:
                loop.run_until_complete(serving)
            except KeyboardInterrupt:
                stop.set()
                loop.run_until_complete(serving)  # the runner's cleanup: connections closed
                raise
        finally:
            with self._state:
                loop.close()
                self._finished.set()

    async def _serve(self, stop: asyncio.Event) -> None:
        runner = web.AppRunner(
            self.app(),
            access_log=None,
            auto_decompress=False,  # a body is read as sent (and bounded as sent), never inflated here
            logger=http_server_logger(self._client_errors),  # malformed requests: a line per client, no traceback
            keepalive_timeout=READ_TIMEOUT_S,
            shutdown_timeout=5.0,
        )
        await runner.setup()
        try:
            await web.SockSite(runner, self.socket).start()
            await stop.wait()
        finally:
            await runner.cleanup()

    def shutdown(self) -> None:
        """Stop serve_forever() and wait for it to return; a no-op when it is not running."""
        with self._state:
            self._shutdown_requested = True
            loop, stop = self._loop, self._stop
            if loop is None or stop is None or self._finished.is_set():
                return
            loop.call_soon_threadsafe(stop.set)
        self._finished.wait()

    def server_close(self) -> None:
        self.socket.close()
        with self._queries_lock:
            if self._queries is not None:
                self._queries.close()  # its query worker processes; a query still running gets a 500
        self._query_pool.shutdown(wait=True)

    # Routes ---------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.on_response_prepare.append(_add_security_headers)
        app.router.add_get("/health", _health)
        app.router.add_get("/v1/config", self._config)
        app.router.add_post("/v1/query", self._query)
        app.router.add_post("/v1/detokenize", self._detokenize)
        app.router.add_get("/{name:.*}", self._static)
        app.router.add_route("*", "/{tail:.*}", self._no_route)
        return app

    async def _config(self, _: web.Request) -> web.Response:
        return _json(
            200,
            {
                "schema": schema_names(),
                "tokenizer": self.detokenizer is not None,
                "token_required": bool(self.query_token),
                "max_concurrent_queries": self.query_max_concurrent,
            },
        )

    async def _static(self, request: web.Request) -> web.Response:
        name = "index.html" if request.path == "/" else request.path.lstrip("/")
        path = self.static_files.get(name)
        if path is None:
            return _json(404, {"error": f"no route {request.path}"})
        return web.Response(body=path.read_bytes(), headers={"Content-Type": CONTENT_TYPES[path.suffix]})

    async def _no_route(self, request: web.Request) -> web.Response:
        if request.method in ("GET", "HEAD", "POST"):
            return _json(404, {"error": f"no route {request.path}"})
        return _json(405, {"error": f"method {request.method} not allowed"}, {"Allow": "GET, HEAD, POST"})

    def _host_ok(self, request: web.Request) -> bool:
        if not self.loopback_only:
            return True
        host = (request.headers.get("Host") or "").strip()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name in LOOPBACK_NAMES

    async def _post_body(self, request: web.Request) -> bytes | web.Response:
        """A POST route's body, or the reply that refuses it: checked in this order, and nothing of
        the body is read before the host, the token and the content type pass."""
        if not self._host_ok(request):
            return _json(403, {"error": "this server answers loopback Host names only"})
        if not bearer_ok(request.headers.get("Authorization"), self.query_token):
            return _json(401, {"error": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"})
        if (request.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower() != "application/json":
            return _json(415, {"error": "send application/json"})
        if request.content_length is None:
            return _json(411, {"error": "Content-Length required"})
        if request.content_length > MAX_BODY_BYTES:
            return _json(413, {"error": f"body exceeds {MAX_BODY_BYTES} bytes"})
        try:  # bytes as sent: a Content-Encoding is not undone, so such a body is not JSON (400)
            body = await read_body(request.content, "", MAX_BODY_BYTES, READ_TIMEOUT_S, BODY_TIMEOUT_S)
        except BodyTooLarge as exc:
            return _json(413, {"error": str(exc)})
        except BodyTimeout as exc:
            response = _json(408, {"error": str(exc)})
            response.force_close()
            return response
        return body.data()

    async def _query(self, request: web.Request) -> web.Response:
        body = await self._post_body(request)
        if isinstance(body, web.Response):
            return body
        loop = asyncio.get_running_loop()
        limiter = await loop.run_in_executor(None, self.queries)  # the first one imports duckdb
        code, payload, headers = await limiter.answer_async(body, self._query_pool)
        return await _json_off_loop(code, payload, headers)

    async def _detokenize(self, request: web.Request) -> web.Response:
        body = await self._post_body(request)
        if isinstance(body, web.Response):
            return body
        if self.detokenizer is None:
            return _json(404, {"error": "no tokenizer: start the dashboard with --tokenizer MODEL_DIR"})
        try:
            tokens = await asyncio.get_running_loop().run_in_executor(None, self._pieces, body)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            return _json(400, {"error": str(exc)})
        return await _json_off_loop(200, {"tokens": tokens})

    def _pieces(self, body: bytes) -> list[str]:
        assert self.detokenizer is not None  # _detokenize answers 404 before calling this
        return self.detokenizer.pieces(_token_ids(body))


async def _health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _add_security_headers(_: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)
