"""OTLP/HTTP receiver: POST /v1/traces with application/x-protobuf (optionally gzip).

A 200 is sent only after the request is in the write-ahead log and fsynced. Errors follow the
OTLP specification: 400 with a google.rpc.Status body for undecodable data (not retried by
exporters), 413 above the size cap, 415 for other content types, and a 200 with
`partial_success` when some spans were rejected (invalid ids) and the rest stored.
"""

from __future__ import annotations

import logging
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from lightning_otel.collector.spans_table import decode_request, has_valid_ids
from lightning_otel.collector.wal import WriteAheadLog

log = logging.getLogger(__name__)
PROTOBUF = "application/x-protobuf"
DEFAULT_MAX_BODY = 20 * 1024 * 1024  # decompressed bytes


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


def drop_invalid_spans(request) -> int:  # noqa: ANN001 - ExportTraceServiceRequest
    """Remove spans with ids of the wrong length in place; return how many were removed."""
    rejected = 0
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            valid = [span for span in scope.spans if has_valid_ids(span)]
            if len(valid) != len(scope.spans):
                rejected += len(scope.spans) - len(valid)
                kept = [s.SerializeToString() for s in valid]
                del scope.spans[:]
                for raw in kept:
                    scope.spans.add().ParseFromString(raw)
    return rejected


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse connections
    server: "OTLPHTTPServer"

    def log_message(self, fmt: str, *args) -> None:  # quiet by default; errors are logged below
        log.debug("%s %s", self.address_string(), fmt % args)

    def _reply(self, code: int, body: bytes = b"", content_type: str = PROTOBUF, close: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, http_code: int, grpc_code: int, message: str, close: bool = False) -> None:
        status = status_pb2.Status(code=grpc_code, message=message)
        self._reply(http_code, status.SerializeToString(), close=close)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if self.path == "/health":
            self._reply(200, b"ok", content_type="text/plain")
        else:
            self._error(404, code_pb2.NOT_FOUND, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] != "/v1/traces":
            self._error(404, code_pb2.NOT_FOUND, f"no route {self.path}", close=True)
            return
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if content_type != PROTOBUF:
            self._error(415, code_pb2.INVALID_ARGUMENT, f"unsupported content type {content_type!r}", close=True)
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._error(411, code_pb2.INVALID_ARGUMENT, "Content-Length required", close=True)
            return
        limit = self.server.max_body_bytes
        if length > limit:
            self._error(413, code_pb2.INVALID_ARGUMENT, f"body exceeds {limit} bytes", close=True)
            return
        body = self.rfile.read(length)
        try:
            if (self.headers.get("Content-Encoding") or "").strip().lower() == "gzip":
                body = gunzip_capped(body, limit)
            request = decode_request(body)
        except BodyTooLarge as exc:
            self._error(413, code_pb2.INVALID_ARGUMENT, str(exc))
            return
        except ValueError as exc:
            self._error(400, code_pb2.INVALID_ARGUMENT, str(exc))
            return
        rejected = drop_invalid_spans(request)
        if rejected:
            body = request.SerializeToString()
        try:
            self.server.wal.append(body)
        except OSError as exc:  # disk full or gone: tell the exporter to retry later
            log.error("write-ahead log append failed: %s", exc)
            self.send_response(503)
            self.send_header("Retry-After", "5")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.rejected_spans = rejected
            response.partial_success.error_message = f"{rejected} span(s) with invalid trace or span ids"
        self._reply(200, response.SerializeToString())


class OTLPHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, wal: WriteAheadLog, max_body_bytes: int = DEFAULT_MAX_BODY) -> None:
        self.wal = wal
        self.max_body_bytes = max_body_bytes
        super().__init__((host, port), _Handler)
