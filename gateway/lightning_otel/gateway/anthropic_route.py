"""`POST /v1/messages` (the Anthropic Messages API) through the gateway, served from the upstream's
chat completions: vLLM's own /v1/messages returns no token ids or logprobs, its chat completions
return both exactly. The request is translated (core.anthropic_messages), sent as a chat call down
the gateway's one path (replica choice, retries, swaps, LoRA names, Idempotency-Key), recorded as
the very span a chat call records, and its answer translated back: a Message, or Anthropic's
server-sent events as the chat stream arrives (core.anthropic_stream). Errors are in Anthropic's
shape, `{"type": "error", "error": {"type", "message"}}`.

Anthropic clients send `x-api-key` and `anthropic-version`; neither goes upstream (the gateway sends
its own --upstream-api-key), and a gateway with --token reads it from `Authorization: Bearer`
(Claude Code: ANTHROPIC_AUTH_TOKEN).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aiohttp import web
from opentelemetry.propagate import extract

from lightning_otel.core.anthropic_messages import (
    MessagesRequestError,
    chat_request,
    error_body,
    error_from_chat,
    message,
)
from lightning_otel.core.anthropic_stream import MessagesStream
from lightning_otel.core.vllm_endpoint import CHAT, token_request_fields
from lightning_otel.gateway.idempotency import body_digest
from lightning_otel.gateway.spans import Call

if TYPE_CHECKING:
    from lightning_otel.gateway.server import Gateway

CHAT_PATH = "/v1/chat/completions"


def refused(status: int, text: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response(error_body(text, kind), status=status)


def handler(gateway: Gateway):
    """The aiohttp handler of /v1/messages (under every rollout prefix) for `gateway`."""

    async def messages(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
            chat = chat_request(body)
        except MessagesRequestError as exc:
            return refused(400, str(exc))
        except ValueError:
            return refused(400, "request body is not JSON")
        try:
            rollout = gateway.rollout_identity(request)
        except web.HTTPBadRequest as exc:
            return refused(400, exc.text or "bad rollout")
        adapter = await gateway.adapter_for(chat["model"])
        chat.update(token_request_fields(CHAT, chat))
        if adapter is not None:  # LoRA: the logical model name goes to the current adapter
            chat["model"] = adapter[0]
        call = Call(kind=CHAT, body=chat, rollout=rollout, context=extract(dict(request.headers)))
        call.adapter = adapter
        upstream_body = json.dumps(chat).encode()
        key = request.headers.get("Idempotency-Key")
        if key:

            async def first() -> web.Response:
                answer = translated(await gateway.forward(request, CHAT_PATH, upstream_body, call, buffer=True), body)
                assert isinstance(answer, web.Response)  # buffered: a whole answer, never a relayed stream
                return answer

            response = await gateway.idempotent.once(
                key, body_digest(request.path, raw), first, lambda: gateway._headers(call)
            )
            return response if response.status != 422 else translated(response, body)  # the key reused
        if call.streaming:
            call.translate = MessagesStream(body)  # the chat stream re-written as it is relayed
        return translated(await gateway.forward(request, CHAT_PATH, upstream_body, call), body)

    return messages


def translated(response: web.StreamResponse, request_body: dict) -> web.StreamResponse:
    """A chat answer of the gateway (JSON, a buffered stream, or an error) as the Messages API's; a
    stream already relayed is returned as it is."""
    if not isinstance(response, web.Response):
        return response
    payload = response.body if isinstance(response.body, bytes) else b""
    headers = {k: v for k, v in response.headers.items() if k.lower().startswith("x-lightning")}
    if response.status != 200:
        return web.json_response(error_from_chat(response.status, payload), status=response.status, headers=headers)
    if request_body.get("stream"):  # buffered (an idempotent request): translated whole
        stream = MessagesStream(request_body)
        return web.Response(body=stream.feed(payload) + stream.end(), content_type="text/event-stream", headers=headers)
    try:
        reply = message(json.loads(payload), request_body)
    except (ValueError, AttributeError):
        return refused(502, "upstream answered a body that is not a chat completion", "api_error")
    return web.json_response(reply, headers=headers)
