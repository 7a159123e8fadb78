"""Seeded hostile requests as they go on the wire: the mix of bodies (hostile_otlp.py) with odd headers,
methods, paths and raw HTTP that no well-behaved client library would send.

`http_request(seed, index, now_ns)` and `grpc_request(seed, index, now_ns)` are the generators the
hostile suite draws from; each depends on its arguments alone, so a failure is rebuilt from the
printed seed and index.
"""

from __future__ import annotations

import gzip
import random
import zlib

from hostile_otlp import PROTOBUF, Request, hostile_json, mutate, spans_request, tracked_protobuf, valid_export

GRPC_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SLOW_EVERY = 1000  # one request in this many is left unfinished on purpose (the collector's 408 path)
_BOMB: dict[int, bytes] = {}


def gzip_bomb(size: int) -> bytes:
    """gzip of `size` zero bytes (kilobytes on the wire), made once per size."""
    if size not in _BOMB:
        _BOMB[size] = gzip.compress(bytes(size), 9)
    return _BOMB[size]


def _base_body(rng, now_ns) -> bytes:
    return spans_request(rng, now_ns, "hostile-base", rng.randint(1, 4))[0].SerializeToString()


def _headers_case(rng, now_ns, max_body: int) -> Request:
    """A plausible body under odd headers: content types, encodings, bombs, chunking, big headers."""
    pick = rng.randrange(9)
    body = _base_body(rng, now_ns)
    if pick == 0:
        content_type = rng.choice(
            [
                "",
                "text/plain",
                "application/x-protobuf; charset=utf-8",
                "APPLICATION/JSON",
                "application/json;;;",
                "application/x-protobuf, application/json",
                "multipart/form-data; boundary=x",
                "a" * 5000,
                "*/*",
                "application/grpc",
                "application/x-www-form-urlencoded",
                "application/protobuf",
            ]
        )
        return Request("hdr-content-type", body, {"Content-Type": content_type} if content_type else {})
    if pick == 1:
        encoding = rng.choice(["gzip", "deflate", "br", "zstd", "gzip, gzip", "identity", "x-gzip", "GZIP", " gzip "])
        payload = rng.choice([body, rng.randbytes(200), gzip.compress(body)[: rng.randint(1, 30)], zlib.compress(body)])
        return Request("hdr-encoding", payload, {"Content-Type": PROTOBUF, "Content-Encoding": encoding})
    if pick == 2:  # decompresses past the body cap
        return Request(
            "hdr-gzip-bomb", gzip_bomb(max_body + 1024), {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"}
        )
    if pick == 3:  # gzip whose inside is garbage, or gzip inside gzip
        inner = rng.choice([rng.randbytes(300), gzip.compress(body), mutate(rng, body)])
        return Request("hdr-gzip-garbage", gzip.compress(inner), {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})
    if pick == 4:
        return Request(
            "hdr-expect", body, {"Content-Type": PROTOBUF, "Expect": rng.choice(["100-continue", "x", "200-ok"])}
        )
    if pick == 5:
        return Request(
            "hdr-authorization",
            body,
            {
                "Content-Type": PROTOBUF,
                "Authorization": rng.choice(["Bearer", "Basic Zm9v", "Bearer " + "a" * 4000, "Bearer \x7f"]),
            },
        )
    if pick == 6:  # one header near and past the server's limit
        return Request(
            "hdr-huge", body, {"Content-Type": PROTOBUF, "X-Big": "h" * rng.choice([4000, 8190, 9000, 70_000])}
        )
    if pick == 7:
        headers = {f"X-H{i}": "v" for i in range(rng.choice([50, 150, 500]))}
        return Request("hdr-many", body, {"Content-Type": PROTOBUF, **headers})
    return Request("hdr-chunked", body, {"Content-Type": PROTOBUF, "Transfer-Encoding": "chunked"})


def _method_path_case(rng, now_ns) -> Request:
    body = _base_body(rng, now_ns)
    method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "POST", "TRACE"])
    path = rng.choice(
        [
            "/v1/traces",
            "/v1/traces/",
            "//v1/traces",
            "/v1/traces/../query",
            "/v1/%2e%2e/health",
            "/v1/traces?x=" + "q" * 3000,
            "/" + "p" * rng.choice([100, 5000, 20_000]),
            "/v1/query",
            "/v1/logs",
            "/v1/metrics",
            "/%00",
            "/v1/traces#frag",
            "*",
        ]
    )
    return Request(
        "method-path", body if method != "GET" else b"", {"Content-Type": PROTOBUF}, method=method, path=path
    )


