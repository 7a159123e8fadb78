"""The gateway's errors in the OpenAI API's shape, `{"error": {"message", "type", "code"}}`, which
OpenAI clients parse and raise with its message, aiohttp's own (404, 405, 413) included; on the
Anthropic Messages route (`.../v1/messages`), in Anthropic's shape, which its clients parse."""

from __future__ import annotations

import logging

from aiohttp import web

from lightning_otel.core.anthropic_messages import error_body as anthropic_error_body

log = logging.getLogger(__name__)
STREAM_STARTED = "lightning_otel.stream_started"  # request key: the response's head is sent
_ERROR_TYPES = {
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "idempotency_error",
}


def error_response(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}}, status=status, headers=headers
    )


def key_reused() -> web.Response:
    message = (
        "this Idempotency-Key was first used with a different request body or route; a new request needs a new key"
    )
    return error_response(422, message, _ERROR_TYPES[422])


def errors_middleware(max_body_bytes: int):
    """aiohttp's own errors (no route, wrong method, body over the limit) and unexpected ones as JSON."""

    @web.middleware
    async def errors(request: web.Request, handler):
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = exc.text or exc.reason
            if exc.status == 413:
                message = f"request body over the gateway's limit of {max_body_bytes} bytes (--max-body-bytes)"
            headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
            kind = _ERROR_TYPES.get(exc.status, "invalid_request_error")
            return _answer(request, exc.status, message, kind, headers)
        except Exception:
            if request.get(STREAM_STARTED):
                raise  # the stream's head is sent: nothing else can be answered
            log.exception("gateway: unexpected error on %s %s", request.method, request.path)
            return _answer(request, 500, "internal error in the gateway (see its log)", "server_error")

    return errors


def _answer(request: web.Request, status: int, message: str, kind: str, headers: dict | None = None) -> web.Response:
    if request.path.endswith("/v1/messages"):
        kind = "api_error" if status >= 500 else kind
        return web.json_response(anthropic_error_body(message, kind), status=status, headers=headers)
    return error_response(status, message, kind, headers)
