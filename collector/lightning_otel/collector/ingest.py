"""What every receiver does with an export: check it, shed load, log it durably.

Shared by OTLP/HTTP (protobuf and JSON) and OTLP/gRPC, so the rules are the same on every port:
spans with invalid ids or over a size cap (size_caps.py) are dropped and reported (partial
success), an undecodable body is a ValueError (400, INVALID_ARGUMENT), an overloaded collector says
so with a retry hint instead of queueing without bound, and nothing is acknowledged before the
write-ahead log's fsync covers it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from lightning_otel.collector.request_check import span_count
from lightning_otel.collector.size_caps import drop_oversized
from lightning_otel.collector.span_rows import count_spans, decode_request, has_valid_ids
from lightning_otel.collector.wal import WriteAheadLog


class Overloaded(Exception):
    """Retryable: too much work in flight (429) or too much not yet in Parquet (503)."""

    def __init__(self, message: str, retry_after_s: int, too_many_requests: bool) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.too_many_requests = too_many_requests


@dataclass
class Result:
    accepted: int
    rejected: int = 0
    message: str = ""


def drop_invalid_spans(request: ExportTraceServiceRequest) -> int:
    """Remove spans with ids of the wrong length in place; return how many were removed."""
    rejected = 0
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            valid = [span for span in scope.spans if has_valid_ids(span)]
            if len(valid) != len(scope.spans):
                rejected += len(scope.spans) - len(valid)
                kept = [span.SerializeToString() for span in valid]
                del scope.spans[:]
                for raw in kept:
                    scope.spans.add().ParseFromString(raw)
    return rejected


class Ingestor:
    def __init__(self, wal: WriteAheadLog, max_inflight: int = 64, max_backlog_bytes: int = 2 * 1024**3) -> None:
        self.wal = wal
        self.max_backlog_bytes = max_backlog_bytes
        self._slots = threading.BoundedSemaphore(max_inflight)
        self._backlog = (0.0, 0)  # (measured at, bytes): listing the log on every request costs
        self.accepted = 0
        self.rejected = 0

    def _backlog_bytes(self) -> int:
        measured_at, value = self._backlog
        if time.monotonic() - measured_at > 0.5:
            value = self.wal.backlog_bytes()
            self._backlog = (time.monotonic(), value)
        return value

    def export(self, request: ExportTraceServiceRequest, body: bytes, flags: int = 0) -> Result:
        """Log `request` (whose serialized form is `body`, stored with WAL `flags`) durably."""
        return self._export(request, None, body, flags)

    def export_body(self, data: bytes, stored: bytes | None = None, flags: int = 0) -> Result:
        """Log the OTLP/protobuf export `data` durably (as `stored` with `flags` when given: its
        compressed form). Raises ValueError, logging nothing, when it is not a valid export.

        A body the quick check (request_check.py) vouches for is logged without being parsed into
        messages; any other is parsed with upb, which rejects it or drops its spans with bad ids
        or over a size cap."""
        stored = data if stored is None else stored
        spans = span_count(data)
        if spans is not None:
            return self._export(None, spans, stored, flags)
        return self._export(decode_request(data), None, stored, flags)

    def _export(self, request: ExportTraceServiceRequest | None, spans: int | None, body: bytes, flags: int) -> Result:
        if not self._slots.acquire(blocking=False):
            raise Overloaded("too many exports in flight", retry_after_s=1, too_many_requests=True)
        try:
            if self._backlog_bytes() > self.max_backlog_bytes:
                raise Overloaded(
                    "Parquet conversion is behind; try again shortly", retry_after_s=5, too_many_requests=False
                )
            rejected, reasons = 0, []
            if request is not None:  # parsed: drop spans with bad ids or over a cap, count the rest
                invalid = drop_invalid_spans(request)
                oversized, why = drop_oversized(request)
                if invalid:
                    reasons.append(f"{invalid} span(s) with invalid trace or span ids")
                if oversized:
                    reasons.append(f"{oversized} span(s) over a size cap: {why}")
                rejected = invalid + oversized
                if rejected:
                    body, flags = request.SerializeToString(), 0
                spans = count_spans(request)
            elif spans is None:
                raise TypeError("_export needs the parsed request or the span count")
            if spans:
                self.wal.append(body, flags)
            self.accepted += spans
            self.rejected += rejected
            return Result(accepted=spans, rejected=rejected, message="; ".join(reasons))
        finally:
            self._slots.release()
