"""Build real OTLP requests with the OpenTelemetry SDK (no hand-written protobuf)."""

from __future__ import annotations

import urllib.error
import urllib.request

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def make_spans(build, service: str = "unit"):
    """Run build(tracer) against an in-memory exporter; return the finished ReadableSpans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer("tests"))
    provider.shutdown()
    return exporter.get_finished_spans()


def request_bytes(spans) -> bytes:
    return encode_spans(spans).SerializeToString()


def post(url: str, body: bytes, content_type: str = "application/x-protobuf", headers: dict | None = None):
    """POST and return (status, headers, body) without raising on HTTP errors."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type, **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()
