"""OpenAI SDK integration: OpenInference's OpenAI instrumentor plus vLLM token capture.

OpenInference wraps `OpenAI.request` and makes the LLM span current while the original method
runs. We wrap the same method *first*, so our wrapper sits inside that span: it adds
`return_token_ids` and logprobs to requests bound for vLLM, and writes the returned token ids
and logprobs onto the (still open) OpenInference span. One span per call, no copies.

Streaming requests pass through without token capture for now (see docs/span-schema.md).
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

from lightning_otel.instrument import schema
from lightning_otel.instrument.vllm_endpoint import ENDPOINTS, endpoint_kind, token_attributes, token_request_fields

log = logging.getLogger(__name__)
NAME = "openai"

_originals: dict[str, Any] = {}


def available() -> bool:
    try:
        import openai  # noqa: F401
        from openinference.instrumentation.openai import OpenAIInstrumentor  # noqa: F401
    except ImportError:
        return False
    return True


def _client_headers(client: Any) -> dict[str, str]:
    headers = {}
    try:
        headers.update({k: v for k, v in dict(client.default_headers).items() if isinstance(v, str)})
    except Exception:  # noqa: BLE001 - headers are a courtesy for authenticated servers
        pass
    return headers


def _prepare(client: Any, args: tuple, kwargs: dict, capture: str) -> tuple[tuple, dict, str | None, str | None]:
    """Returns (args, kwargs, endpoint kind, weight version); kind None means: do not capture."""
    if capture == "off" or kwargs.get("stream") or len(args) < 2:
        return args, kwargs, None, None
    options = args[1]
    kind = endpoint_kind(str(getattr(options, "url", "")))
    body = getattr(options, "json_data", None)
    if kind is None or not isinstance(body, dict):
        return args, kwargs, None, None
    base_url, headers = str(client.base_url), _client_headers(client)
    if capture == "auto" and not ENDPOINTS.info(base_url, headers).is_vllm:
        return args, kwargs, None, None
    extra = {**(options.extra_json or {}), **token_request_fields(kind, {**body, **(options.extra_json or {})})}
    options = options.model_copy(update={"extra_json": extra})
    version = ENDPOINTS.weight_version(base_url, headers)
    return (args[0], options, *args[2:]), kwargs, kind, version


def _record(response: Any, kind: str, version: str | None) -> None:
    span = trace.get_current_span()
    if not span.is_recording():
        return
    parsed = response
    if hasattr(response, "parse") and callable(response.parse):  # .with_raw_response
        try:
            parsed = response.parse()
        except Exception:  # noqa: BLE001 - the caller gets the response either way
            return
    attributes = token_attributes(kind, parsed)
    if version is not None:
        attributes[schema.POLICY_VERSION] = version
    if attributes:
        span.set_attributes(attributes)


def _make_sync_wrapper(original, capture: str):
    def request(self, *args, **kwargs):
        args, kwargs, kind, version = _prepare(self, args, kwargs, capture)
        response = original(self, *args, **kwargs)
        if kind is not None:
            _record(response, kind, version)
        return response

    request.__wrapped__ = original
    return request


def _make_async_wrapper(original, capture: str):
    async def request(self, *args, **kwargs):
        args, kwargs, kind, version = _prepare(self, args, kwargs, capture)
        response = await original(self, *args, **kwargs)
        if kind is not None:
            _record(response, kind, version)
        return response

    request.__wrapped__ = original
    return request


def enable(tracer_provider: Any, capture_tokens: str) -> None:
    import openai
    from openinference.instrumentation.openai import OpenAIInstrumentor

    instrumentor = OpenAIInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        # Someone instrumented first: take it off so our wrapper can go underneath its span.
        instrumentor.uninstrument()
    if not _originals:
        _originals["sync"], _originals["async"] = openai.OpenAI.request, openai.AsyncOpenAI.request
        openai.OpenAI.request = _make_sync_wrapper(_originals["sync"], capture_tokens)
        openai.AsyncOpenAI.request = _make_async_wrapper(_originals["async"], capture_tokens)
    instrumentor.instrument(tracer_provider=tracer_provider)


def disable() -> None:
    import openai
    from openinference.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().uninstrument()
    if _originals:
        openai.OpenAI.request, openai.AsyncOpenAI.request = _originals.pop("sync"), _originals.pop("async")
