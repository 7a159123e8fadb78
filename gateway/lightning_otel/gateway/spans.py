"""The gateway's span per proxied call: OpenInference's LLM span with the span schema's attributes and,
when asked (--gen-ai-conventions), OpenTelemetry's GenAI semantic-convention attributes too."""

from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from lightning_otel.core import gen_ai, schema
from lightning_otel.core.vllm_endpoint import StreamAccumulator, token_attributes
from lightning_otel.gateway.config import GatewayConfig


@dataclass
class Call:
    """What one proxied call needs to become a span."""

    kind: str | None
    body: dict | None
    rollout: dict[str, Any] = field(default_factory=dict)
    context: context_api.Context | None = None  # from the caller's traceparent, if any
    upstream: Any = None  # the replica that answered (its `url`)
    version: str | None = None  # the version that served the call, fixed at dispatch
    adapter: tuple[str, str] | None = None  # LoRA: (adapter name, version) the logical model maps to
    started_ns: int = field(default_factory=time.time_ns)
    translate: Any = None  # an Anthropic Messages call: rewrites the chat stream (core.anthropic_stream)

    @property
    def streaming(self) -> bool:
        return bool(self.body and self.body.get("stream"))


class SSEParser:
    """Feeds the `data:` events of a server-sent-event byte stream to a StreamAccumulator (and, with
    GenAI conventions on, to a StreamedResponse)."""

    def __init__(self, accumulator: StreamAccumulator, streamed: gen_ai.StreamedResponse | None = None) -> None:
        self.accumulator, self.streamed = accumulator, streamed
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            data = line[6:].strip() if line.startswith(b"data: ") else b""
            if data and data != b"[DONE]":
                try:
                    chunk = json.loads(data)
                    self.accumulator.add(chunk)
                    if self.streamed is not None:
                        self.streamed.add(chunk)
                except ValueError:
                    continue


class CallSpans:
    """Records proxied calls as spans on `tracer`, as `config` says (redaction, GenAI conventions)."""

    def __init__(self, tracer: trace.Tracer, config: GatewayConfig) -> None:
        self.tracer, self.config = tracer, config
        self.gen_ai = gen_ai.chosen_shape(config.gen_ai_conventions)  # GenAI-convention shape also written, or None

    def events(self, kind: str) -> SSEParser:
        return SSEParser(StreamAccumulator(kind), gen_ai.StreamedResponse(kind) if self.gen_ai else None)

    def record(
        self, call: Call, payload: bytes | None, error: str | None, accumulated: SSEParser | None = None
    ) -> None:
        if call.kind is None:
            return
        attributes: dict[str, Any] = {
            schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
            schema.LLM_PROVIDER: "vllm",
            **call.rollout,
        }
        if call.body is not None:
            attributes[schema.INPUT_VALUE] = schema.REDACTED if self.config.hide_inputs else json.dumps(call.body)
            attributes[schema.INPUT_MIME_TYPE] = "application/json"
            parameters = {k: v for k, v in call.body.items() if k not in ("messages", "prompt")}
            attributes[schema.LLM_INVOCATION_PARAMETERS] = json.dumps(parameters)
        if call.version is not None:
            attributes[schema.POLICY_VERSION] = call.version
        if call.upstream is not None:
            address = urllib.parse.urlsplit(call.upstream.url)
            attributes[schema.SERVER_ADDRESS] = address.hostname or ""
            if address.port:
                attributes[schema.SERVER_PORT] = address.port
        if payload is not None and call.streaming:  # a buffered stream (an idempotent replay)
            accumulated = self.events(call.kind)
            accumulated.feed(payload + b"\n")
            payload = None
        response = None
        if payload is not None:
            try:
                response = json.loads(payload)
                attributes.update(token_attributes(call.kind, response))
                usage = response.get("usage") or {}
                for name, key in (
                    (schema.LLM_TOKEN_COUNT_PROMPT, "prompt_tokens"),
                    (schema.LLM_TOKEN_COUNT_COMPLETION, "completion_tokens"),
                    (schema.LLM_TOKEN_COUNT_TOTAL, "total_tokens"),
                ):
                    if isinstance(usage.get(key), int):
                        attributes[name] = usage[key]
                if response.get("model"):
                    attributes[schema.LLM_MODEL_NAME] = response["model"]
                attributes[schema.OUTPUT_VALUE] = schema.REDACTED if self.config.hide_outputs else payload.decode()
                attributes[schema.OUTPUT_MIME_TYPE] = "application/json"
            except (ValueError, AttributeError):
                pass
        if accumulated is not None:
            attributes.update(accumulated.accumulator.attributes())
        name, kind = "ChatCompletion" if call.kind == "chat" else "Completion", trace.SpanKind.INTERNAL
        if self.gen_ai is not None:
            name = self._gen_ai_attributes(call.kind, self.gen_ai, call, response, accumulated, error, attributes)
            kind = trace.SpanKind.CLIENT
        span = self.tracer.start_span(
            name, context=call.context, kind=kind, attributes=attributes, start_time=call.started_ns
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def _gen_ai_attributes(
        self,
        endpoint: str,
        shape: str,
        call: Call,
        response: Any,
        accumulated: SSEParser | None,
        error: str | None,
        attributes: dict,
    ) -> str:
        """Add the GenAI-convention attributes (`shape`) of the call to `endpoint` to `attributes`; its span name."""
        body = call.body if isinstance(call.body, dict) else {}
        hide_inputs, hide_outputs = self.config.hide_inputs, self.config.hide_outputs
        attributes.update(gen_ai.request_attributes(endpoint, body, shape, hide_inputs))
        counted: dict[str, Any] = {}
        if accumulated is not None and accumulated.streamed is not None:
            response, counted = accumulated.streamed.response(), accumulated.accumulator.token_counts()
        if isinstance(response, dict):
            attributes.update(gen_ai.response_attributes(endpoint, response, shape, hide_outputs))
            attributes.update(gen_ai.counted_usage({**counted, **attributes}))  # a stream's usage: from its ids
        if error:
            attributes.update(gen_ai.error_attributes(_error_type(error)))
        return gen_ai.span_name(endpoint, body.get("model"))


def _error_type(error: str) -> str:
    """A low-cardinality `error.type` for a failed call: the upstream's HTTP status, or what failed."""
    if error.startswith("upstream answered "):
        return error.rsplit(" ", 1)[-1]
    if "timed out" in error:
        return "timeout"
    return "upstream_unavailable" if error.startswith("upstream unavailable") else "upstream_error"
