"""The official `anthropic` SDK: Messages calls to a vLLM server are served from its chat completions.

vLLM's `/v1/messages` returns no token ids and no logprobs; its chat completions return both exactly.
So `messages.create` (streamed or not), `messages.stream`, `messages.parse` and their async and beta
twins, all of which the SDK sends as `POST /v1/messages` through its client's `request()`, are sent
instead as the equivalent chat completion to `{base_url}/v1/chat/completions` (core.anthropic_messages
translates), asking for token ids and logprobs, and the caller gets real `anthropic` objects back: a
`Message` built from the chat reply, or the SDK's own `Stream` parsing Anthropic's events made from the
chat stream as it is read. One LLM span per call, the chat call's (anthropic_served.ServedCall), in
our conventions and GenAI's when asked.

The SDK's own span (scope `com.anthropic.sdk.python`, metadata only) is made only for requests of its
methods that carry a span name; the chat request sent here carries none, so a served call has exactly
one LLM span, ours. A call to a server that is not vLLM (capture_tokens="auto"), or with
`.with_raw_response` / `.with_streaming_response` (which hand the caller the HTTP response itself),
goes out unchanged and gets only the SDK's span, without ids.

A request that cannot be served from chat completions (an image, a server tool; the message says
which) raises core.anthropic_messages.MessagesRequestError, a ValueError.

Private SDK internals used, each checked (sdk_fallbacks.py; docs/agent-side.md): the client's
`request(cast_to, options, stream=, stream_cls=)` and FinalRequestOptions' fields (url, json_data,
extra_json, headers, post_parser; span_name where the SDK has spans).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from lightning_otel.core import schema
from lightning_otel.core.anthropic_messages import chat_request, message
from lightning_otel.core.vllm_endpoint import CHAT, ENDPOINTS, token_request_fields
from lightning_otel.instrumentation import sdk_fallbacks
from lightning_otel.instrumentation.integrations._installed import installed
from lightning_otel.instrumentation.options import Options

NAME = "anthropic"
TRIGGER = "anthropic"
log = logging.getLogger(__name__)
_state: dict[str, Any] = {}
_MESSAGES_PATH = "/v1/messages"
_CHAT_PATH = "/v1/chat/completions"
_RAW_RESPONSE_HEADER = "x-stainless-raw-response"  # .with_raw_response / .with_streaming_response
_NEEDED_FIELDS = ("url", "json_data", "extra_json", "headers", "post_parser")
_serving: ContextVar[Any] = ContextVar("lightning_otel_anthropic_serving", default=None)


def available() -> bool:
    return installed("anthropic")


def enable(tracer_provider: Any, options: Options) -> None:
    import anthropic
    from anthropic import _models

    if _state:
        return
    fields = getattr(getattr(_models, "FinalRequestOptions", None), "model_fields", {})
    if not all(name in fields for name in _NEEDED_FIELDS):
        sdk_fallbacks.missing("anthropic FinalRequestOptions fields", "Messages calls are recorded by the SDK only")
        return
    tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
    sync_stream, async_stream = _stream_classes(anthropic)
    _state["sync"], _state["async"] = anthropic.Anthropic.request, anthropic.AsyncAnthropic.request
    anthropic.Anthropic.request = _sync_wrapper(_state["sync"], tracer, options, sync_stream)
    anthropic.AsyncAnthropic.request = _async_wrapper(_state["async"], tracer, options, async_stream)


def disable() -> None:
    import anthropic

    if _state:
        anthropic.Anthropic.request, anthropic.AsyncAnthropic.request = _state.pop("sync"), _state.pop("async")


def _stream_classes(anthropic: Any) -> tuple[type, type]:
    """The SDK's Stream and AsyncStream of message events, reading the translated response of the call
    being served (the SDK builds them inside request(), in the caller's context)."""
    from anthropic.types import RawMessageStreamEvent

    from lightning_otel.instrumentation.integrations.anthropic_served import translated_response

    class ServedStream(anthropic.Stream[RawMessageStreamEvent]):
        def __init__(self, *, cast_to: Any, response: Any, client: Any, options: Any = None) -> None:
            request, call = _serving.get()
            super().__init__(
                cast_to=cast_to, response=translated_response(response, request, call), client=client, options=options
            )

    class AsyncServedStream(anthropic.AsyncStream[RawMessageStreamEvent]):
        def __init__(self, *, cast_to: Any, response: Any, client: Any, options: Any = None) -> None:
            request, call = _serving.get()
            super().__init__(
                cast_to=cast_to, response=translated_response(response, request, call), client=client, options=options
            )

    return ServedStream, AsyncServedStream


def _plain(value: Any) -> Any:
    """A request value as JSON would carry it: SDK objects (a previous reply's content blocks, put back
    into the conversation) dumped, iterables listed, the SDK's omitted-argument markers dropped."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not _omitted(v)}
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump(mode="json", exclude_none=True))
    if isinstance(value, (list, tuple)) or hasattr(value, "__iter__"):
        return [_plain(v) for v in value]
    return value


def _omitted(value: Any) -> bool:
    return type(value).__name__ in ("Omit", "NotGiven")


def _root(client: Any) -> str:
    return str(client.base_url).rstrip("/")


def _probe_headers(client: Any) -> dict[str, str]:
    key = getattr(client, "api_key", None) or getattr(client, "auth_token", None)
    return {"Authorization": f"Bearer {key}"} if isinstance(key, str) and key else {}


def _is_messages(options: Any) -> bool:
    return str(getattr(options, "url", "")).split("?", 1)[0].rstrip("/") == _MESSAGES_PATH


def _served_here(client: Any, options: Any, capture: str) -> str | None:
    """The OpenAI-style base URL ({root}/v1) of a Messages call to serve from chat completions, else None."""
    if capture == "off" or not is_instrumentation_enabled():
        return None
    if not _is_messages(options):
        return None
    if (
        not isinstance(getattr(options, "json_data", None), dict)
        or str(getattr(options, "method", "")).lower() != "post"
    ):
        return None
    headers = options.headers if isinstance(options.headers, dict) else {}
    if any(str(k).lower() == _RAW_RESPONSE_HEADER for k in headers):
        return None
    base_url = _root(client) + "/v1"
    if (
        capture == "auto"
        and not (ENDPOINTS.cached(base_url) or ENDPOINTS.info(base_url, _probe_headers(client))).is_vllm
    ):
        return None
    return base_url


def _prepare(client: Any, options: Any, tracer: trace.Tracer, chosen: Options, base_url: str):
    """(the Messages request, the chat options to send, the call's span)."""
    from lightning_otel.instrumentation.integrations.anthropic_served import ServedCall

    request = _plain(options.json_data)
    if isinstance(options.extra_json, dict):
        request.update(_plain(options.extra_json))
    chat = chat_request(request)  # MessagesRequestError: what cannot be served, said before anything is sent
    chat.update(token_request_fields(CHAT, chat))
    headers = dict(options.headers) if isinstance(options.headers, dict) else {}
    headers.update(_probe_headers(client))  # vLLM's --api-key reads a bearer token
    update = {"url": _CHAT_PATH, "json_data": chat, "extra_json": None, "headers": headers}
    if "span_name" in type(options).model_fields:
        update["span_name"] = None  # no SDK span for the chat request: ours is the call's one LLM span
    chat_options = options.model_copy(update=update)
    url = client.base_url
    server = {schema.SERVER_ADDRESS: str(url.host), schema.SERVER_PORT: url.port or 80} if url.host else {}
    return request, chat_options, ServedCall(tracer, chat, chosen, base_url, server)


def _reply(request: dict, data: Any, cast_to: Any, options: Any) -> Any:
    """What the SDK would have returned for the Messages reply made from the chat reply `data`."""
    reply = message(data, request)
    built = cast_to.model_validate(reply) if hasattr(cast_to, "model_validate") else reply
    parser = getattr(options, "post_parser", None)
    return parser(built) if callable(parser) else built


def _sync_wrapper(original, tracer: trace.Tracer, chosen: Options, stream_class: type):
    def request(self, cast_to, options, *args, **kwargs):
        base_url = _served_here(self, options, chosen.capture_tokens)
        if base_url is None:
            return original(self, cast_to, options, *args, **kwargs)
        stream = bool(kwargs.get("stream", args[0] if args else False))
        messages_request, chat_options, call = _prepare(self, options, tracer, chosen, base_url)
        with call:
            if stream:
                token = _serving.set((messages_request, call))
                try:
                    return original(self, object, chat_options, stream=True, stream_cls=stream_class)
                finally:
                    _serving.reset(token)
            data = original(self, object, chat_options, stream=False)
            call.done(data if isinstance(data, dict) else None, True)
        return _reply(messages_request, data, cast_to, options)

    return functools.update_wrapper(request, original, assigned=(), updated=())  # __wrapped__ only


def _async_wrapper(original, tracer: trace.Tracer, chosen: Options, stream_class: type):
    async def request(self, cast_to, options, *args, **kwargs):
        if _is_messages(options) and chosen.capture_tokens == "auto" and ENDPOINTS.cached(_root(self) + "/v1") is None:
            await asyncio.to_thread(ENDPOINTS.info, _root(self) + "/v1", _probe_headers(self))  # not on the loop
        base_url = _served_here(self, options, chosen.capture_tokens)
        if base_url is None:
            return await original(self, cast_to, options, *args, **kwargs)
        stream = bool(kwargs.get("stream", args[0] if args else False))
        messages_request, chat_options, call = _prepare(self, options, tracer, chosen, base_url)
        with call:
            if stream:
                token = _serving.set((messages_request, call))
                try:
                    return await original(self, object, chat_options, stream=True, stream_cls=stream_class)
                finally:
                    _serving.reset(token)
            data = await original(self, object, chat_options, stream=False)
            call.done(data if isinstance(data, dict) else None, True)
        return _reply(messages_request, data, cast_to, options)

    return functools.update_wrapper(request, original, assigned=(), updated=())  # __wrapped__ only
