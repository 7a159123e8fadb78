"""`instrument()`: one call that makes an agent process export what training needs.

It configures an OpenTelemetry TracerProvider exporting OTLP/HTTP to the collector (default
http://127.0.0.1:4318, or whatever the standard OTEL_EXPORTER_OTLP_* variables say), stamps
rollout identity on spans, and turns on every supported integration that is installed.
Idempotent: a second call returns the first call's result and adds nothing.

The agent is never blocked by the collector: spans leave through a bounded queue on a
background thread; when the queue is full they are dropped and counted (`dropped_spans`), and
batches the collector refuses or never receives are counted too (`failed_spans`).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import uuid
from dataclasses import dataclass, field

import wrapt
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

from lightning_otel.core import schema
from lightning_otel.core.gen_ai import GenAIConventions, chosen_shape
from lightning_otel.core.otlp import export_timeout_s, traces_endpoint
from lightning_otel.core.token_encoding import current as token_encoding_in_use
from lightning_otel.core.token_encoding import set_encoding
from lightning_otel.core.vllm_endpoint import ENDPOINTS
from lightning_otel.instrumentation import sdk_fallbacks
from lightning_otel.instrumentation.integrations import ALL as INTEGRATIONS
from lightning_otel.instrumentation.options import (
    CAPTURE_MODES,
    MIN_ATTRIBUTE_LENGTH,
    OPENAI_SPAN_MODES,
    STATE,
    CaptureMode,
    OpenAISpans,
    Options,
    TokenEncoding,
)
from lightning_otel.instrumentation.otlp_encoding import encode_request
from lightning_otel.instrumentation.rollouts import LightningSpanProcessor

log = logging.getLogger(__name__)
DEFAULT_SERVICE_NAME = "lightning-agent"


class _CountingExporter(OTLPSpanExporter):
    """The OTLP/HTTP exporter, counting what it could not deliver, and encoding with
    otlp_encoding (the same bytes, ~3x less of the agent's CPU). It sends through the SDK
    exporter's own HTTP client (retries, compression, headers); should a later SDK lay that out
    differently, or our encoder fail on a batch, the SDK's export() runs instead."""

    handed = 0  # spans the batch processor passed to export(), delivered or not
    failed = 0

    def export(self, spans):
        self.handed += len(spans)
        result = self._export_encoded(spans)
        if result is None:
            result = super().export(spans)
        if result != SpanExportResult.SUCCESS:
            self.failed += len(spans)
        return result

    def _export_encoded(self, spans) -> SpanExportResult | None:
        client, limit = getattr(self, "_client", None), getattr(self, "_max_request_size", None)
        if (
            client is None
            or not hasattr(client, "export")
            or not isinstance(limit, int)
            or not hasattr(self, "_shutdown")
        ):
            sdk_fallbacks.missing(
                "OTLPSpanExporter._client/_max_request_size/_shutdown", "spans are encoded by the SDK's exporter"
            )
            return None
        if self._shutdown:
            return None
        try:
            body = encode_request(spans)
        except Exception:
            log.exception("lightning_otel: could not encode a span batch; using the SDK's encoder")
            return None
        if 0 < limit < len(body):
            log.warning(
                "Dropping span batch: serialized size %d bytes exceeds max_request_size %d bytes.", len(body), limit
            )
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if client.export(body).success else SpanExportResult.FAILURE


class _CountingBatchSpanProcessor(BatchSpanProcessor):
    """BatchSpanProcessor that knows how many spans its full queue dropped.

    The SDK's own "queue full" check races with its export thread (a span it calls dropped may
    still be exported), so drops are derived instead: spans queued, minus spans handed to the
    exporter, minus spans still waiting. Exact once flushed; while spans are in flight the
    count can briefly include a batch being handed over.
    """

    queued = 0

    def on_end(self, span) -> None:
        # what BatchSpanProcessor.on_end does (its queue's emit() for sampled spans), counted, one call
        # shorter: this runs at the end of every model call
        batch = getattr(self, "_batch_processor", None)
        if batch is None or not hasattr(batch, "emit"):  # an SDK laid out differently: its own on_end
            sdk_fallbacks.missing("BatchSpanProcessor._batch_processor.emit", "the SDK's own on_end")
            if span.context and span.context.trace_flags.sampled:
                self.queued += 1
            super().on_end(span)
            return
        if span.context and span.context.trace_flags.sampled:
            if not getattr(batch, "_shutdown", False):
                self.queued += 1
            batch.emit(span)

    def dropped(self, exporter: _CountingExporter) -> int:
        queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
        if queue is None:
            sdk_fallbacks.missing(
                "BatchSpanProcessor._batch_processor._queue", "dropped_spans also counts queued spans"
            )
        waiting = len(queue) if queue is not None else 0
        return max(0, self.queued - exporter.handed - waiting)


@dataclass
class Instrumentation:
    """What `instrument()` set up; `flush()` pushes buffered spans to the collector now."""

    tracer_provider: TracerProvider
    endpoint: str
    integrations: list[str] = field(default_factory=list)
    options: Options = field(default_factory=Options)
    _processor: _CountingBatchSpanProcessor | None = None
    _exporter: _CountingExporter | None = None

    def flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every span ended so far, LLM spans still waiting for their weight version included."""
        settled = ENDPOINTS.settle(timeout_millis / 1000)
        return self.tracer_provider.force_flush(timeout_millis) and settled

    @property
    def dropped_spans(self) -> int:
        """Spans dropped because the export queue was full (the collector could not keep up)."""
        return self._processor.dropped(self._exporter) if self._processor and self._exporter else 0

    @property
    def failed_spans(self) -> int:
        """Spans in batches the collector did not accept (down, or refused them)."""
        return self._exporter.failed if self._exporter else 0


def instrument(
    *,
    endpoint: str | None = None,
    service_name: str | None = None,
    capture_tokens: CaptureMode = "auto",
    token_encoding: TokenEncoding = "auto",
    hide_inputs: bool = False,
    hide_outputs: bool = False,
    max_attribute_length: int | None = None,
    openai_spans: OpenAISpans = "lean",
    gen_ai_conventions: GenAIConventions = "auto",
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
    hide_inputs / hide_outputs: redact prompt and completion text (OpenInference's masking) and
      tool arguments / results; token ids and logprobs are kept, training needs them.
    max_attribute_length: cut string attribute values to this many characters, at least
      MIN_ATTRIBUTE_LENGTH (rollout() and reward() then refuse longer rollout and task ids); not with
      base64 token encoding, whose text must stay whole.
    openai_spans: spans of OpenAI SDK chat and text completions: 'lean' (the default: our span in
      OpenInference's conventions, without the full response JSON and tool definitions, at a
      fraction of the cost per call; callers get only the token fields they asked for) or
      'openinference' (OpenInference's instrumentor, every attribute it records; README "Instrument
      an agent"). Other endpoints always use OpenInference's.
    gen_ai_conventions: also write OpenTelemetry's GenAI semantic-convention attributes on our own
      spans (lean OpenAI SDK calls, `@tool`, `rollout()`, `agent()`; docs/span-schema.md, "Writing GenAI
      semantic conventions"): 'auto' (the default) only when OTEL_SEMCONV_STABILITY_OPT_IN has
      gen_ai_latest_experimental, 'on' in the shape that variable selects (latest, else v1.36), 'off',
      or a shape: 'latest', 'v1.36'. Message content follows hide_inputs / hide_outputs.
    """
    if capture_tokens not in CAPTURE_MODES:
        raise ValueError(f"capture_tokens must be one of {CAPTURE_MODES}, got {capture_tokens!r}")
    if openai_spans not in OPENAI_SPAN_MODES:
        raise ValueError(f"openai_spans must be one of {OPENAI_SPAN_MODES}, got {openai_spans!r}")
    _refuse_short_cap(max_attribute_length)
    gen_ai = chosen_shape(gen_ai_conventions)
    with STATE.lock:
        if STATE.instrumentation is not None:
            return STATE.instrumentation
        set_encoding(token_encoding)
        url = traces_endpoint(endpoint)
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            provider = current  # someone configured the SDK already: add to it, don't replace it
            limits = getattr(current, "_span_limits", None)
            if limits is None:
                sdk_fallbacks.missing(
                    "TracerProvider._span_limits", "an attribute length cap set before is not checked"
                )
            if (
                max_attribute_length is not None
                and getattr(limits, "max_attribute_length", None) != max_attribute_length
            ):
                log.warning(
                    "lightning_otel: max_attribute_length=%s not applied: this process's TracerProvider was made "
                    "before instrument(), and its span limits apply",
                    max_attribute_length,
                )
        else:
            provider = None
            limits = SpanLimits(max_attribute_length=max_attribute_length)  # None: OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT
        cap = getattr(limits, "max_attribute_length", None)  # what will cut string attributes, wherever it was set
        _refuse_short_cap(cap)
        if cap is not None and token_encoding_in_use() == "base64":
            raise ValueError("an attribute length cap would cut base64-packed token ids; use token_encoding='bytes'")
        chosen = Options(
            capture_tokens=capture_tokens,
            hide_inputs=hide_inputs,
            hide_outputs=hide_outputs,
            openai_spans=openai_spans,
            max_attribute_length=cap,
            gen_ai=gen_ai,
        )
        STATE.options = chosen
        if provider is None:
            name = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
            resource = Resource.create({schema.SERVICE_NAME: name, schema.SERVICE_INSTANCE_ID: uuid.uuid4().hex})
            provider = TracerProvider(resource=resource, span_limits=limits)
            trace.set_tracer_provider(provider)
        atexit.register(ENDPOINTS.settle)  # runs before the provider's own exit flush (registered earlier)
        provider.add_span_processor(LightningSpanProcessor())
        exporter = _CountingExporter(endpoint=url, timeout=export_timeout_s())
        processor = _CountingBatchSpanProcessor(exporter)  # never blocks the agent; flushed at exit
        provider.add_span_processor(processor)
        enabled = [integration.NAME for integration in INTEGRATIONS if _arm(integration, provider, chosen)]
        log.info("lightning_otel: exporting to %s; integrations: %s", url, ", ".join(enabled) or "none")
        STATE.dropped_spans = lambda: processor.dropped(exporter)
        STATE.instrumentation = Instrumentation(provider, url, enabled, chosen, processor, exporter)
        return STATE.instrumentation


def _refuse_short_cap(cap: int | None) -> None:
    """The attribute cap applies to every string attribute, rollout and task ids included: a short one
    would cut them and detach spans from their rollouts."""
    if cap is not None and cap < MIN_ATTRIBUTE_LENGTH:
        raise ValueError(
            f"an attribute length cap would cut string attributes to {cap} characters, rollout and task ids "
            f"included: it must be at least {MIN_ATTRIBUTE_LENGTH} (max_attribute_length, or "
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT)"
        )


def _arm(integration, provider: TracerProvider, chosen: Options) -> bool:
    """Turn the integration on now, or when its library is first imported. False if not installed."""
    if not integration.available():
        return False

    def turn_on(_module=None) -> None:
        try:
            integration.enable(provider, chosen)
        except Exception:
            log.exception("lightning_otel: could not turn on the %s integration", integration.NAME)

    if integration.TRIGGER is None or integration.TRIGGER in sys.modules:
        turn_on()
    else:
        wrapt.register_post_import_hook(turn_on, integration.TRIGGER)
    return True