def _head(method: str, path: str, lines: list[str], version: str = "HTTP/1.1") -> bytes:
    """A request head; HTTP/1.1 requires Host, so every head has one (else all would be a plain 400)."""
    lines = ["Host: 127.0.0.1", *lines]
    return (f"{method} {path} {version}\r\n" + "".join(line + "\r\n" for line in lines) + "\r\n").encode("latin-1")


def _raw_case(rng, now_ns, index: int) -> Request:
    """Bytes on a socket: lying lengths, bad chunking, smuggling shapes, other protocols, pipelining.
    Each asks the collector to close after answering (Connection: close), so a reply ends in EOF."""
    body = _base_body(rng, now_ns)
    close = "Connection: close"
    ct = f"Content-Type: {PROTOBUF}"
    if index % SLOW_EVERY == SLOW_EVERY - 1:  # headers promise more body than ever comes
        return Request(
            "raw-slow",
            raw=_head("POST", "/v1/traces", [ct, f"Content-Length: {len(body) + 100}", close]) + body,
            slow=True,
        )
    pick = rng.randrange(12)
    if pick == 0:  # shorter Content-Length: the rest reads as the next request
        return Request(
            "raw-short-length", raw=_head("POST", "/v1/traces", [ct, f"Content-Length: {len(body) // 2}"]) + body
        )
    if pick == 1:
        length = rng.choice(
            ["-1", "abc", "1e3", "+5", "0x10", " 5", "99999999999999999999", f"{len(body)}, {len(body)}"]
        )
        return Request(
            "raw-bad-length", raw=_head("POST", "/v1/traces", [ct, f"Content-Length: {length}", close]) + body
        )
    if pick == 2:
        lines = [ct, f"Content-Length: {len(body)}", f"Content-Length: {len(body) + 1}", close]
        return Request("raw-two-lengths", raw=_head("POST", "/v1/traces", lines) + body)
    if pick == 3:  # smuggling shape: both framings
        lines = [ct, f"Content-Length: {len(body)}", "Transfer-Encoding: chunked", close]
        return Request(
            "raw-cl-te",
            raw=_head("POST", "/v1/traces", lines) + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n",
        )
    if pick == 4:
        size = rng.choice(
            ["zz", "-1", "ffffffffffffffffff", f"{len(body):x};ext=" + "e" * 5000, "", f"{len(body) + 5:x}"]
        )
        chunked = size.encode() + b"\r\n" + body + b"\r\n0\r\n\r\n"
        return Request(
            "raw-bad-chunk", raw=_head("POST", "/v1/traces", [ct, "Transfer-Encoding: chunked", close]) + chunked
        )
    if pick == 5:
        te = rng.choice(["gzip, chunked", "chunked, identity", "xchunked", "chunked\x0b", "identity"])
        return Request(
            "raw-odd-te",
            raw=_head("POST", "/v1/traces", [ct, f"Transfer-Encoding: {te}", close]) + b"5\r\nhello\r\n0\r\n\r\n",
        )
    if pick == 6:  # header syntax: no colon, folding, NUL, bare LF, spaces before the colon
        bad = rng.choice(
            ["NoColonHere", " folded: line", "X-Nul: a\x00b", "Content-Type : text/plain", "X:\x01\x02", "\tX: y"]
        )
        return Request(
            "raw-header-syntax",
            raw=_head("POST", "/v1/traces", [ct, bad, f"Content-Length: {len(body)}", close]) + body,
        )
    if pick == 7:
        line = rng.choice(
            [
                "GET /health",
                "GET /health HTTP/9.9",
                "POST /v1/traces HTTP/1.0",
                "GET http://evil.example/health HTTP/1.1",
                "CONNECT 127.0.0.1:22 HTTP/1.1",
                "GET /health HTTP/1.1 extra",
                "\x16\x03\x01\x02\x00\x01",
                "G\x00T / HTTP/1.1",
            ]
        )
        return Request(
            "raw-request-line", raw=(line + "\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").encode("latin-1")
        )
    if pick == 8:  # an HTTP/2 client on the HTTP/1.1 port
        return Request("raw-h2-preface", raw=b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rng.randbytes(64))
    if pick == 9:  # a valid request, a garbage one and a closing one pipelined on one connection
        first = _head("POST", "/v1/traces", [ct, f"Content-Length: {len(body)}"]) + body
        junk = mutate(rng, body)
        second = _head("POST", "/v1/traces", [ct, f"Content-Length: {len(junk)}"]) + junk
        return Request("raw-pipelined", raw=first + second + _head("GET", "/health", [close]))
    if pick == 10:
        return Request(
            "raw-bare-lf",
            raw=f"POST /v1/traces HTTP/1.1\nHost: 127.0.0.1\nContent-Type: {PROTOBUF}\nContent-Length: {len(body)}\nConnection: close\n\n".encode()
            + body,
        )
    return Request("raw-random", raw=rng.randbytes(rng.randint(1, 2048)))


