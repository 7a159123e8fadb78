"""The OpenAI SDK's Responses API (`client.responses.create`, `.stream`, `.parse`; sync and async),
made trainable: a Responses call to a server whose tokens are captured (vLLM) is served from the same
client's chat completions, which the OpenAI integration records with exact prompt ids, completion ids
and logprobs (vLLM's own /v1/responses cannot return them for tool-call turns; core.responses_api).

It sits on top of the SDK's `request()` (over the lean or OpenInference wrappers, so the Responses
call itself gets no second span): the request is translated to a chat request, sent with
`client.chat.completions.create` (one LLM span, as any chat call), and its reply (or stream) is
translated back into the Responses API's JSON (or events) in an HTTP response that the SDK then
processes as if the server had sent it: the caller gets a real `Response`, `ResponseStream`,
`ParsedResponse` or raw response, whatever it asked for. A request that cannot be served statelessly
(`previous_response_id`, `conversation`, ...) raises openai.BadRequestError saying what to send
instead. Calls to other servers (OpenAI's own) go through untouched.

Private SDK internals used (checked at enable(); without them Responses calls are left alone, logged
once, sdk_fallbacks.py): the clients' `_build_request`, `_process_response` and
`_make_status_error_from_response`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from lightning_otel.core.responses_api import ResponsesRequestError, chat_request, response_object
from lightning_otel.core.responses_stream import ResponsesStream, sse
from lightning_otel.core.vllm_endpoint import CHAT
from lightning_otel.instrumentation import sdk_fallbacks
from lightning_otel.instrumentation.integrations._installed import installed
from lightning_otel.instrumentation.options import Options

log = logging.getLogger(__name__)
NAME = "openai-responses"
TRIGGER = "openai"
_state: dict[str, Any] = {}
_NEEDED = ("_build_request", "_process_response", "_make_status_error_from_response")


def available() -> bool:
    return installed("openai")


def enable(tracer_provider: Any, options: Options) -> None:
    import openai

    if _state or options.capture_tokens == "off":
        return
    missing = [
        f"{c.__name__}.{name}" for c in (openai.OpenAI, openai.AsyncOpenAI) for name in _NEEDED if not hasattr(c, name)
    ]
    if missing:
        sdk_fallbacks.missing(f"openai {missing[0]}", "Responses API calls are not captured with token ids")
        return
    from lightning_otel.instrumentation.integrations.openai_capture import sdk_response_class

    response_class = sdk_response_class()
    if response_class is None:
        sdk_fallbacks.missing(
            "openai _base_client.httpx.Response", "Responses API calls are not captured with token ids"
        )
        return
    _state["sync"], _state["async"] = openai.OpenAI.request, openai.AsyncOpenAI.request
    openai.OpenAI.request = _sync_wrapper(_state["sync"], response_class, options.capture_tokens)
    openai.AsyncOpenAI.request = _async_wrapper(_state["async"], response_class, options.capture_tokens)


def disable() -> None:
    import openai

    if _state:
        openai.OpenAI.request, openai.AsyncOpenAI.request = _state.pop("sync"), _state.pop("async")


def _responses_body(options: Any) -> dict | None:
    """The Responses request body of a `POST /responses`, else None."""
    if str(getattr(options, "method", "")).lower() != "post" or str(getattr(options, "url", "")) != "/responses":
        return None
    body = getattr(options, "json_data", None)
    if not isinstance(body, dict):
        return None
    return {**body, **(getattr(options, "extra_json", None) or {})}


def _captured(client: Any, options: Any, body: dict, capture: str) -> bool:
    """Whether this client's chat calls get token ids (a vLLM server, or capture forced on)."""
    from lightning_otel.instrumentation.integrations.openai_capture import token_fields

    try:
        return token_fields(client, options, CHAT, body, capture) is not None
    except Exception:
        log.exception("lightning_otel: could not tell whether a Responses call's server is vLLM")
        return False


@functools.cache
def _create_parameters(create: Any) -> frozenset[str]:
    return frozenset(inspect.signature(create).parameters)


def _chat_kwargs(create: Any, chat: dict, options: Any) -> dict[str, Any]:
    """`chat.completions.create` arguments for the chat request `chat`: what create() names as
    arguments (so the chat span records them as a chat call's), the rest (vLLM's) as extra_body."""
    names = _create_parameters(getattr(create, "__func__", create))
    kwargs = {k: v for k, v in chat.items() if k in names and k not in ("extra_body", "extra_headers", "timeout")}
    extra = {k: v for k, v in chat.items() if k not in kwargs}
    if extra:
        kwargs["extra_body"] = extra
    headers = getattr(options, "headers", None)
    if headers:  # the caller's; not the SDK's own (a raw-response flag is for the Responses call's answer)
        kwargs["extra_headers"] = {k: v for k, v in headers.items() if not k.lower().startswith("x-stainless")}
    if isinstance(getattr(options, "timeout", None), (int, float)):
        kwargs["timeout"] = options.timeout
    return kwargs


