"""LiteLLM: OpenInference's LiteLLM instrumentor, plus vLLM token capture.

LiteLLM talks to vLLM with its own HTTP client, not the OpenAI SDK, so capture happens here:
`litellm.completion` / `acompletion` are wrapped before OpenInference wraps them (ours runs inside
its LLM span); for `hosted_vllm/...` models, or an `api_base` that answers as vLLM, the request asks
for token ids and logprobs (LiteLLM passes vLLM's fields through to its response), and they are
written on the span.

Streams: LiteLLM's parsed chunks keep each choice's token ids and logprobs but drop the prompt ids
vLLM sends at the top of its first chunk, so the raw chunks are read instead, where LiteLLM parses
them (its stream iterator's `chunk_parser`, wrapped on that one stream), and the token attributes
are written on OpenInference's span, still open, when choice 0 finishes. A LiteLLM whose stream has
no such parser records the stream without token ids (logged once).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from opentelemetry import trace

from lightning_otel.core import schema
from lightning_otel.core.vllm_endpoint import CHAT, ENDPOINTS, StreamAccumulator, token_attributes, token_request_fields
from lightning_otel.instrumentation.integrations._installed import installed
from lightning_otel.instrumentation.options import Options

log = logging.getLogger(__name__)
NAME = "litellm"
TRIGGER = "litellm"  # turned on when this module is imported (now, if it already is)
_originals: dict[str, Any] = {}


def available() -> bool:
    return installed("litellm", "openinference.instrumentation.litellm")


def _targets_vllm(kwargs: dict, capture: str) -> bool:
    if capture == "off":
        return False
    base = kwargs.get("api_base") or kwargs.get("base_url")
    is_vllm = bool(base) and ENDPOINTS.info(str(base), {}).is_vllm  # also starts weight-version polling
    return is_vllm or capture == "always" or str(kwargs.get("model", "")).startswith("hosted_vllm/")


def _prepare(kwargs: dict) -> dict:
    extra = dict(kwargs.get("extra_body") or {})
    fields = token_request_fields(CHAT, {**kwargs, **extra})
    if fields.pop("logprobs", None) and not kwargs.get("logprobs"):
        kwargs = {**kwargs, "logprobs": True}
    return {**kwargs, "extra_body": {**extra, **fields}}


def _stamp(span: trace.Span, attributes: dict, kwargs: dict) -> None:
    base = kwargs.get("api_base") or kwargs.get("base_url")
    version = ENDPOINTS.weight_version(str(base)) if base else None
    if version is not None:
        attributes[schema.POLICY_VERSION] = version
    span.set_attributes(attributes)


def _record(response: Any, kwargs: dict) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        _stamp(span, token_attributes(CHAT, response), kwargs)


def _record_stream(stream: Any, kwargs: dict) -> None:
    """Feed this stream's raw vLLM chunks to an accumulator as LiteLLM parses them; stamp the span
    (the current one: OpenInference's, which ends only after the stream does) when choice 0 finishes."""
    global _warned
    span = trace.get_current_span()
    raw = getattr(stream, "completion_stream", None)
    parse = getattr(raw, "chunk_parser", None)
    if not span.is_recording():
        return
    if parse is None or raw is None:
        if not _warned:
            _warned = True
            log.warning(
                "lightning_otel: this LiteLLM's streams have no chunk_parser; streamed calls are recorded without token ids"
            )
        return
    accumulator = StreamAccumulator(CHAT)
    finished = False

    def chunk_parser(*args: Any, **parser_kwargs: Any) -> Any:
        nonlocal finished
        chunk = parser_kwargs.get("chunk", args[0] if args else None)
        if isinstance(chunk, dict) and not finished:
            try:
                accumulator.add(chunk)
                if accumulator.finish_reason is not None:
                    finished = True
                    _stamp(span, accumulator.attributes(), kwargs)
            except Exception:
                log.exception("lightning_otel: could not record a LiteLLM stream")
        return parse(*args, **parser_kwargs)

    raw.chunk_parser = chunk_parser


_warned = False  # the warning about a stream without chunk_parser, once per process


def enable(tracer_provider: Any, options: Options) -> None:
    import litellm
    from openinference.instrumentation.litellm import LiteLLMInstrumentor

    instrumentor = LiteLLMInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()  # ours must go underneath its span
    if not _originals:
        _originals["completion"], _originals["acompletion"] = litellm.completion, litellm.acompletion
        capture = options.capture_tokens

        @functools.wraps(_originals["completion"])
        def completion(*args, **kwargs):
            if not _targets_vllm(kwargs, capture):
                return _originals["completion"](*args, **kwargs)
            kwargs = _prepare(kwargs)
            response = _originals["completion"](*args, **kwargs)
            (_record_stream if kwargs.get("stream") else _record)(response, kwargs)
            return response

        @functools.wraps(_originals["acompletion"])
        async def acompletion(*args, **kwargs):
            if not _targets_vllm(kwargs, capture):
                return await _originals["acompletion"](*args, **kwargs)
            kwargs = _prepare(kwargs)
            response = await _originals["acompletion"](*args, **kwargs)
            (_record_stream if kwargs.get("stream") else _record)(response, kwargs)
            return response

        litellm.completion, litellm.acompletion = completion, acompletion
    instrumentor.instrument(tracer_provider=tracer_provider, config=options.trace_config())
