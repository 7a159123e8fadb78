"""Where spans go, by OpenTelemetry's own rules, and the span pipeline of our servers.

The endpoint: an explicit one, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as is), else
OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, else the local collector. Every part that exports spans
(the agent side, the gateway, the trainer's metrics) resolves it here, so they agree.
"""

from __future__ import annotations

import os

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from lightning_otel.core import schema

DEFAULT_TRACES_ENDPOINT = "http://127.0.0.1:4318/v1/traces"
DEFAULT_EXPORT_TIMEOUT_S = 5.0  # bounds how long process exit waits for a collector that is down
ENDPOINT_HELP = (
    "OTLP/HTTP traces URL its spans go to (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else "
    "$OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, else " + DEFAULT_TRACES_ENDPOINT + ")"
)


def traces_endpoint(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return DEFAULT_TRACES_ENDPOINT


def export_timeout_s() -> float:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        if os.environ.get(name):
            return float(os.environ[name])
    return DEFAULT_EXPORT_TIMEOUT_S


def server_tracer_provider(service_name: str, endpoint: str | None = None) -> TracerProvider:
    """A provider of its own (not the process-global one) for a server's spans, batched to `endpoint`
    (resolved as above); shut it down to flush."""
    provider = TracerProvider(resource=Resource.create({schema.SERVICE_NAME: service_name}))
    exporter = OTLPSpanExporter(endpoint=traces_endpoint(endpoint), timeout=export_timeout_s())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
