"""Seeded hostile requests for `lightning-otel dashboard` (tests/dashboards/test_dashboard_hostile.py): bad
paths, huge and invalid query strings, wrong tokens and Host headers, odd methods and content, raw
bytes, and the SQL door's write-or-peek statements and odd `rollout_ids` (hostile_sql.py) sent with the
right token.

`dashboard_case(seed, index, token, paths)` depends on its arguments alone, so a failure is rebuilt
from the printed seed and index. Each case says which replies it may get (`allowed`; None: any that
is not a server error), so the test checks the guard that should have answered, not only that one did.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from hostile_otlp import Request
from hostile_sql import Paths, Query, rollout_ids_query, write_or_peek_query
from hostile_wire import http_request

JSON = "application/json"
POST_ROUTES = ("/v1/query", "/v1/detokenize")
_NOW_NS = 1_800_000_000 * 10**9  # span times in the collector suite's bodies: fixed, so a case replays exactly
_PATHS = [
    "/../../../../etc/passwd",
    "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/..%2f..%2f..%2fetc%2fpasswd",
    "/" + "../" * 12 + "etc/passwd",
    "/" + "%2e%2e%2f" * 12 + "etc/passwd",
    "/%2e%2e/server.py",
    "/..%2fdashboard_app.py",
    "/web/app.js",
    "/app.js/",
    "/APP.JS",
    "/app.js%00.html",
    "/server.py",
    "/dashboard_app.py",
    "/__init__.py",
    "/grafana/dashboards",
    "/web",
    "/.",
    "/..",
    "/%ff%fe",
    "/%zz",
    "/\\..\\server.py",
    "//etc/passwd",
    "/v1/config/../query",
    "/v1/query",
    "/v1/detokenize",
    "/index.html",
    "/favicon.svg",
    "/health",
    "/v1/config",
]
_QUERY_STRINGS = ["token=", "token=x&token=y", "%", "%zz", "&&&===", "a=%FF%FE", "x=é", "#frag", "?" * 50, "t=%00"]


@dataclass
class Case:
    request: Request
    allowed: frozenset | None = None  # the codes this case may get; None: any below 500
    query: Query | None = None  # a write-or-peek statement, sent with the right token


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _sql_body(rng: random.Random) -> bytes:
    return json.dumps({"sql": rng.choice(["SELECT 1", "SELECT count(*) FROM spans", "DELETE FROM spans"])}).encode()


def _bad_path(rng: random.Random) -> Case:
    path = rng.choice(_PATHS + ["/" + "p" * rng.choice([100, 5000, 9000])])
    if rng.random() < 0.3:
        path += "?" + rng.choice(_QUERY_STRINGS)
    return Case(Request("path", b"", {}, method=rng.choice(["GET", "GET", "HEAD"]), path=path))


def _query_string(rng: random.Random, token: str) -> Case:
    """Long or malformed query strings; the token in one opens nothing (POST wants the header)."""
    route = rng.choice(["/", "/v1/config", "/health", *POST_ROUTES])
    query = rng.choice([*_QUERY_STRINGS, f"token={token}", "x=" + "q" * rng.choice([1000, 7000, 20_000])])
    if route in POST_ROUTES:
        request = Request("query-string-post", _sql_body(rng), {"Content-Type": JSON}, path=f"{route}?{query}")
        return Case(request, frozenset({400, 401}))  # 400: a request line past aiohttp's limit
    return Case(Request("query-string", b"", {}, method="GET", path=f"{route}?{query}"))


def _bad_token(rng: random.Random, token: str) -> Case:
    header = rng.choice(
        [
            None,
            "Bearer",
            "Bearer ",
            "Bearer wrong",
            f"bearer {token}",
            f"Bearer {token}x",
            f"Bearer {token[:-1]}",
            f"Bearer  {token}x",
            f"Basic {token}",
            f"{token}",
            "Bearer " + "a" * rng.choice([100, 5000]),
            f"Bearer {token}\x7f",
            f"Token {token}",
        ]
    )
    headers = {"Content-Type": JSON, **({"Authorization": header} if header is not None else {})}
    route = rng.choice(POST_ROUTES)
    body = _sql_body(rng) if route == "/v1/query" else json.dumps({"ids": [1, 2, 3]}).encode()
    return Case(Request("token", body, headers, path=route), frozenset({400, 401}))  # 400: a header aiohttp refuses


def _bad_host(rng: random.Random, token: str) -> Case:
    host = rng.choice(
        ["evil.example", "127.0.0.1.evil.example", "localhost.", "0.0.0.0", "127.0.0.2", "[::2]", "attacker:80", "x"]
    )
    headers = {"Content-Type": JSON, "Host": host, **_auth(token)}
    return Case(Request("host", _sql_body(rng), headers, path=rng.choice(POST_ROUTES)), frozenset({403}))


def _method(rng: random.Random, token: str) -> Case:
    method = rng.choice(["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND", "get", "POST", "M" * 200])
    path = rng.choice(["/", "/v1/query", "/v1/config", "/app.js", "/nope"])
    headers = {"Content-Type": JSON, **_auth(token)}
    body = _sql_body(rng) if method != "GET" else b""
    allowed = None if method in ("POST", "GET") else frozenset({400, 404, 405})
    return Case(Request("method", body, headers, method=method, path=path), allowed)


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _bad_body(rng: random.Random, token: str) -> Case:
    """The right token and Host, the wrong content: every case here is refused with a 4xx."""
    pick = rng.randrange(5)
    if pick == 0:
        content_type = rng.choice(["text/plain", "application/x-www-form-urlencoded", "", "application/jsonx", "*/*"])
        headers = {**_auth(token), **({"Content-Type": content_type} if content_type else {})}
        request = Request("body-content-type", _sql_body(rng), headers, path=rng.choice(POST_ROUTES))
        return Case(request, frozenset({415}))
    headers = {"Content-Type": JSON, **_auth(token)}
    if pick == 1:
        body = rng.choice(
            [b"", b"null", b"[]", b'{"sql": 5}', b'{"sql": null}', b'{"sq": "SELECT 1"}', b"\xff\xfe", _deep(100_000)]
        )
        return Case(Request("body-query", body, headers, path="/v1/query"), frozenset({400}))
    if pick == 2:
        ids = rng.choice(['"x"', "[1.5]", "[true]", '["1"]', "[[1]]", "{}", "null", "[1e400]"])
        body = rng.choice([f'{{"ids": {ids}}}'.encode(), b'{"nope": []}', b"garbage", _deep(100_000)])
        return Case(Request("body-detokenize", body, headers, path="/v1/detokenize"), frozenset({400}))
    if pick == 3:  # gzip is not undone: not JSON
        body = gzip.compress(_sql_body(rng))
        headers = {**headers, "Content-Encoding": "gzip"}
        return Case(Request("body-gzip", body, headers, path=rng.choice(POST_ROUTES)), frozenset({400}))
    ids = [rng.choice([-1, 0, 2**31, 2**63, -(2**70), rng.randrange(300)]) for _ in range(rng.randint(0, 50))]
    body = json.dumps({"ids": ids}).encode()  # odd but valid ids: each gets a piece or "<id n>"
    return Case(Request("detokenize-odd-ids", body, headers, path="/v1/detokenize"), frozenset({200}))


def _head(method: str, path: str, lines: list[str]) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(line + "\r\n" for line in lines) + "\r\n").encode("latin-1")


def _raw(rng: random.Random, seed: int, index: int, token: str) -> Case:
    """Bytes no client library sends: malformed methods and targets, and the collector suite's raw
    HTTP framing cases (lying lengths, smuggling shapes, other protocols), aimed at this server."""
    close = ["Host: 127.0.0.1", "Connection: close"]
    pick = rng.randrange(4)
    if pick == 0:
        method = rng.choice(["G\x00T", "GET\t", "GE T", "\x16\x03\x01", "GET/", "", "POST\x7f", "é"])
        return Case(Request("raw-method", raw=_head(method, "/", close)))
    if pick == 1:
        target = rng.choice(
            ["/%00", "/\x00", "/a b", "*", "http://evil.example/v1/config", "/?" + "%" * 9000, "/" + "\x7f" * 10]
        )
        return Case(Request("raw-target", raw=_head("GET", target, close)))
    if pick == 2:  # a POST route that says it sends more than it does: answered or closed, never hung
        body = _sql_body(rng)
        lines = [*close, f"Content-Type: {JSON}", f"Authorization: Bearer {token}", f"Content-Length: {len(body) - 3}"]
        return Case(Request("raw-short-body", raw=_head("POST", "/v1/query", lines) + body))
    for step in range(100):  # the first raw case of the collector suite's generator from here on
        request = http_request(seed, index * 100 + step, _NOW_NS, 8 << 20)
        if request.raw is not None and not request.slow:
            request.kind = "wire-" + request.kind
            return Case(request)
    return Case(Request("raw-random", raw=rng.randbytes(512)))


def dashboard_case(seed: int, index: int, token: str, paths: Paths, rollouts: Sequence[str] = ()) -> Case:
    """The index-th request of the run with `seed`; `rollouts`: rollout ids the store holds."""
    rng = random.Random(f"{seed}/dashboard/{index}")
    roll = rng.random()
    if roll < 0.14:
        return _bad_path(rng)
    if roll < 0.24:
        return _query_string(rng, token)
    if roll < 0.40:
        return _bad_token(rng, token)
    if roll < 0.48:
        return _bad_host(rng, token)
    if roll < 0.58:
        return _method(rng, token)
    if roll < 0.78:
        return _bad_body(rng, token)
    if roll < 0.90:
        return _raw(rng, seed, index, token)
    if roll < 0.95:
        query = write_or_peek_query(rng, paths, index)
        kind = "sql-" + query.kind
    else:  # kinds "rollouts-...": the views narrowed to rollouts, with odd values
        query = rollout_ids_query(rng, paths, index, rollouts)
        kind = query.kind
    headers = {"Content-Type": JSON, **_auth(token), **(query.headers or {})}
    return Case(Request(kind, query.payload(), headers, path="/v1/query"), query.allowed, query=query)
