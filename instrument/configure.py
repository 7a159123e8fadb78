"""`instrument()`: one call that makes an agent process export what training needs.

It configures an OpenTelemetry TracerProvider exporting OTLP/HTTP to the collector (default
http://127.0.0.1:4318, or whatever the standard OTEL_EXPORTER_OTLP_* variables say), stamps
rollout identity on spans, and turns on every supported integration that is installed.
Idempotent: a second call returns the first call's result and adds nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from lightning_otel.instrument import schema
from lightning_otel.instrument.integrations import ALL as INTEGRATIONS
from lightning_otel.instrument.rollouts import RolloutAttributesProcessor
from lightning_otel.instrument.token_encoding import set_encoding

log = logging.getLogger(__name__)
DEFAULT_ENDPOINT = "http://127.0.0.1:4318/v1/traces"
DEFAULT_SERVICE_NAME = "lightning-agent"
_CAPTURE_MODES = ("auto", "always", "off")


@dataclass
class Instrumentation:
    """What `instrument()` set up; `flush()` pushes buffered spans to the collector now."""

    tracer_provider: TracerProvider
    endpoint: str
    integrations: list[str] = field(default_factory=list)

    def flush(self, timeout_millis: int = 30_000) -> bool:
        return self.tracer_provider.force_flush(timeout_millis)


_state: Instrumentation | None = None
_lock = threading.Lock()


def _endpoint(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return DEFAULT_ENDPOINT


def instrument(
    endpoint: str | None = None,
    service_name: str | None = None,
    capture_tokens: str = "auto",
    token_encoding: str = "auto",
) -> Instrumentation:
    """Configure tracing for this process and turn on the installed integrations.

    endpoint: OTLP/HTTP traces URL; default from OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else
      http://127.0.0.1:4318/v1/traces.
    service_name: resource `service.name`; default OTEL_SERVICE_NAME, else 'lightning-agent'.
    capture_tokens: 'auto' asks servers that identify as vLLM for token ids and logprobs,
      'always' asks every server, 'off' never asks.
    token_encoding: how token ids and logprobs travel (docs/span-schema.md): 'auto' (raw bytes
      when the SDK supports them, else base64), 'bytes', or 'base64' (for backends that cannot
      store bytes attributes, such as Arize Phoenix).
    """
    global _state
    if capture_tokens not in _CAPTURE_MODES:
        raise ValueError(f"capture_tokens must be one of {_CAPTURE_MODES}, got {capture_tokens!r}")
    with _lock:
        if _state is not None:
            return _state
        set_encoding(token_encoding)
        url = _endpoint(endpoint)
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            provider = current  # someone configured the SDK already: add to it, don't replace it
        else:
            name = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
            provider = TracerProvider(resource=Resource.create({schema.SERVICE_NAME: name}))
            trace.set_tracer_provider(provider)
        provider.add_span_processor(RolloutAttributesProcessor())
        # BatchSpanProcessor never blocks the agent; the provider flushes it at interpreter exit.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        enabled = []
        for integration in INTEGRATIONS:
            if integration.available():
                integration.enable(provider, capture_tokens)
                enabled.append(integration.NAME)
        log.info("lightning_otel: exporting to %s; integrations: %s", url, ", ".join(enabled) or "none")
        _state = Instrumentation(tracer_provider=provider, endpoint=url, integrations=enabled)
        return _state
