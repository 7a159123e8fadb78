"""`POST /v1/responses` (OpenAI Responses API) through the gateway, served from the upstream's chat
completions: vLLM's /v1/responses cannot return exact token ids and logprobs for tool-call turns,
its chat completions can (core.responses_api). The request is translated, sent through the gateway's
own chat path (replica choice, retries, swap gates, idempotency, the chat call's span with its ids),
and the reply translated back: a `response` object, or the Responses stream of events, relayed as
the chat chunks arrive. Errors come in the Responses error shape; stateful requests
(`previous_response_id`, `conversation`, `background`) are refused with 400 and what to send instead.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from opentelemetry.propagate import extract

from lightning_otel.core.responses_api import ResponsesRequestError, chat_request, error_body, response_object
from lightning_otel.core.responses_stream import ResponsesStream, sse
from lightning_otel.core.vllm_endpoint import CHAT, token_request_fields
from lightning_otel.gateway.idempotency import body_digest
from lightning_otel.gateway.spans import Call

CHAT_PATH = "/v1/chat/completions"


def _error(status: int, message: str, kind: str, param: str | None = None, code: Any = None) -> web.Response:
    return web.json_response(error_body(message, kind, param, code), status=status)


def handler(gateway: Any):
    """The aiohttp handler of /v1/responses (and its per-rollout forms) for `gateway`."""

    async def responses(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "request body is not JSON", "invalid_request_error")
        try:
            chat = chat_request(body)
        except ResponsesRequestError as exc:
            return web.json_response(exc.body(), status=400)
        adapter = await gateway.adapter_for(chat["model"])
        if adapter is not None:  # LoRA: the logical model name goes to the current adapter
            chat["model"] = adapter[0]
        chat.update(token_request_fields(CHAT, chat))
        try:
            rollout = gateway.rollout_identity(request)
        except web.HTTPBadRequest as exc:
            return _error(400, exc.text or "bad rollout", "invalid_request_error")
        call = Call(kind=CHAT, body=chat, rollout=rollout, context=extract(dict(request.headers)))
        call.adapter = adapter
        chat_raw = json.dumps(chat).encode()
        key = request.headers.get("Idempotency-Key")
        if key:
            digest = body_digest(request.path, raw)
            return await gateway.idempotent.once(
                key, digest, lambda: _buffered(gateway, request, chat_raw, call, body), lambda: gateway._headers(call)
            )
        if call.streaming:
            call.translate = WireStream(body)  # the chat stream re-written as it is relayed (server._stream)
            outcome = await gateway.forward(request, CHAT_PATH, chat_raw, call)
            return outcome if outcome.prepared else _translated(outcome, body, call, gateway)
        return _translated(await gateway.forward(request, CHAT_PATH, chat_raw, call), body, call, gateway)

    return responses


async def _buffered(gateway: Any, request: web.Request, chat_raw: bytes, call: Call, body: dict) -> web.Response:
    """The whole answer at once (an idempotent request's, to replay): a stream's events as one body."""
    return _translated(await gateway.forward(request, CHAT_PATH, chat_raw, call, buffer=True), body, call, gateway)


def _translated(chat: web.Response, body: dict, call: Call, gateway: Any) -> web.Response:
    """The chat answer `chat` as the Responses API's: the response object, its events, or the error."""
    headers = gateway._headers(call)
    raw = chat.body if isinstance(chat.body, bytes | bytearray) else b""  # forward(buffer=True): bytes
    try:
        data = json.loads(raw) if not call.streaming or chat.status != 200 else None
    except ValueError:
        data = None
    if chat.status != 200:
        error = (data or {}).get("error") if isinstance(data, dict) else None
        error = error if isinstance(error, dict) else {}
        message = error.get("message") or f"upstream answered {chat.status}"
        return web.json_response(
            error_body(message, error.get("type") or "server_error", error.get("param"), error.get("code")),
            status=chat.status,
            headers=headers,
        )
    if not call.streaming:
        if not isinstance(data, dict):
            return _error(502, "upstream answered something other than a chat completion", "upstream_error")
        return web.json_response(response_object(data, body), headers=headers)
    stream = ResponsesStream(body)
    events = stream.start()
    for chunk in _chunks(bytes(raw)):
        events += stream.feed(chunk)
    events += stream.finish()
    return web.Response(
        body=b"".join(map(sse, events)),
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", **headers},
    )


class WireStream:
    """A chat-completions event stream's bytes in, the Responses events' bytes out, as they arrive."""

    def __init__(self, body: dict) -> None:
        self.stream, self.pending, self.started = ResponsesStream(body), b"", False

    def feed(self, data: bytes) -> bytes:
        events = [] if self.started else self.stream.start()
        self.started = True
        self.pending += data
        complete, _, self.pending = self.pending.rpartition(b"\n")
        events += [event for chunk in _chunks(complete) for event in self.stream.feed(chunk)]
        return b"".join(map(sse, events))

    def end(self, error: str | None = None) -> bytes:
        events = self.feed(b"\n")  # what the last line held
        done = self.stream.fail(error, "upstream_error") if error else self.stream.finish()
        return events + b"".join(map(sse, done))


def _chunks(payload: bytes):
    """The JSON chunks of a chat-completions event stream."""
    for line in payload.split(b"\n"):
        data = line[6:].strip() if line.startswith(b"data: ") else b""
        if data and data != b"[DONE]":
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if isinstance(chunk, dict):
                yield chunk
