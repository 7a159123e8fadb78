"""What the OpenAI SDK integration's two span kinds share: asking vLLM for token ids, watching a
response or stream to its end, and stamping what it returned on a span. Here too, OpenInference's
span with token capture (`openai_spans="openinference"`): our wrapper sits under OpenInference's,
so the LLM span is current while the original method runs and we write token ids, logprobs and the
serving weight version onto it. Streams are captured chunk by chunk: the stream's iterator is
swapped for one that feeds an accumulator, so the object OpenInference sees is still an
`openai.Stream` and its span ends after ours recorded.

Imported only once the SDK is (openai_sdk.enable()).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

import openai
from opentelemetry import trace

from lightning_otel.core import schema
from lightning_otel.core.vllm_endpoint import (
    ENDPOINTS,
    StreamAccumulator,
    endpoint_kind,
    token_attributes,
    token_request_fields,
)
from lightning_otel.instrumentation import sdk_fallbacks

log = logging.getLogger(__name__)
_parsed_types: tuple[type, ...] = (openai.BaseModel,)  # a whole, parsed response


def client_headers(client: Any) -> dict[str, str]:
    try:
        return {k: v for k, v in dict(client.default_headers).items() if isinstance(v, str)}
    except Exception:
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
    fields = token_fields(client, options, kind, body, capture)
    if fields is None:
        return args, None, None
    extra, base_url = fields
    return (args[0], options.model_copy(update={"extra_json": extra}), *args[2:]), kind, base_url


def token_fields(client: Any, options: Any, kind: str, body: dict, capture: str) -> tuple[dict, str] | None:
    """(the request's extra JSON with vLLM's token fields added, the base URL), or None when tokens
    are not captured for this server."""
    if capture == "off":
        return None
    base_url = _url_text(_base_url(client))
    if (
        capture == "auto"
        and not (ENDPOINTS.cached(base_url) or ENDPOINTS.info(base_url, client_headers(client))).is_vllm
    ):
        return None
    extra = dict(options.extra_json or {})
    extra.update(token_request_fields(kind, extra if "logprobs" in extra else body))  # what the request will say
    return extra, base_url


async def probe_off_loop(client: Any, capture: str) -> None:
    """Ask a server not seen yet whether it is vLLM in a worker thread, so that the first call to it
    from an async agent does not hold the event loop (every later call finds the answer cached)."""
    if capture == "auto":
        base_url = _url_text(_base_url(client))
        if ENDPOINTS.cached(base_url) is None:
            await asyncio.to_thread(ENDPOINTS.info, base_url, client_headers(client))


def _base_url(client: Any) -> Any:
    """client.base_url: the SDK's own attribute behind it when there is one (the property runs an
    import statement per read in openai 2.x, ~1 us on every call)."""
    url = getattr(client, "__dict__", NO_FIELDS).get("_base_url")
    return url if url is not None else client.base_url


NO_FIELDS: dict = {}
_url_texts: dict[int, tuple[Any, str]] = {}


def _url_text(url: Any) -> str:
    """str() of a client's base URL (an httpx.URL, rebuilt on every str()), once per URL object."""
    known = _url_texts.get(id(url))
    if known is not None and known[0] is url:
        return known[1]
    if len(_url_texts) > 256:
        _url_texts.clear()
    text = str(url)
    _url_texts[id(url)] = (url, text)
    return text


_servers: dict[int, tuple[Any, dict[str, Any]]] = {}


def server_attributes(client: Any) -> dict[str, Any]:
    """`server.address` and `server.port` of the server a client calls (its base URL's host and port, the
    scheme's default port when none is given), once per URL object."""
    url = _base_url(client)
    known = _servers.get(id(url))
    if known is not None and known[0] is url:
        return known[1]
    if len(_servers) > 256:
        _servers.clear()
    host, port = getattr(url, "host", None), getattr(url, "port", None)
    attributes: dict[str, Any] = {}
    if host:
        attributes[schema.SERVER_ADDRESS] = str(host)
        attributes[schema.SERVER_PORT] = port or (443 if getattr(url, "scheme", "") == "https" else 80)
    _servers[id(url)] = (url, attributes)
    return attributes


