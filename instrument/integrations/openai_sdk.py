"""OpenAI SDK: OpenInference's OpenAI instrumentor plus vLLM token capture.

OpenInference wraps `OpenAI.request` and makes the LLM span current while the original method
runs. We wrap the same method *first*, so our wrapper sits inside that span: it adds
`return_token_ids` and logprobs to requests bound for vLLM and writes the returned token ids and
logprobs (and the serving weight version) onto the still-open OpenInference span. Streams are
captured chunk by chunk: we swap the stream's iterator for one that feeds an accumulator, so the
object OpenInference sees is still an `openai.Stream` and its span ends after ours recorded.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

from lightning_otel.instrument import schema
from lightning_otel.instrument.integrations._installed import installed
from lightning_otel.instrument.options import Options
from lightning_otel.instrument.vllm_endpoint import ENDPOINTS, StreamAccumulator, endpoint_kind, token_attributes, token_request_fields

log = logging.getLogger(__name__)
NAME = "openai"
TRIGGER = "openai"  # turned on when this module is imported (now, if it already is)
_state: dict[str, Any] = {}


def available() -> bool:
    return installed("openai", "openinference.instrumentation.openai")


def _client_headers(client: Any) -> dict[str, str]:
    try:
        return {k: v for k, v in dict(client.default_headers).items() if isinstance(v, str)}
    except Exception:  # noqa: BLE001 - headers are a courtesy for authenticated servers
        return {}


def _prepare(client: Any, args: tuple, capture: str) -> tuple[tuple, str | None, str | None]:
    """(args with token fields added, endpoint kind or None to skip capture, base URL)."""
    if capture == "off" or len(args) < 2:
        return args, None, None
    options = args[1]
    kind = endpoint_kind(str(getattr(options, "url", "")))
    body = getattr(options, "json_data", None)
    if kind is None or not isinstance(body, dict):
        return args, None, None
    base_url = str(client.base_url)
    if capture == "auto" and not ENDPOINTS.info(base_url, _client_headers(client)).is_vllm:
        return args, None, None
    extra = dict(options.extra_json or {})
    extra.update(token_request_fields(kind, {**body, **extra}))
    return (args[0], options.model_copy(update={"extra_json": extra}), *args[2:]), kind, base_url


def _stamp(span: trace.Span, attributes: dict, base_url: str) -> None:
    version = ENDPOINTS.weight_version(base_url)
    if version is not None:
        attributes[schema.POLICY_VERSION] = version
    if attributes and span.is_recording():
        span.set_attributes(attributes)


def _record(response: Any, kind: str, base_url: str, span: trace.Span) -> Any:
    """Record tokens of a plain response now, or of a stream as it is consumed."""
    parsed = response
    if hasattr(response, "parse") and callable(response.parse):  # .with_raw_response
        try:
            parsed = response.parse()
        except Exception:  # noqa: BLE001 - the caller gets the response either way
            return response
    iterator = getattr(parsed, "_iterator", None)
    if iterator is None:
        _stamp(span, token_attributes(kind, parsed), base_url)
        return response
    accumulator = StreamAccumulator(kind)
    if hasattr(iterator, "__anext__"):

        async def capturing_async():
            async for chunk in iterator:
                accumulator.add(chunk)
                yield chunk
            _stamp(span, accumulator.attributes(), base_url)

        parsed._iterator = capturing_async()
    else:

        def capturing():
            for chunk in iterator:
                accumulator.add(chunk)
                yield chunk
            _stamp(span, accumulator.attributes(), base_url)

        parsed._iterator = capturing()
    return response


def _sync_wrapper(original, capture: str):
    def request(self, *args, **kwargs):
        args, kind, base_url = _prepare(self, args, capture)
        response = original(self, *args, **kwargs)
        return _record(response, kind, base_url, trace.get_current_span()) if kind else response

    request.__wrapped__ = original
    return request


def _async_wrapper(original, capture: str):
    async def request(self, *args, **kwargs):
        args, kind, base_url = _prepare(self, args, capture)
        response = await original(self, *args, **kwargs)
        return _record(response, kind, base_url, trace.get_current_span()) if kind else response

    request.__wrapped__ = original
    return request


def enable(tracer_provider: Any, options: Options) -> None:
    import openai
    from openinference.instrumentation.openai import OpenAIInstrumentor

    instrumentor = OpenAIInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()  # someone instrumented first: our wrapper must go underneath
    if not _state:
        _state["sync"], _state["async"] = openai.OpenAI.request, openai.AsyncOpenAI.request
        openai.OpenAI.request = _sync_wrapper(_state["sync"], options.capture_tokens)
        openai.AsyncOpenAI.request = _async_wrapper(_state["async"], options.capture_tokens)
    instrumentor.instrument(tracer_provider=tracer_provider, config=options.trace_config())


def disable() -> None:
    import openai
    from openinference.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().uninstrument()
    if _state:
        openai.OpenAI.request, openai.AsyncOpenAI.request = _state.pop("sync"), _state.pop("async")
