"""The receiver's quick check (collector/lightning_otel/collector/_request_check.c) against upb.

Whenever the check gives a span count, upb must parse the same body, find no span with bad ids,
and count the same spans: a body the check lets through unparsed is one the parse would have
accepted whole. And for ordinary exports it must give that count, or the receiver saves nothing.
Bodies are hand-encoded here (an encoder independent of the one under test) where upb's own
serializer cannot produce them: invalid UTF-8, unknown fields, wrong wire types, repeated ids.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from lightning_otel.collector import request_check
from lightning_otel.collector.ingest import drop_invalid_spans
from lightning_otel.collector.span_rows import count_spans, decode_request
from lightning_otel.testing.payloads import build_request

TRACE = b"\x01" * 16
SPAN = b"\x02" * 8


def upb_answer(body: bytes) -> tuple[int, int] | None:
    """(spans kept, spans with bad ids) as the upb path sees them, or None if it cannot parse."""
    try:
        request = decode_request(body)
    except ValueError:
        return None
    rejected = drop_invalid_spans(request)
    return count_spans(request), rejected


def assert_agrees(body: bytes) -> int | None:
    fast = request_check.span_count(body)
    if fast is not None:
        assert upb_answer(body) == (fast, 0), body[:200]
    return fast


# -- a hand encoder -------------------------------------------------------------------------------
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:  # length-delimited
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def request_of(*spans: bytes) -> bytes:
    scope_spans = b"".join(field(2, span) for span in spans)
    return field(1, field(2, scope_spans))


def span_of(name: bytes = b"s", trace_id: bytes = TRACE, span_id: bytes = SPAN, extra: bytes = b"") -> bytes:
    return field(1, trace_id) + field(2, span_id) + field(5, name) + extra


# -- tests ----------------------------------------------------------------------------------------
def test_the_extension_is_built_here():
    assert request_check.available(), "collector/lightning_otel/collector/_request_check.c was not built"


@pytest.mark.parametrize(
    "training,plain,encoding",
    [(False, False, "bytes"), (True, False, "bytes"), (True, True, "bytes"), (True, False, "base64")],
)
def test_benchmark_payloads_are_counted_without_a_parse(training, plain, encoding, monkeypatch):
    from lightning_otel.core import token_encoding

    monkeypatch.setattr(token_encoding, "_encoding", encoding)
    body = build_request(40, training=training, seed=3, plain_arrays=plain)
    assert assert_agrees(body) == 40


def test_utf8_is_checked_as_strictly_as_upb_and_python_do():
    samples = [
        b"plain ascii, longer than eight bytes",
        "é ü 漢字 😀 \U0010ffff".encode(),
        b"\xc3",  # truncated 2-byte form
        b"\xc0\xaf",  # overlong '/'
        b"\xe0\x80\xaf",  # overlong, 3 bytes
        b"\xed\xa0\x80",  # a surrogate
        b"\xf0\x82\x82\xac",  # overlong, 4 bytes
        b"\xf4\x90\x80\x80",  # above U+10FFFF
        b"\xf5\x80\x80\x80",
        b"\x80",
        b"abcdefgh\xffabcdefgh",  # a bad byte after a fast-path word
        b"\xe2\x82",  # truncated at the end
    ]
    rng = random.Random(3)
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))) for _ in range(3000)]
    samples += [bytes(rng.choice(b"a\x80\xbf\xc2\xdf\xe0\xed\xef\xf0\xf4") for _ in range(6)) for _ in range(3000)]
    for name in samples:
        try:
            name.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        body = request_of(span_of(name=name))
        assert (assert_agrees(body) == 1) == valid, name
        assert (upb_answer(body) is not None) == valid, name  # upb checks too: a 400 either way


def test_bad_ids_are_left_to_the_parse_that_drops_them():
    for trace_id, span_id, parent in [
        (b"", SPAN, b""),
        (TRACE[:15], SPAN, b""),
        (TRACE, SPAN + b"\x00", b""),
        (TRACE, SPAN, b"\x03" * 4),
    ]:
        extra = field(4, parent) if parent else b""
        body = request_of(span_of(trace_id=trace_id, span_id=span_id, extra=extra), span_of())
        assert request_check.span_count(body) is None
        assert upb_answer(body) == (1, 1)
    # protobuf: the last value of a singular field wins, so a bad id followed by a good one is good
    body = request_of(field(1, b"short") + span_of())
    assert assert_agrees(body) == 1


def test_what_the_check_is_not_sure_of_goes_to_upb():
    cases = {
        "unknown field": span_of(extra=field(99, b"x")),
        "known field, wrong wire type": span_of(extra=varint(5 << 3 | 0) + varint(1)),  # name as a varint
        # ... where reading the varint as a length would make sense of the bytes after it
        "wrong wire type, then bytes": varint(5 << 3 | 0) + varint(3) + b"abc" + span_of(),
        "kind as a length-delimited field": varint(6 << 3 | 2) + varint(2) + b"\x30\x01" + span_of(),
        "start time as a varint": varint(7 << 3 | 0) + b"\x01" + b"\x00" * 7 + span_of(),
        "flags as a varint": varint(16 << 3 | 0) + b"\x01\x00\x00\x00" + span_of(),
        "group": span_of(extra=varint(30 << 3 | 3) + varint(30 << 3 | 4)),
        "truncated length": span_of()[:-1],
    }
    for what, span in cases.items():
        body = request_of(span)
        assert request_check.span_count(body) is None, what
    assert upb_answer(request_of(cases["unknown field"])) == (1, 0)  # accepted by the parse, as before
    assert upb_answer(request_of(cases["truncated length"])) is None
    nested = AnyValue(string_value="leaf")
    for _ in range(40):
        nested = AnyValue(array_value=ArrayValue(values=[nested]))
    deep = Span(trace_id=TRACE, span_id=SPAN, attributes=[KeyValue(key="deep", value=nested)])
    body = ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [deep]}]}]).SerializeToString()
    assert request_check.span_count(body) is None
    assert upb_answer(body) == (1, 0)


def test_empty_and_garbage_bodies():
    assert request_check.span_count(b"") == 0
    assert upb_answer(b"") == (0, 0)
    for garbage in [b"\xff\xfe not protobuf \x00\x01", b"\x0a", b"\x0a\x05abc", b"\x00", b"\x0a\x80\x80\x80\x80\x80"]:
        assert request_check.span_count(garbage) is None
        assert upb_answer(garbage) is None


_text = st.text(max_size=10)
_scalar = st.one_of(
    st.builds(lambda s: AnyValue(string_value=s), _text),
    st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
    st.builds(lambda i: AnyValue(int_value=i), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda d: AnyValue(double_value=d), st.floats()),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=16)),
    st.just(AnyValue()),
)
_value = st.one_of(
    _scalar,
    st.builds(lambda vs: AnyValue(array_value=ArrayValue(values=vs)), st.lists(_scalar, max_size=3)),
    st.builds(
        lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in kvs])),
        st.lists(st.tuples(_text, _scalar), max_size=3),
    ),
)
_attributes = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), _text, _value), max_size=5)


@st.composite
def _span(draw) -> Span:
    span = Span(
        trace_id=draw(st.sampled_from([16, 16, 16, 0, 3])) * b"\x01",
        span_id=draw(st.sampled_from([8, 8, 8, 7])) * b"\x02",
        parent_span_id=draw(st.sampled_from([b"", b"\x03" * 8, b"\x03" * 8, b"\x03"])),
        trace_state=draw(_text),
        name=draw(_text),
        kind=draw(st.integers(-2, 8)),
        start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        flags=draw(st.integers(0, 2**32 - 1)),
        dropped_attributes_count=draw(st.integers(0, 2**32 - 1)),
    )
    span.attributes.extend(draw(_attributes))
    span.status.code = draw(st.integers(0, 2))
    span.status.message = draw(_text)
    for _ in range(draw(st.integers(0, 2))):
        event = span.events.add(name=draw(_text), time_unix_nano=draw(st.integers(0, 2**64 - 1)))
        event.attributes.extend(draw(_attributes))
    for _ in range(draw(st.integers(0, 1))):
        link = span.links.add(trace_id=TRACE, span_id=SPAN, trace_state=draw(_text))
        link.attributes.extend(draw(_attributes))
    return span


@st.composite
def _request(draw) -> bytes:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        resource_spans = request.resource_spans.add(schema_url=draw(_text))
        resource_spans.resource.attributes.extend(draw(_attributes))
        for _ in range(draw(st.integers(0, 2))):
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = draw(_text)
            scope_spans.scope.version = draw(_text)
            scope_spans.scope.attributes.extend(draw(_attributes))
            scope_spans.spans.extend(draw(st.lists(_span(), max_size=3)))
    return request.SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_request())
def test_generated_requests(body):
    fast = assert_agrees(body)
    expected = upb_answer(body)
    if expected[1] == 0:  # every span valid: the check must vouch for it
        assert fast == expected[0]
    else:
        assert fast is None


def test_corrupted_bodies_are_never_let_through_when_upb_would_refuse_them():
    rng = random.Random(11)
    base = build_request(3, training=True, seed=2)
    let_through = 0
    for trial in range(1500):
        body = bytearray(base)
        if trial % 3 == 0:
            body = body[: rng.randrange(len(body))]
        for _ in range(rng.randint(1, 3)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        let_through += assert_agrees(bytes(body)) is not None
    assert let_through > 0  # some corruptions (inside a text or a byte array) leave a valid request