def stamp(span: trace.Span, attributes: dict, base_url: str | None) -> None:
    version = ENDPOINTS.weight_version(base_url) if base_url else None
    if version is not None:
        attributes[schema.POLICY_VERSION] = version
    if attributes and span.is_recording():
        span.set_attributes(attributes)


def safely(fn: Callable, *args: Any) -> None:
    """Recording must never break the caller's call or stream: log instead."""
    try:
        fn(*args)
    except Exception:
        log.exception("lightning_otel: could not record an OpenAI call")


def watch(response: Any, on_chunk: Callable[[Any], None], on_done: Callable[[Any, bool], None]) -> Any:
    """Call on_done(parsed, True) for a plain response now. For a stream, swap its iterator for one
    that feeds each chunk to on_chunk as the caller consumes it and calls on_done(None, completed)
    when it ends (completed: it ran to its end rather than being closed early), or when the stream
    object is dropped unread. The object the caller (and OpenInference) sees is still the SDK's own
    Stream. Errors in on_chunk/on_done are logged, never raised into the caller."""
    if isinstance(response, _parsed_types):  # the common case, decided without pydantic's failing getattr
        safely(on_done, response, True)
        return response
    parsed = response
    if hasattr(response, "parse") and callable(response.parse):  # .with_raw_response
        try:
            parsed = response.parse()  # cached by the SDK: the caller's parse() gets this object
        except Exception:
            safely(on_done, None, False)
            return response
    iterator = getattr(parsed, "_iterator", None)
    if iterator is None:
        if isinstance(parsed, (openai.Stream, openai.AsyncStream)):  # an SDK whose streams lack _iterator
            sdk_fallbacks.missing("openai Stream._iterator", "streamed calls are recorded without token ids")
            safely(on_done, None, False)
        else:
            safely(on_done, parsed, True)
        return response
    if hasattr(iterator, "__anext__"):

        async def watching_async():
            completed = False
            try:
                async for chunk in iterator:
                    safely(on_chunk, chunk)
                    yield chunk
                completed = True
            finally:
                safely(on_done, None, completed)

        parsed._iterator = watching_async()
    else:

        def watching():
            completed = False
            try:
                for chunk in iterator:
                    safely(on_chunk, chunk)
                    yield chunk
                completed = True
            finally:
                safely(on_done, None, completed)

        parsed._iterator = watching()
    weakref.finalize(parsed, safely, on_done, None, False)  # never read: a generator not started has no finally
    return response


def _record(response: Any, kind: str, base_url: str, span: trace.Span) -> Any:
    """Token capture onto OpenInference's span: of a plain response now, of a stream as it is consumed."""
    accumulator = StreamAccumulator(kind)

    def done(parsed: Any, completed: bool) -> None:
        if parsed is not None:
            stamp(span, token_attributes(kind, parsed), base_url)
        elif completed:
            stamp(span, accumulator.attributes(), base_url)

    return watch(response, accumulator.add, done)


def capture_sync_wrapper(original, capture: str):
    def request(self, *args, **kwargs):
        args, kind, base_url = _prepare(self, args, capture)
        response = original(self, *args, **kwargs)
        return _record(response, kind, base_url, trace.get_current_span()) if kind else response

    return functools.update_wrapper(request, original, assigned=(), updated=())  # __wrapped__ only


def capture_async_wrapper(original, capture: str):
    async def request(self, *args, **kwargs):
        await probe_off_loop(self, capture)
        args, kind, base_url = _prepare(self, args, capture)
        response = await original(self, *args, **kwargs)
        return _record(response, kind, base_url, trace.get_current_span()) if kind else response

    return functools.update_wrapper(request, original, assigned=(), updated=())  # __wrapped__ only


def sdk_response_class() -> Any:
    """The HTTP response class whose json() the SDK calls (httpx's, or httpx2's in newer SDKs)."""
    from openai import _base_client

    module = getattr(_base_client, "httpx2", None) or getattr(_base_client, "httpx", None)
    response_class = getattr(module, "Response", None)
    return (
        response_class if isinstance(response_class, type) and callable(getattr(response_class, "json", None)) else None
    )