def _refusal(client: Any, options: Any, response_class: type, exc: ResponsesRequestError) -> Exception:
    """openai.BadRequestError for a request that cannot be served from chat completions."""
    response = response_class(400, json=exc.body(), request=client._build_request(options))
    return client._make_status_error_from_response(response)


def _sync_wrapper(original, response_class: type, capture: str):
    def request(self, cast_to, options, *args, **kwargs):
        body = _responses_body(options)
        if body is None or not _captured(self, options, body, capture):
            return original(self, cast_to, options, *args, **kwargs)
        try:
            chat = chat_request(body)
        except ResponsesRequestError as exc:
            raise _refusal(self, options, response_class, exc) from None
        chat_kwargs = _chat_kwargs(self.chat.completions.create, chat, options)
        raw = self.chat.completions.with_raw_response.create(**chat_kwargs)
        answer = _answer(self, options, response_class, raw, chat, body, _events)
        return self._process_response(
            cast_to=cast_to,
            options=options,
            response=answer,
            stream=kwargs.get("stream", False),
            stream_cls=kwargs.get("stream_cls"),
        )

    return functools.update_wrapper(request, original, assigned=(), updated=())  # __wrapped__ only


def _async_wrapper(original, response_class: type, capture: str):
    from lightning_otel.instrumentation.integrations.openai_capture import probe_off_loop

    async def request(self, cast_to, options, *args, **kwargs):
        body = _responses_body(options)
        if body is not None:
            await probe_off_loop(self, capture)  # a server's first call: not on the loop
        if body is None or not _captured(self, options, body, capture):
            return await original(self, cast_to, options, *args, **kwargs)
        try:
            chat = chat_request(body)
        except ResponsesRequestError as exc:
            raise _refusal(self, options, response_class, exc) from None
        chat_kwargs = _chat_kwargs(self.chat.completions.create, chat, options)
        raw = await self.chat.completions.with_raw_response.create(**chat_kwargs)
        answer = _answer(self, options, response_class, raw, chat, body, _async_events)
        return await self._process_response(
            cast_to=cast_to,
            options=options,
            response=answer,
            stream=kwargs.get("stream", False),
            stream_cls=kwargs.get("stream_cls"),
        )

    return functools.update_wrapper(request, original, assigned=(), updated=())  # __wrapped__ only


_SSE = {"content-type": "text/event-stream"}
# Headers that describe the chat answer's body, not the server's reply; the Responses answer has its own.
_BODY_HEADERS = frozenset({"content-length", "content-type", "content-encoding", "transfer-encoding", "connection"})


def _answer(client: Any, options: Any, response_class: type, raw: Any, chat: dict, body: dict, events: Any) -> Any:
    """The HTTP response the SDK then processes as the Responses call's own: the chat reply in `raw`
    translated (its stream through `events`, as the caller reads it), with the server's headers."""
    reply, headers, request = raw.parse(), _carried_headers(raw), client._build_request(options)
    if chat.get("stream"):
        return response_class(200, headers={**headers, **_SSE}, content=events(reply, body), request=request)
    return response_class(200, headers=headers, json=response_object(reply.to_dict(), body), request=request)


def _carried_headers(raw: Any) -> dict[str, str]:
    """The chat answer's headers that the Responses answer carries as its own: what the server said
    of the call (a gateway's policy version, request ids, rate limits) reaches `with_raw_response`."""
    return {k: v for k, v in raw.headers.items() if k.lower() not in _BODY_HEADERS}


def _events(chat_stream: Any, body: dict):
    """The Responses events (SSE bytes) of a chat stream, read as the caller reads them: the chat
    span ends with the stream, with its ids; closing early closes the chat stream."""
    import openai

    stream = ResponsesStream(body)
    yield b"".join(map(sse, stream.start()))
    try:
        for chunk in chat_stream:
            events = stream.feed(chunk.to_dict())
            if events:
                yield b"".join(map(sse, events))
        done = stream.finish()
    except openai.APIError as exc:
        done = stream.fail(str(exc))
    finally:
        chat_stream.close()
    yield b"".join(map(sse, done))


async def _async_events(chat_stream: Any, body: dict):
    import openai

    stream = ResponsesStream(body)
    yield b"".join(map(sse, stream.start()))
    try:
        async for chunk in chat_stream:
            events = stream.feed(chunk.to_dict())
            if events:
                yield b"".join(map(sse, events))
        done = stream.finish()
    except openai.APIError as exc:
        done = stream.fail(str(exc))
    finally:
        await chat_stream.close()
    yield b"".join(map(sse, done))
