"""JSON over HTTP for the clients of the project's servers (vLLM's routes, the gateway's admin routes,
benchmarks): one request, one reply, one error type. Standard library only: this runs in agents.

Every failure is an `HttpError`: no answer (refused, timed out, reset: `status` is None), an answer
that is not 2xx, or a 2xx answer that is not the JSON asked for. It is an OSError, as urllib's own
errors are, so code that treats any network failure alike keeps doing so.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

ERROR_BODY_LIMIT = 64 * 1024  # bytes of a failed reply kept (enough for any server's error message)
_MESSAGE_BODY_CHARS = 500  # of those, how many the message shows


class HttpError(OSError):
    """A request that got no usable answer; `status` is None when no answer came at all."""

    def __init__(self, method: str, url: str, status: int | None, body: str, reason: str) -> None:
        self.method, self.url, self.status, self.body, self.reason = method, url, status, body, reason
        shown = f": {body[:_MESSAGE_BODY_CHARS]}" if body else ""
        what = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(f"{method} {url}: {what} ({reason}){shown}")


def request(
    method: str,
    url: str,
    data: bytes | None = None,
    *,
    timeout: float,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """Send one request and return the 2xx reply's body; HttpError otherwise.

    Only http and https URLs (urllib would also open file: and ftp: ones); ValueError for others."""
    return _send(method, url, data, timeout, headers)[1]


def _send(
    method: str, url: str, data: bytes | None, timeout: float, headers: Mapping[str, str] | None
) -> tuple[int, bytes]:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {url!r}")
    call = urllib.request.Request(url, data=data, headers=dict(headers or {}), method=method)
    try:
        with urllib.request.urlopen(call, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:  # an answer, not 2xx (urllib follows redirects itself)
        try:
            body = exc.read(ERROR_BODY_LIMIT)
        except (OSError, http.client.HTTPException):
            body = b""
        raise HttpError(method, url, exc.code, body.decode(errors="replace"), str(exc.reason)) from None
    except urllib.error.URLError as exc:  # refused, unknown host, timed out while connecting
        raise HttpError(method, url, None, "", str(exc.reason)) from None
    except (OSError, http.client.HTTPException) as exc:  # timed out or cut off while reading the reply
        raise HttpError(method, url, None, "", f"{type(exc).__name__}: {exc}") from None


def _json_reply(method: str, url: str, status: int, body: bytes) -> Any:
    """The reply's JSON; None for an empty body (routes that only acknowledge)."""
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        text = body[:ERROR_BODY_LIMIT].decode(errors="replace")
        raise HttpError(method, url, status, text, f"reply is not JSON: {exc}") from None


def get_json(url: str, *, timeout: float, headers: Mapping[str, str] | None = None) -> Any:
    """GET url and return its JSON reply (None if the reply is empty)."""
    sent = {"Accept": "application/json", **(headers or {})}
    return _json_reply("GET", url, *_send("GET", url, None, timeout, sent))


def post_json(url: str, body: Any, *, timeout: float, headers: Mapping[str, str] | None = None) -> Any:
    """POST `body` as JSON and return the JSON reply (None if the reply is empty)."""
    sent = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
    return _json_reply("POST", url, *_send("POST", url, json.dumps(body).encode(), timeout, sent))
