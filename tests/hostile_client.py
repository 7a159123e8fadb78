"""Senders for the hostile suite (tests/collector/test_collector_hostile.py): keep-alive HTTP, raw sockets and
gRPC, each turning whatever happens into an `Outcome` (a reply code, or None and the client's error)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from dataclasses import dataclass

import grpc
from hostile_otlp import Request
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

_STATUS_LINE = re.compile(rb"(?:^|\r\n)HTTP/1\.[01] (\d{3}) ")
_MAX_MESSAGE = 64 * 1024 * 1024


@dataclass
class Outcome:
    channel: str  # "http", "raw" or "grpc"
    index: int
    kind: str
    code: int | str | None  # HTTP status, gRPC status name, or None: no reply
    error: str = ""  # the client's exception when there was no reply
    rejected: int | None = None  # partial_success.rejected_spans of a 200 / OK
    seconds: float = 0.0
    span_ids: tuple = ()
    service: str | None = None
    valid: bool = False
    later_codes: tuple = ()  # raw: the codes of further replies on the same connection

    @property
    def acknowledged(self) -> bool:
        """Acknowledged in full: every span of it must be stored."""
        return self.code in (200, "OK") and self.rejected == 0


def rejected_spans(body: bytes, is_json: bool) -> int | None:
    """partial_success.rejected_spans of an export reply (None when the reply is not one)."""
    try:
        if is_json:
            return int((json.loads(body).get("partialSuccess") or {}).get("rejectedSpans") or 0)
        return ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans
    except Exception:
        return None


class HttpSender:
    """One keep-alive HTTP/1.1 connection, reopened when the server closes it or it sat idle."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0, idle_s: float = 1.0) -> None:
        self.host, self.port, self.timeout_s, self.idle_s = host, port, timeout_s, idle_s
        self.conn: http.client.HTTPConnection | None = None
        self.last_used = 0.0

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def send(self, method: str, path: str, body: bytes, headers: dict) -> tuple[int | None, bytes, str]:
        """(status, reply body, client error). The server's idle timeout may close a connection just
        as a request goes out; a connection idle for `idle_s` is replaced first, so none is reused
        near that timeout."""
        if self.conn is None or time.monotonic() - self.last_used > self.idle_s:
            self.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            try:
                if headers.get("Transfer-Encoding") == "chunked":
                    rest = {k: v for k, v in headers.items() if k != "Transfer-Encoding"}
                    half = len(body) // 2
                    self.conn.request(
                        method, path, body=iter([body[:half], body[half:]]), headers=rest, encode_chunked=True
                    )
                else:
                    self.conn.request(method, path, body=body, headers=headers)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered before the whole body was sent (413) and stopped reading
            response = self.conn.getresponse()
            data = response.read()
            if response.will_close:
                self.close()
            return response.status, data, ""
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close()
            return None, b"", type(exc).__name__
        finally:
            self.last_used = time.monotonic()


def send_http(sender: HttpSender, request: Request, index: int) -> Outcome:
    started = time.monotonic()
    status, data, error = sender.send(request.method, request.path, request.body, request.headers)
    rejected = (
        rejected_spans(data, request.headers.get("Content-Type") == "application/json") if status == 200 else None
    )
    return Outcome(
        "http",
        index,
        request.kind,
        status,
        error,
        rejected,
        time.monotonic() - started,
        request.span_ids,
        request.service,
        request.valid,
    )


def send_raw(host: str, port: int, request: Request, index: int, timeout_s: float = 15.0) -> Outcome:
    """The request's bytes on a fresh socket; read until the server closes (or the timeout)."""
    started, received, error = time.monotonic(), bytearray(), ""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:  # nothing listens any more: the survival test reports it
        return Outcome("raw", index, request.kind, None, type(exc).__name__, seconds=time.monotonic() - started)
    with sock:
        try:
            sock.sendall(request.raw)
        except OSError as exc:
            error = type(exc).__name__
        while len(received) < 1 << 20:
            try:
                chunk = sock.recv(65536)
            except OSError as exc:
                error = error or type(exc).__name__
                break
            if not chunk:
                break
            received += chunk
    codes = [int(code) for code in _STATUS_LINE.findall(bytes(received))]
    return Outcome(
        "raw",
        index,
        request.kind,
        codes[0] if codes else None,
        error,
        None,
        time.monotonic() - started,
        later_codes=tuple(codes[1:]),
    )


class GrpcSender:
    """Unary calls with raw bytes in and out (no serializers): any message, any method path."""

    def __init__(self, target: str) -> None:
        options = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]
        self.channel = grpc.insecure_channel(target, options=options)
        self._methods: dict[str, object] = {}

    def close(self) -> None:
        self.channel.close()

    def send(self, method: str, request: Request, metadata: tuple, index: int, timeout_s: float = 30.0) -> Outcome:
        call = self._methods.setdefault(method, self.channel.unary_unary(method))
        started, rejected, error = time.monotonic(), None, ""
        try:
            reply = call(request.body, metadata=metadata, timeout=timeout_s)
            code = "OK"
            rejected = rejected_spans(reply, False)
        except grpc.RpcError as exc:
            code, error = exc.code().name, (exc.details() or "")[:200]
        return Outcome(
            "grpc",
            index,
            request.kind,
            code,
            error,
            rejected,
            time.monotonic() - started,
            request.span_ids,
            request.service,
            request.valid,
        )