def http_request(seed: int, index: int, now_ns: int, max_body: int) -> Request:
    """The index-th HTTP request of the run with `seed` (about one in eight is a valid export)."""
    rng = random.Random(f"{seed}/http/{index}")
    roll = rng.random()
    if index % SLOW_EVERY == SLOW_EVERY - 1 or 0.85 <= roll < 0.93:
        return _raw_case(rng, now_ns, index)
    if roll < 0.09:
        return valid_export(rng, now_ns, use_json=roll < 0.03)
    if roll < 0.16:
        return Request("random-bytes", rng.randbytes(rng.choice([0, 1, 7, 64, 512, 4096])), {"Content-Type": PROTOBUF})
    if roll < 0.33:
        return Request("mutated-protobuf", mutate(rng, _base_body(rng, now_ns)), {"Content-Type": PROTOBUF})
    if roll < 0.45:
        return tracked_protobuf(rng, now_ns)
    if roll < 0.70:
        return hostile_json(rng, now_ns)
    if roll < 0.81:
        return _headers_case(rng, now_ns, max_body)
    return _method_path_case(rng, now_ns) if roll < 0.85 else _raw_case(rng, now_ns, index)


def grpc_request(seed: int, index: int, now_ns: int) -> tuple[Request, str, tuple]:
    """The index-th gRPC call: (request, method path, metadata)."""
    rng = random.Random(f"{seed}/grpc/{index}")
    roll = rng.random()
    method, metadata = GRPC_EXPORT, ()
    if roll < 0.12:
        request = valid_export(rng, now_ns, use_json=False, gzip_share=0.0)  # gRPC carries the message itself
    elif roll < 0.25:
        request = Request("grpc-random-bytes", rng.randbytes(rng.choice([0, 1, 9, 100, 2048])))
    elif roll < 0.55:
        request = Request("grpc-mutated", mutate(rng, _base_body(rng, now_ns)))
    elif roll < 0.85:
        request = tracked_protobuf(rng, now_ns)
        request.kind = "grpc-" + request.kind
    elif roll < 0.93:
        request = Request("grpc-odd-metadata", _base_body(rng, now_ns))
        metadata = (
            rng.choice(
                [("authorization", "Bearer " + "a" * 3000), ("x-bin", b"\x00\xff" * 100), ("x-odd", "~!@#$%^&*() ")]
            ),
        )
    else:
        request = Request("grpc-odd-method", _base_body(rng, now_ns))
        method = rng.choice(
            ["/opentelemetry.proto.collector.trace.v1.TraceService/Nope", "/x/y", GRPC_EXPORT + "/", "/" + "m" * 2000]
        )
    return request, method, metadata
