"""OTLP/HTTP receiver (POST /v1/traces) and the optional read-only query endpoint (POST /v1/query),
served by aiohttp on an event loop of their own (one thread).

Traces: `application/x-protobuf` or `application/json` (OTLP/JSON), with a `Content-Length` or
`Transfer-Encoding: chunked`, optionally gzip or deflate (inflated as it arrives); `Expect:
100-continue` is answered after the headers are checked; the reply uses the request's content
type. A 200 is sent only after the write-ahead log's fsync covers the request: decoding and the
log append run on a thread pool, where concurrent exports share fsyncs (wal.py's group commit).
Errors follow the OTLP specification: 400 with a google.rpc.Status body for undecodable data,
401 without the bearer token (when one is set), 413 as soon as the body or what it decompresses
to passes the cap, 415 for other content types and encodings, 429/503 with Retry-After when
overloaded, and a 200 with `partial_success` when some spans were rejected. A client silent for
`http_read_timeout_s` (headers, or within a body) or slower than `http_body_timeout_s` for a
whole body gets 408 and the connection is closed; an idle keep-alive connection closes then too.

Query: `{"sql": "SELECT ..."}` -> `{"columns": [...], "rows": [[...], ...]}`, one read-only
statement against a sandboxed DuckDB connection in a query worker process (never this process's
GIL), bearer token required, limited in size, in time and in how many run at once; an optional
`"rollout_ids": [...]` narrows the views to those rollouts
(collector/lightning_otel/collector/query_limits.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from aiohttp import HttpVersion11, web
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from lightning_otel.collector.client_errors import ClientErrorLog, http_server_logger
from lightning_otel.collector.config import CollectorConfig
from lightning_otel.collector.http_body import (
    ENCODINGS,
    GZIP_ENCODING,
    BadEncoding,
    Body,
    BodyTimeout,
    BodyTooLarge,
    read_body,
)
from lightning_otel.collector.ingest import Ingestor, Overloaded, Result
from lightning_otel.collector.otlp_json import decode_json, encode_json
from lightning_otel.collector.query_limits import QueryLimiter
from lightning_otel.collector.wal import GZIP
from lightning_otel.core.auth import bearer_ok

log = logging.getLogger(__name__)
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# After an early answer (413 mid-body), the rest of the body is read and dropped this long before
# the connection closes: closing with unread data makes the kernel reset the connection, and the
# client may lose the answer.
LINGER_S = 2.0


def _media_type(request: web.BaseRequest) -> str:
    return (request.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()


def _status(
    http_code: int,
    grpc_code: int,
    message: str,
    content_type: str = PROTOBUF,
    headers: dict | None = None,
    close: bool = False,
) -> web.Response:
    """An error reply with a google.rpc.Status body; `close` when the body was left unread."""
    status = status_pb2.Status(code=grpc_code, message=message)
    body = encode_json(status) if content_type == JSON else status.SerializeToString()
    response = web.Response(status=http_code, body=body, content_type=content_type, headers=headers)
    if close:
        response.force_close()
    return response


def _json_reply(code: int, payload: dict, headers: dict | None = None, close: bool = False) -> web.Response:
    response = web.Response(
        status=code, body=json.dumps(payload, default=str).encode(), content_type=JSON, headers=headers
    )
    if close:
        response.force_close()
    return response


def ingest(ingestor: Ingestor, content_type: str, body: Body) -> Result:
    """Decode or check one export body and log it durably (runs on the ingest pool: it blocks on fsync).

    A gzip protobuf body is logged as received (GZIP flag: less to write); JSON is logged as the
    protobuf it decodes to, after the same checks as a protobuf body (nesting that upb refuses to
    parse is a 400 here, not a segment the converter cannot read). Raises ValueError (400),
    Overloaded (429/503), OSError (503)."""
    if content_type == JSON:
        return ingestor.export_body(decode_json(body.data()).SerializeToString())
    if body.encoding == GZIP_ENCODING:
        return ingestor.export_body(body.data(), body.raw(), GZIP)
    return ingestor.export_body(body.data())


async def _health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


class OTLPHTTPServer:
    """Start with `start()` (binds, raises OSError if it cannot), stop with `stop()`."""

    def __init__(self, config: CollectorConfig, ingestor: Ingestor, data_dir: str) -> None:
        self.config = config
        self.ingestor = ingestor
        self.queries = (
            QueryLimiter(data_dir, config.query_timeout_s, config.query_max_concurrent) if config.query_token else None
        )
        self.server_address: tuple[str, int] = (config.host, config.http_port)
        # One thread per export in flight, as many as --max-inflight admits: an fsync never waits for a thread.
        self._ingest_pool = ThreadPoolExecutor(max(1, config.max_inflight), thread_name_prefix="lightning-otel-ingest")
        self._query_pool = ThreadPoolExecutor(
            max(1, config.query_max_concurrent), thread_name_prefix="lightning-otel-query"
        )
        self._exports = 0  # exports between admission and reply (event-loop thread only)
        self._client_errors = ClientErrorLog()  # 400s: one WARNING line per client per interval
        self._server_errors = ClientErrorLog()  # 500s (our bugs): one traceback per client per interval
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", _health)
        app.router.add_post("/v1/traces", self._export, expect_handler=self._expect)
        if self.queries is not None:
            app.router.add_post("/v1/query", self._query, expect_handler=self._expect_query)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    # Serving --------------------------------------------------------------------------------

    def start(self) -> OTLPHTTPServer:
        started = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._serve, args=(started, failure), name="lightning-otel-http", daemon=True
        )
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def _serve(self, started: threading.Event, failure: list[BaseException]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._bind())
        except BaseException as exc:
            failure.append(exc)
            if self._runner is not None:
                self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()
            started.set()
            return
        started.set()
        self._loop.run_forever()
        if self._runner is not None:
            self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _bind(self) -> None:
        config = self.config
        # keepalive_timeout also bounds how long a new connection may take to send its first
        # request's headers (aiohttp closes a connection that completed no request by then).
        self._runner = web.AppRunner(
            self.app(),
            access_log=None,
            logger=http_server_logger(self._client_errors),
            auto_decompress=False,
            shutdown_timeout=5.0,
            keepalive_timeout=config.http_read_timeout_s,
            lingering_time=LINGER_S,
            read_bufsize=4 << 20,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, config.host, config.http_port, backlog=256)
        await site.start()
        self.server_address = self._runner.addresses[0][:2]

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._ingest_pool.shutdown(wait=True)  # nothing writes to the log once this returns
        self._query_pool.shutdown(wait=True)
        if self.queries is not None:
            self.queries.close()  # its worker processes

    # Traces ---------------------------------------------------------------------------------

    def _precheck(self, request: web.BaseRequest, close: bool) -> web.Response | None:
        """The answer to an export that its headers alone settle. Its body is then read and dropped
        for LINGER_S (`close` False), or never sent (`close`, after `Expect: 100-continue`)."""
        media_type = _media_type(request)
        reply_type = JSON if media_type == JSON else PROTOBUF
        if not bearer_ok(request.headers.get("Authorization"), self.config.token):
            return _status(
                401,
                code_pb2.UNAUTHENTICATED,
                "missing or wrong bearer token",
                reply_type,
                headers={"WWW-Authenticate": "Bearer"},
                close=close,
            )
        if media_type not in (PROTOBUF, JSON):
            return _status(415, code_pb2.INVALID_ARGUMENT, f"unsupported content type {media_type!r}", close=close)
        encoding = (request.headers.get("Content-Encoding") or "").strip().lower()
        if encoding not in ENCODINGS:
            return _status(
                415, code_pb2.INVALID_ARGUMENT, f"unsupported content encoding {encoding!r}", reply_type, close=close
            )
        if (request.content_length or 0) > self.config.max_body_bytes:
            return _status(
                413,
                code_pb2.INVALID_ARGUMENT,
                f"body exceeds {self.config.max_body_bytes} bytes",
                reply_type,
                close=close,
            )
        return None

    async def _expect(self, request: web.Request) -> web.Response | None:
        """`Expect: 100-continue`: a final answer now if the headers already settle it, else 100."""
        if request.version != HttpVersion11 or request.headers.get("Expect", "").lower() != "100-continue":
            return _status(417, code_pb2.INVALID_ARGUMENT, "only 'Expect: 100-continue' is supported", close=True)
        rejection = self._precheck(request, close=True)
        if rejection is not None:
            return rejection
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the 100 is not part of the response
        return None

    async def _export(self, request: web.Request) -> web.Response:
        rejection = self._precheck(request, close=False)
        if rejection is not None:
            return rejection
        media_type = _media_type(request)
        reply_type = JSON if media_type == JSON else PROTOBUF
        config = self.config
        try:
            encoding = (request.headers.get("Content-Encoding") or "").strip().lower()
            body = await read_body(
                request.content, encoding, config.max_body_bytes, config.http_read_timeout_s, config.http_body_timeout_s
            )
        except BodyTooLarge as exc:  # answered at once; the rest is read and dropped for LINGER_S, then closed
            return _status(413, code_pb2.INVALID_ARGUMENT, str(exc), reply_type)
        except BodyTimeout as exc:
            return _status(408, code_pb2.DEADLINE_EXCEEDED, str(exc), reply_type, close=True)
        except BadEncoding as exc:
            self._client_errors.warn(request.remote, f"undecodable body: {exc}")
            return _status(400, code_pb2.INVALID_ARGUMENT, str(exc), reply_type)
        # In flight = being decoded and logged: a client still sending its body takes no slot.
        if self._exports >= config.max_inflight:
            return _status(
                429, code_pb2.UNAVAILABLE, "too many exports in flight", reply_type, headers={"Retry-After": "1"}
            )
        self._exports += 1
        try:
            result = await self._loop.run_in_executor(self._ingest_pool, ingest, self.ingestor, media_type, body)
        except ValueError as exc:
            self._client_errors.warn(request.remote, str(exc))
            return _status(400, code_pb2.INVALID_ARGUMENT, str(exc), reply_type)
        except Overloaded as exc:
            code = 429 if exc.too_many_requests else 503
            return _status(
                code, code_pb2.UNAVAILABLE, str(exc), reply_type, headers={"Retry-After": str(exc.retry_after_s)}
            )
        except OSError as exc:  # disk full or gone: the exporter should retry later
            log.error("write-ahead log append failed: %s", exc)
            return _status(503, code_pb2.UNAVAILABLE, "cannot write the log", reply_type, headers={"Retry-After": "5"})
        except Exception:  # a bug of ours on this body: 500, and a client cannot fill the log with it
            if self._server_errors.allow(request.remote) is not None:
                log.exception("export from %s failed", request.remote)
            return _status(500, code_pb2.INTERNAL, "internal error", reply_type)
        finally:
            self._exports -= 1
        response = ExportTraceServiceResponse()
        if result.rejected:
            response.partial_success.rejected_spans = result.rejected
            response.partial_success.error_message = result.message
        reply = encode_json(response) if reply_type == JSON else response.SerializeToString()
        return web.Response(body=reply, content_type=reply_type)

    # Query ----------------------------------------------------------------------------------

    def _query_precheck(self, request: web.BaseRequest, close: bool) -> web.Response | None:
        if not bearer_ok(request.headers.get("Authorization"), self.config.query_token):
            return _json_reply(
                401, {"error": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"}, close=close
            )
        if (request.headers.get("Content-Encoding") or "").strip().lower() not in ENCODINGS:
            return _json_reply(415, {"error": "unsupported content encoding"}, close=close)
        if (request.content_length or 0) > self.config.max_body_bytes:
            return _json_reply(413, {"error": f"body exceeds {self.config.max_body_bytes} bytes"}, close=close)
        return None

    async def _expect_query(self, request: web.Request) -> web.Response | None:
        rejection = self._query_precheck(request, close=True)
        if rejection is not None:
            return rejection
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0
        return None

    async def _query(self, request: web.Request) -> web.Response:
        queries = self.queries
        if queries is None:  # the route exists only with queries on
            return _json_reply(404, {"error": "queries are off"})
        rejection = self._query_precheck(request, close=False)
        if rejection is not None:
            return rejection
        config = self.config
        try:
            body = await read_body(
                request.content,
                (request.headers.get("Content-Encoding") or "").strip().lower(),
                config.max_body_bytes,
                config.http_read_timeout_s,
                config.http_body_timeout_s,
            )
        except BodyTooLarge as exc:
            return _json_reply(413, {"error": str(exc)})
        except BodyTimeout as exc:
            return _json_reply(408, {"error": str(exc)}, close=True)
        except ValueError as exc:
            return _json_reply(400, {"error": str(exc)})
        code, payload, headers = await queries.answer_async(body.data(), self._query_pool)
        return _json_reply(code, payload, headers)

    async def _not_found(self, request: web.Request) -> web.Response:
        return _status(404, code_pb2.NOT_FOUND, f"no route {request.path}")
