"""Seeded hostile OTLP exports for tests/collector/test_collector_hostile.py, over HTTP and gRPC.

Every request is a pure function of (seed, channel, index, now_ns): a printed seed and index rebuild
the exact request that misbehaved (`http_request(seed, index, now_ns)`). A request whose spans carry
fresh ids the generator chose lists them in `span_ids` (tracked): acknowledged in full (200 / OK, no
rejected spans) they must be stored exactly once, refused they must leave nothing behind. Mutants of
valid bodies (bit flips, cuts) are untracked: their ids may be the mutation.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

PROTOBUF, JSON = "application/x-protobuf", "application/json"
VALID_SERVICE = "hostile-valid"
# Pieces of service names that once became, or could become, path components of the store.
_ODD_PIECES = ["/", "..", ".", "\x00", "\\", "%2F", "%00", "service=x", "date=2020-01-01", "hour=99", "\n", " ", "é"]
_ODD_PIECES += ["💥", "*", "?", "[", "'", '"', ";", "~", "$HOME", ".parquet", "CON", "\u202e", "\ufeff", "a", "a"]


@dataclass
class Request:
    kind: str
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    method: str = "POST"
    path: str = "/v1/traces"
    raw: bytes | None = None  # HTTP only: these bytes on a fresh socket instead of a well-formed request
    slow: bool = False  # raw: the request is left unfinished; the collector should time it out (408)
    span_ids: tuple = ()  # hex ids of spans with fresh ids (tracked), see the module docstring
    service: str | None = None  # the service.name the tracked spans were sent with
    valid: bool = False  # a plain valid export: must be acknowledged in full


# -- building blocks ------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def spans_request(rng: random.Random, now_ns: int, service: str, spans: int = 3, attributes=(), start_ns=None):
    """A valid ExportTraceServiceRequest with fresh ids: (request, hex span ids)."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    name = resource.resource.attributes.add()
    name.key, name.value.string_value = "service.name", service
    scope = resource.scope_spans.add()
    scope.scope.name = "hostile"
    trace_id = rng.randbytes(16)
    start = now_ns - rng.randrange(10**9) if start_ns is None else start_ns
    for i in range(spans):
        span = scope.spans.add()
        span.trace_id, span.span_id, span.name, span.kind = trace_id, rng.randbytes(8), f"op-{i}", 1
        span.start_time_unix_nano, span.end_time_unix_nano = start, min(start + 1000, 2**64 - 1)
        for key, value in attributes if i == 0 else ():  # the first span carries the hostile attributes
            attribute = span.attributes.add()
            attribute.key, attribute.value.string_value = key, value
    ids = tuple(s.span_id.hex() for s in scope.spans)
    return request, ids


def json_spans(rng: random.Random, now_ns: int, service, spans: int = 2, kind=1, start=None, attributes=()) -> tuple:
    """An OTLP/JSON export as a dict (values may be made hostile by the caller): (dict, hex span ids)."""
    trace_id = rng.randbytes(16).hex()
    ids = tuple(rng.randbytes(8).hex() for _ in range(spans))
    start = str(now_ns) if start is None else start
    items = [
        {
            "traceId": trace_id,
            "spanId": span_id,
            "name": f"op-{i}",
            "kind": kind,
            "startTimeUnixNano": start,
            "endTimeUnixNano": str(now_ns + 1000),
            "attributes": list(attributes),
        }
        for i, span_id in enumerate(ids)
    ]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "h"}, "spans": items}]}]}, ids


def big_size(rng: random.Random, usual: list[int], rare: int, rare_share: float = 0.03) -> int:
    """A size from `usual`, or now and then (`rare_share`) the `rare` one: megabyte bodies cost the
    client time to build, so they are few."""
    return rare if rng.random() < rare_share else rng.choice(usual)


def odd_service(rng: random.Random) -> str:
    """A service.name an attacker would send: empty, path-like, control characters, very long."""
    pick = rng.randrange(20)
    if pick == 0:
        return rng.choice(["", ".", "..", "/", "\x00", "../../etc", "service=a/date=b"])
    if pick < 8:
        return "".join(rng.choice(_ODD_PIECES) for _ in range(rng.randint(1, 30)))
    if pick < 17:  # around the file-name limit (255 bytes), in characters of 1 to 4 UTF-8 bytes
        piece = rng.choice(["a", "é", "💥", "/", ".."])
        return (piece * rng.choice([64, 85, 86, 128, 255, 256, 300, 1024, 4096]))[:4096]
    return "s" * big_size(rng, [10_000, 100_000], 1_000_000)


def _deep_value(rng: random.Random, depth: int) -> bytes:
    """An AnyValue nested `depth` deep in arrays and key-value lists (raw bytes: no recursion here)."""
    value = _field(1, b"leaf")
    for _ in range(depth):
        if rng.random() < 0.5:
            value = _field(5, _field(1, value))  # array_value { values: [value] }
        else:
            value = _field(6, _field(1, _field(1, b"k") + _field(2, value)))  # kvlist_value { k: value }
    return value


