"""Where spans go, by OpenTelemetry's own rules, and the span pipeline of our servers.

The endpoint: an explicit one, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as is), else
OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, else the local collector. Every part that exports spans
(the agent side, the gateway, the trainer's metrics) resolves it here, so they agree.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from typing import TYPE_CHECKING

from lightning_otel.core import schema

if TYPE_CHECKING:  # imported when a provider is made: commands' --help reads SPANS_DESTINATION cheaply
    from opentelemetry.sdk.trace import TracerProvider

DEFAULT_TRACES_ENDPOINT = "http://127.0.0.1:4318/v1/traces"
DEFAULT_EXPORT_TIMEOUT_S = 5.0  # bounds how long process exit waits for a collector that is down
ENDPOINT_HELP = (
    "OTLP/HTTP traces URL its spans go to (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else "
    "$OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, else " + DEFAULT_TRACES_ENDPOINT + ")"
)

SPANS_DESTINATION = (  # for the --help of commands that export spans
    "--otlp-endpoint URL if given, else $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT + "
    f"/v1/traces, else {DEFAULT_TRACES_ENDPOINT} (the collector's default)"
)


def traces_endpoint(explicit: str | None = None) -> str:
    """Where spans are exported: SPANS_DESTINATION, in that order."""
    if explicit:
        return explicit
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return DEFAULT_TRACES_ENDPOINT


def endpoint_listening(url: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections at the URL's host and port (a collector, presumably)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def export_timeout_s() -> float:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        if os.environ.get(name):
            return float(os.environ[name])
    return DEFAULT_EXPORT_TIMEOUT_S


def server_tracer_provider(service_name: str, endpoint: str | None = None) -> TracerProvider:
    """A provider of its own (not the process-global one) for a server's spans, batched to `endpoint`
    (resolved as above); shut it down to flush."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({schema.SERVICE_NAME: service_name}))
    exporter = OTLPSpanExporter(endpoint=traces_endpoint(endpoint), timeout=export_timeout_s())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
