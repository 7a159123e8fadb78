"""Reading an HTTP request body under limits, decompressing it as it arrives.

`read_body` takes the body off an aiohttp request chunk by chunk (plain, `Content-Length` or
`Transfer-Encoding: chunked`), inflates gzip or deflate incrementally, and stops as soon as the
decompressed size passes the cap: a gzip bomb costs at most `limit` bytes of memory. A client
that goes silent for `read_timeout_s`, or takes longer than `body_timeout_s` for the whole body,
gets `BodyTimeout`.

The body comes back as the pieces it arrived in: joining them, a copy of megabytes that CPython
makes without holding the GIL, is left to the thread that decodes the body, so that the event
loop, which reads every connection, holds the GIL as briefly as it can.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass

from aiohttp import StreamReader

GZIP_ENCODING = "gzip"
DEFLATE_ENCODING = "deflate"
ENCODINGS = ("", "identity", GZIP_ENCODING, DEFLATE_ENCODING)


class BodyTooLarge(ValueError):
    """413: the body (or what it decompresses to) passes the cap."""


class BodyTimeout(Exception):
    """408: the client stalled or was too slow."""


class BadEncoding(ValueError):
    """400: the body is not what its Content-Encoding says (corrupt or truncated gzip/deflate)."""


def joined(parts: list[bytes]) -> bytes:
    return parts[0] if len(parts) == 1 else b"".join(parts)


@dataclass
class Body:
    raw_parts: list[bytes]  # as received (compressed when `encoding` is gzip or deflate)
    data_parts: list[bytes]  # decompressed: the same list when not compressed
    encoding: str  # "", "gzip" or "deflate"

    def raw(self) -> bytes:
        return joined(self.raw_parts)

    def data(self) -> bytes:
        return joined(self.data_parts)


class _Inflater:
    """Incremental gzip (any number of members, as gzip.decompress reads them) or deflate (zlib
    or raw, as HTTP clients send it), never producing more than `limit` bytes in all."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding = encoding
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []
        self._pending = b""  # deflate: bytes held until the zlib header can be recognised
        self._decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == GZIP_ENCODING else None

    def feed(self, data: bytes) -> None:
        if self._decompressor is None:  # deflate: zlib-wrapped (RFC 9110) or raw (what some clients send)
            self._pending += data
            if len(self._pending) < 2:
                return
            cmf, flg = self._pending[0], self._pending[1]
            zlib_wrapped = cmf & 0x0F == 8 and (cmf << 8 | flg) % 31 == 0
            self._decompressor = zlib.decompressobj(zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS)
            data, self._pending = self._pending, b""
        while data:
            if self._decompressor.eof:
                if self.encoding != GZIP_ENCODING:
                    raise BadEncoding("data after the end of the deflate stream")
                self._decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next gzip member
            try:
                out = self._decompressor.decompress(data, self.limit - self.size + 1)
            except zlib.error as exc:
                raise BadEncoding(f"bad {self.encoding} body: {exc}") from None
            self.size += len(out)
            if self.size > self.limit:
                raise BodyTooLarge(f"decompressed body exceeds {self.limit} bytes")
            if out:
                self.parts.append(out)
            data = self._decompressor.unconsumed_tail or self._decompressor.unused_data

    def finish(self) -> list[bytes]:
        if self._pending or self._decompressor is None or not self._decompressor.eof:
            raise BadEncoding(f"truncated {self.encoding} body")
        return self.parts


async def _next_chunk(content: StreamReader, timeout_s: float) -> bytes:
    """The next piece of the body as received (b"" at its end). readchunk, unlike readany, hands
    over buffered pieces one by one instead of joining them: one copy less per body."""
    while True:
        async with asyncio.timeout(timeout_s):
            data, end_of_http_chunk = await content.readchunk()
        # (b"", True) marks a chunk boundary, except from a reader at its end: aiohttp's shared
        # empty-body reader answers (b"", True) forever once read, and looping on it would hang.
        if data or not end_of_http_chunk or content.at_eof():
            return data


async def read_body(
    content: StreamReader, encoding: str, limit: int, read_timeout_s: float, body_timeout_s: float
) -> Body:
    """The whole body of a request, at most `limit` bytes received and `limit` bytes decompressed.

    Raises BodyTooLarge (413) as soon as either passes the cap, BadEncoding (400), BodyTimeout (408)."""
    encoding = "" if encoding == "identity" else encoding
    inflater = _Inflater(encoding, limit) if encoding else None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body_timeout_s
    parts: list[bytes] = []
    size = 0
    while True:
        wait_s = min(read_timeout_s, deadline - loop.time())
        try:
            chunk = await _next_chunk(content, wait_s) if wait_s > 0 else None
        except TimeoutError:
            chunk = None
        if chunk is None:
            if loop.time() >= deadline:
                raise BodyTimeout(f"the body took longer than {body_timeout_s:g} s")
            raise BodyTimeout(f"no body data for {read_timeout_s:g} s")
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body exceeds {limit} bytes")
        parts.append(chunk)
        if inflater is not None:
            inflater.feed(chunk)
    return Body(parts, inflater.finish() if inflater is not None else parts, encoding)