def _with_span_bytes(request: ExportTraceServiceRequest, extra: bytes) -> bytes:
    """The request with `extra` (span fields) appended to its first span, re-framed by hand."""
    resource = request.resource_spans[0]
    scope = resource.scope_spans[0]
    first, rest = scope.spans[0], list(scope.spans[1:])
    scope_bytes = _field(1, scope.scope.SerializeToString()) + _field(2, first.SerializeToString() + extra)
    scope_bytes += b"".join(_field(2, s.SerializeToString()) for s in rest)
    resource_bytes = _field(1, resource.resource.SerializeToString()) + _field(2, scope_bytes)
    return _field(1, resource_bytes)


def mutate(rng: random.Random, body: bytes) -> bytes:
    """A damaged protobuf body: bit flips, a cut, inserted bytes, a corrupted length or varint."""
    data = bytearray(body)
    for _ in range(rng.randint(1, 3)):
        how = rng.randrange(6)
        if how == 0 and data:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif how == 1 and data:
            del data[rng.randrange(len(data)) :]
        elif how == 2:
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif how == 3:  # a length-delimited field's length set to a lie (0, huge, 10-byte varint)
            tags = [i for i, b in enumerate(data[:-1]) if b & 7 == 2]
            if tags:
                at = rng.choice(tags) + 1
                lie = rng.choice([b"\x00", b"\x7f", b"\xff\xff\xff\xff\x0f", b"\xff" * 9 + b"\x01", b"\x80" * 11])
                data[at : at + 1] = lie
        elif how == 4:  # an unknown or deprecated wire type (groups, 6, 7) with a huge field number
            at = rng.randrange(len(data) + 1)
            data[at:at] = _varint(rng.choice([1, 19000, 2**29 - 1]) << 3 | rng.choice([3, 4, 6, 7])) + b"\x01"
        else:
            data += rng.randbytes(rng.randint(1, 64))
    return bytes(data)


# -- HTTP ---------------------------------------------------------------------------------------------


def valid_export(rng, now_ns, use_json: bool, gzip_share: float = 0.3) -> Request:
    if use_json:
        export, ids = json_spans(rng, now_ns, VALID_SERVICE, rng.randint(1, 4))
        return Request(
            "valid-json",
            json.dumps(export).encode(),
            {"Content-Type": JSON},
            span_ids=ids,
            service=VALID_SERVICE,
            valid=True,
        )
    request, ids = spans_request(rng, now_ns, VALID_SERVICE, rng.randint(1, 4))
    body, headers = request.SerializeToString(), {"Content-Type": PROTOBUF}
    if rng.random() < gzip_share:
        body, headers["Content-Encoding"] = gzip.compress(body, 1), "gzip"
    return Request("valid-protobuf", body, headers, span_ids=ids, service=VALID_SERVICE, valid=True)


def tracked_protobuf(rng, now_ns) -> Request:
    """Well-framed protobuf with fresh ids and one hostile trait: odd service, huge or many values,
    extreme times, nesting past any sane depth, invalid UTF-8, two requests spliced together."""
    pick = rng.randrange(7)
    service = odd_service(rng) if pick == 0 else "hostile-odd"
    attributes, start = (), None
    if pick == 1:
        size = big_size(rng, [1000, 100_000], 3_000_000)
        attributes = [(rng.choice(["big", "", "\x00", "k" * 5000]), "v" * size)]
    elif pick == 2:
        attributes = [(f"key-{i}", str(i)) for i in range(big_size(rng, [100, 1000], 10_000))]
    elif pick == 3:
        start = rng.choice(
            [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 10**18 * 9, 86_400 * 10**9 * 366 * 300]
        )  # up to year 2554
    request, ids = spans_request(rng, now_ns, service, rng.randint(1, 3), attributes, start)
    body = request.SerializeToString()
    if pick == 4:
        body = _with_span_bytes(
            request,
            _field(
                9, _field(1, b"deep") + _field(2, _deep_value(rng, big_size(rng, [30, 99, 100, 101, 500], 3000, 0.1)))
            ),
        )
    elif pick == 5:  # a string field (the span name) that is not UTF-8
        body = _with_span_bytes(request, _field(5, rng.choice([b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"a\x80"])))
    elif pick == 6:  # concatenated messages merge: a valid request holding both
        other, more = spans_request(rng, now_ns, service, 2)
        body, ids = body + other.SerializeToString(), ids + more
    return Request(f"tracked-protobuf-{pick}", body, {"Content-Type": PROTOBUF}, span_ids=ids, service=service)


_NUMBERS = ["1e400", "-1e400", "Infinity", "-Infinity", "NaN", "1e20", "-1", "2.5", "18446744073709551616", "1e-400"]


