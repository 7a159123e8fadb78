"""`Idempotency-Key`: a retried request (same key, same route and body) gets the first result, and
only the first is sent upstream and recorded; the key reused with another route or body is a client
error (422), nothing sent. Results are kept `ttl_s`, at most `max_keys` of them."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web

from lightning_otel.gateway.errors import key_reused

Result = tuple[int, dict[str, str], bytes]  # status, headers, body


def body_digest(path: str, raw: bytes) -> bytes:
    """What makes two requests with one Idempotency-Key the same request: route and body."""
    return hashlib.blake2b(path.encode() + b"\0" + raw, digest_size=16).digest()


class IdempotentRequests:
    def __init__(self, ttl_s: float = 600.0, max_keys: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._completed: OrderedDict[str, tuple[float, bytes, Result]] = OrderedDict()  # expiry, digest, result
        self._inflight: dict[str, tuple[bytes, asyncio.Future]] = {}

    async def once(
        self,
        key: str,
        digest: bytes,
        forward: Callable[[], Awaitable[web.StreamResponse]],
        reply_headers: Callable[[], dict[str, str]],
    ) -> web.StreamResponse:
        """`forward()` the first time (a buffered response); its result, with `reply_headers()` taken
        after it, answers the retries."""
        now = time.monotonic()
        while self._completed and next(iter(self._completed.values()))[0] < now:
            self._completed.popitem(last=False)
        if key in self._completed:
            _, first, (status, headers, payload) = self._completed[key]
            if first != digest:
                return key_reused()
            return web.Response(status=status, headers=headers, body=payload)
        if key in self._inflight:
            first, pending = self._inflight[key]
            if first != digest:
                return key_reused()
            status, headers, payload = await asyncio.shield(pending)
            return web.Response(status=status, headers=headers, body=payload)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[key] = (digest, future)
        try:
            response = await forward()
            if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
                # a retry replays the stored bytes: forward() must answer buffered, never as a stream
                raise TypeError("an idempotent request's answer must be a buffered bytes body")
            result = (response.status, {"Content-Type": response.content_type, **reply_headers()}, response.body)
            if response.status < 500:
                self._completed[key] = (now + self.ttl_s, digest, result)
                if len(self._completed) > self.max_keys:
                    self._completed.popitem(last=False)
            future.set_result(result)
            return response
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it
            raise
        finally:
            del self._inflight[key]
