"""OTLP/HTTP receiver (POST /v1/traces) and the optional read-only query endpoint (POST /v1/query).

Traces: `application/x-protobuf` or `application/json` (OTLP/JSON), optionally gzip; the reply
uses the request's content type. A 200 is sent only after the write-ahead log's fsync covers the
request. Errors follow the OTLP specification: 400 with a google.rpc.Status body for undecodable
data, 401 without the bearer token (when one is set), 413 above the decompressed-size cap (a gzip
bomb stops at the cap), 415 for other content types, 429/503 with Retry-After when overloaded, and
a 200 with `partial_success` when some spans were rejected.

Query: `{"sql": "SELECT ..."}` -> `{"columns": [...], "rows": [[...], ...]}`, one read-only
statement against a sandboxed DuckDB connection (collector/lightning_otel/collector/query.py), bearer token required.
"""

from __future__ import annotations

import json
import logging
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import duckdb
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from lightning_otel.collector.config import DEFAULT_MAX_BODY
from lightning_otel.collector.ingest import Ingestor, Overloaded
from lightning_otel.collector.otlp_json import decode_json, encode_json
from lightning_otel.collector.query import MAX_QUERY_ROWS, run_query
from lightning_otel.collector.span_rows import decode_request
from lightning_otel.collector.wal import GZIP
from lightning_otel.core.auth import bearer_ok

log = logging.getLogger(__name__)
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class BodyTooLarge(ValueError):
    pass


def gunzip_capped(data: bytes, limit: int) -> bytes:
    """Decompress gzip without ever holding more than `limit` bytes (a gzip bomb stops early)."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"bad gzip body: {exc}") from None
    if len(out) > limit:
        raise BodyTooLarge(f"decompressed body exceeds {limit} bytes")
    if not decompressor.eof:
        raise ValueError("truncated gzip body")
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse connections
    timeout = 60  # seconds a silent or slow client may hold a connection (and its thread)
    server: "OTLPHTTPServer"

    def log_message(self, fmt: str, *args) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)

    def _reply(
        self, code: int, body: bytes, content_type: str, headers: dict | None = None, close: bool = False
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(
        self,
        http_code: int,
        grpc_code: int,
        message: str,
        content_type: str = PROTOBUF,
        headers: dict | None = None,
        close: bool = False,
    ) -> None:
        status = status_pb2.Status(code=grpc_code, message=message)
        body = encode_json(status) if content_type == JSON else status.SerializeToString()
        self._reply(http_code, body, content_type, headers, close)

    def _read_body(self, content_type: str) -> bytes | None:
        """The raw body, or None after replying with an error (too large, no length)."""
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._error(411, code_pb2.INVALID_ARGUMENT, "Content-Length required", content_type, close=True)
            return None
        if length > self.server.max_body_bytes:
            self._error(
                413,
                code_pb2.INVALID_ARGUMENT,
                f"body exceeds {self.server.max_body_bytes} bytes",
                content_type,
                close=True,
            )
            return None
        return self.rfile.read(length)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if self.path == "/health":
            self._reply(200, b"ok", "text/plain")
        else:
            self._error(404, code_pb2.NOT_FOUND, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802
        route = self.path.split("?", 1)[0]
        if route == "/v1/traces":
            self._export()
        elif route == "/v1/query" and self.server.query_token:
            self._query()
        else:
            self._error(404, code_pb2.NOT_FOUND, f"no route {self.path}", close=True)

    def _export(self) -> None:
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        reply_type = JSON if content_type == JSON else PROTOBUF
        if not bearer_ok(self.headers.get("Authorization"), self.server.token):
            self._error(
                401,
                code_pb2.UNAUTHENTICATED,
                "missing or wrong bearer token",
                reply_type,
                headers={"WWW-Authenticate": "Bearer"},
                close=True,
            )
            return
        if content_type not in (PROTOBUF, JSON):
            self._error(415, code_pb2.INVALID_ARGUMENT, f"unsupported content type {content_type!r}", close=True)
            return
        raw = self._read_body(reply_type)
        if raw is None:
            return
        gzipped = (self.headers.get("Content-Encoding") or "").strip().lower() == "gzip"
        try:
            body = gunzip_capped(raw, self.server.max_body_bytes) if gzipped else raw
            if content_type == JSON:
                request = decode_json(body)
                stored, flags = request.SerializeToString(), 0
            else:
                request = decode_request(body)
                stored, flags = (raw, GZIP) if gzipped else (body, 0)  # keep gzip bodies compressed in the log
            result = self.server.ingestor.export(request, stored, flags)
        except BodyTooLarge as exc:
            self._error(413, code_pb2.INVALID_ARGUMENT, str(exc), reply_type)
            return
        except ValueError as exc:
            self._error(400, code_pb2.INVALID_ARGUMENT, str(exc), reply_type)
            return
        except Overloaded as exc:
            code = 429 if exc.too_many_requests else 503
            self._error(
                code, code_pb2.UNAVAILABLE, str(exc), reply_type, headers={"Retry-After": str(exc.retry_after_s)}
            )
            return
        except OSError as exc:  # disk full or gone: the exporter should retry later
            log.error("write-ahead log append failed: %s", exc)
            self._error(503, code_pb2.UNAVAILABLE, "cannot write the log", reply_type, headers={"Retry-After": "5"})
            return
        response = ExportTraceServiceResponse()
        if result.rejected:
            response.partial_success.rejected_spans = result.rejected
            response.partial_success.error_message = result.message
        self._reply(200, encode_json(response) if reply_type == JSON else response.SerializeToString(), reply_type)

    def _query(self) -> None:
        if not bearer_ok(self.headers.get("Authorization"), self.server.query_token):
            self._reply(
                401,
                b'{"error": "missing or wrong bearer token"}',
                JSON,
                headers={"WWW-Authenticate": "Bearer"},
                close=True,
            )
            return
        raw = self._read_body(JSON)
        if raw is None:
            return
        try:
            payload = run_query(self.server.data_dir, json.loads(raw)["sql"], MAX_QUERY_ROWS)
        except (ValueError, KeyError, TypeError, duckdb.Error) as exc:
            self._reply(400, json.dumps({"error": str(exc)}).encode(), JSON)
            return
        self._reply(200, json.dumps(payload, default=str).encode(), JSON)


class OTLPHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        host: str,
        port: int,
        ingestor: Ingestor,
        data_dir: str,
        token: str | None = None,
        query_token: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.ingestor = ingestor
        self.data_dir = data_dir
        self.token = token
        self.query_token = query_token
        self.max_body_bytes = max_body_bytes
        super().__init__((host, port), _Handler)