def hostile_json(rng, now_ns) -> Request:
    pick = rng.randrange(8)
    service, ids = "hostile-json", ()
    if pick == 0:  # numbers JSON cannot hold, where OTLP wants integers or doubles
        number = rng.choice(_NUMBERS)
        quoted = rng.random() < 0.3
        where = rng.choice(["kind", "startTimeUnixNano", "intValue", "doubleValue", "droppedAttributesCount"])
        export, ids = json_spans(rng, now_ns, service)
        span = export["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        marker = "__NUMBER__"
        if where in ("intValue", "doubleValue"):
            span["attributes"] = [{"key": "n", "value": {where: marker}}]
        else:
            span[where] = marker
        text = json.dumps(export).replace(f'"{marker}"', f'"{number}"' if quoted else number)
        return Request(f"json-number-{where}", text.encode(), {"Content-Type": JSON}, span_ids=ids, service=service)
    if pick == 1:  # arrays / key-value lists nested deep inside an attribute value
        depth = rng.choice([50, 99, 100, 101, 300, 1000, 5000])
        head, tail = (
            ('{"arrayValue":{"values":[', "]}}")
            if rng.random() < 0.5
            else ('{"kvlistValue":{"values":[{"key":"k","value":', "}]}}")
        )
        export, ids = json_spans(rng, now_ns, service, attributes=[{"key": "deep", "value": "__DEEP__"}])
        text = json.dumps(export).replace('"__DEEP__"', head * depth + '{"stringValue":"x"}' + tail * depth)
        return Request(f"json-deep-{depth}", text.encode(), {"Content-Type": JSON}, span_ids=ids, service=service)
    if pick == 2:  # plain JSON nesting deeper than any parser's recursion
        depth = rng.choice([1000, 10_000, 100_000])
        text = (
            '{"resourceSpans":' + "[" * depth + "]" * depth + "}" if rng.random() < 0.5 else "[" * depth + "]" * depth
        )
        return Request("json-raw-deep", text.encode(), {"Content-Type": JSON})
    if pick == 3:  # wrong types anywhere in the tree
        export, _ = json_spans(rng, now_ns, service)
        junk = rng.choice([1, -1, 1.5, "x", None, True, [], {}, [1, 2], {"a": 1}, "0" * 40])
        target = rng.choice(["top", "resourceSpans", "resource", "scopeSpans", "spans", "span", "attributes", "value"])
        rs = export["resourceSpans"][0]
        span = rs["scopeSpans"][0]["spans"][0]
        if target == "top":
            export = junk
        elif target in ("resourceSpans",):
            export[target] = junk
        elif target in ("resource", "scopeSpans"):
            rs[target] = junk
        elif target == "spans":
            rs["scopeSpans"][0]["spans"] = junk
        elif target == "span":
            span[rng.choice(["traceId", "spanId", "name", "kind", "links", "events", "status"])] = junk
        else:
            span["attributes"] = junk if target == "attributes" else [{"key": "k", "value": junk}]
        return Request(f"json-type-{target}", json.dumps(export).encode(), {"Content-Type": JSON})
    if pick == 4:  # odd, long, path-like service names (tracked: nothing else is wrong)
        service = odd_service(rng)
        export, ids = json_spans(rng, now_ns, service)
        return Request(
            "json-odd-service", json.dumps(export).encode(), {"Content-Type": JSON}, span_ids=ids, service=service
        )
    if pick == 5:  # huge strings
        export, ids = json_spans(
            rng,
            now_ns,
            service,
            attributes=[{"key": "s", "value": {"stringValue": "x" * big_size(rng, [10**4, 10**5], 4 * 10**6)}}],
        )
        return Request(
            "json-huge-string", json.dumps(export).encode(), {"Content-Type": JSON}, span_ids=ids, service=service
        )
    if pick == 6:  # bytes that are not JSON text: invalid UTF-8, BOM, UTF-16, cut, trailing junk
        export, _ = json_spans(rng, now_ns, service)
        text = json.dumps(export).encode()
        body = rng.choice(
            [
                b"\xef\xbb\xbf" + text,
                text.decode().encode("utf-16"),
                text[: rng.randrange(len(text))],
                text + b"}garbage",
                text.replace(b"op-0", b"op-\xff\xfe"),
                b"",
                b"null",
                b"\x00" * 64,
                rng.randbytes(256),
            ]
        )
        return Request("json-bytes", body, {"Content-Type": JSON})
    return Request("json-random", json.dumps(_random_json(rng, 4)).encode(), {"Content-Type": JSON})


def _random_json(rng: random.Random, depth: int):
    keys = ["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "attributes", "value", "kind", "x"]
    if depth == 0 or rng.random() < 0.3:
        return rng.choice([None, True, 0, -1, 1e308, "", "x" * rng.randrange(50), "0af7651916cd43dd8448eb211c80319c"])
    if rng.random() < 0.5:
        return [_random_json(rng, depth - 1) for _ in range(rng.randrange(4))]
    return {rng.choice(keys): _random_json(rng, depth - 1) for _ in range(rng.randrange(4))}
