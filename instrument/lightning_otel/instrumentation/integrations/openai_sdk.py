"""OpenAI SDK: lean spans (the default, openai_lean.py), or OpenInference's OpenAI instrumentor with
vLLM token capture underneath it (`openai_spans="openinference"`, openai_capture.py). Either way
OpenInference keeps the endpoints the lean span does not cover (embeddings, responses, ...).

Private SDK internals used, each checked, with a public fallback (logged once and counted,
sdk_fallbacks.py; docs/agent-side.md): `BaseClient._process_response_data` (where the response JSON
becomes SDK objects) and the HTTP response class's `json()`.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from lightning_otel.instrumentation import sdk_fallbacks
from lightning_otel.instrumentation.integrations._installed import installed
from lightning_otel.instrumentation.options import Options

NAME = "openai"
TRIGGER = "openai"  # turned on when this module is imported (now, if it already is)
_state: dict[str, Any] = {}


def available() -> bool:
    return installed("openai", "openinference.instrumentation.openai")


def _base_client() -> Any:
    """openai's BaseClient, where response JSON becomes SDK objects; None in an SDK without it."""
    try:
        from openai._base_client import BaseClient
    except ImportError:
        return None
    return BaseClient


def enable(tracer_provider: Any, options: Options) -> None:
    import openai
    from openinference.instrumentation.openai import OpenAIInstrumentor

    BaseClient = _base_client()

    instrumentor = OpenAIInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()  # someone instrumented first: our wrapper must go underneath
    if _state:
        return
    _state["sync"], _state["async"] = openai.OpenAI.request, openai.AsyncOpenAI.request
    if options.openai_spans == "lean":
        # OpenInference keeps the endpoints the lean span does not cover (embeddings, responses, ...)
        instrumentor.instrument(tracer_provider=tracer_provider, config=options.trace_config())
        from lightning_otel.instrumentation.integrations.openai_capture import sdk_response_class
        from lightning_otel.instrumentation.integrations.openai_lean import (
            json_wrapper,
            lean_async_wrapper,
            lean_sync_wrapper,
            scanner_built,
            taking_wrapper,
        )

        tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        openai.OpenAI.request = lean_sync_wrapper(_state["sync"], openai.OpenAI.request, tracer, options)
        openai.AsyncOpenAI.request = lean_async_wrapper(_state["async"], openai.AsyncOpenAI.request, tracer, options)
        if not hasattr(BaseClient, "_process_response_data"):
            sdk_fallbacks.missing(
                "openai BaseClient._process_response_data", "token ids are read from the SDK's objects"
            )
            return
        _state["parse"] = BaseClient._process_response_data
        BaseClient._process_response_data = taking_wrapper(_state["parse"])
        response_class = sdk_response_class()
        if response_class is None:
            sdk_fallbacks.missing("openai _base_client.httpx.Response.json", "response bodies are parsed by the SDK")
        elif scanner_built():  # the raw body, before the SDK parses it
            _state["json"] = (response_class, response_class.json)
            response_class.json = json_wrapper(response_class.json)
        return
    from lightning_otel.instrumentation.integrations.openai_capture import capture_async_wrapper, capture_sync_wrapper

    openai.OpenAI.request = capture_sync_wrapper(_state["sync"], options.capture_tokens)
    openai.AsyncOpenAI.request = capture_async_wrapper(_state["async"], options.capture_tokens)
    instrumentor.instrument(tracer_provider=tracer_provider, config=options.trace_config())


def disable() -> None:
    import openai
    from openinference.instrumentation.openai import OpenAIInstrumentor

    if _state:
        openai.OpenAI.request, openai.AsyncOpenAI.request = _state.pop("sync"), _state.pop("async")
        if "parse" in _state:
            from openai._base_client import BaseClient

            BaseClient._process_response_data = _state.pop("parse")
        if "json" in _state:
            response_class, original = _state.pop("json")
            response_class.json = original
    OpenAIInstrumentor().uninstrument()
