"""The compiled span decoder (collector/lightning_otel/collector/_spans_codec.c) against the pure-Python reference path.

Every request the reference decodes must give the same rows through the fast path, whatever the
attribute values (generated below, including the shapes the C code hands back to Python).
"""

from __future__ import annotations

import base64
import math
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from lightning_otel.collector import span_decoder, span_rows
from lightning_otel.collector.span_decoder import _fast_batch, batch_from_body
from lightning_otel.core import schema
from lightning_otel.testing.payloads import build_request

NAN = "<nan>"


def _normal(value):
    """to_pylist() output with NaN made comparable."""
    if isinstance(value, float) and math.isnan(value):
        return NAN
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    return value


def reference(body: bytes):
    return span_rows.to_batch([span_rows.decode_request(body)])


def assert_same(body: bytes) -> None:
    fast, ref = _fast_batch(body), reference(body)
    assert fast.schema == ref.schema
    assert _normal(fast.to_pylist()) == _normal(ref.to_pylist())


def test_the_extension_is_built_here():
    # `make test` installs the package with a C compiler present: the fast path must be there.
    assert span_decoder.available(), (
        "collector/lightning_otel/collector/_spans_codec.c was not built into the installed package"
    )


@pytest.mark.parametrize(
    "training,plain,encoding",
    [(False, False, "bytes"), (True, False, "bytes"), (True, True, "bytes"), (True, False, "base64")],
)
def test_benchmark_payloads_decode_the_same(training, plain, encoding, monkeypatch):
    from lightning_otel.core import token_encoding

    monkeypatch.setattr(token_encoding, "_encoding", encoding)  # restored after the test
    assert_same(build_request(30, training=training, seed=5, plain_arrays=plain))


# -- generated requests ---------------------------------------------------------------------------
_int64 = st.integers(-(2**63), 2**63 - 1)
_scalar = st.one_of(
    st.builds(lambda s: AnyValue(string_value=s), st.text(max_size=20)),
    st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
    st.builds(lambda i: AnyValue(int_value=i), _int64),
    st.builds(lambda d: AnyValue(double_value=d), st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=24)),
    st.just(AnyValue()),
)
_array = st.builds(lambda vs: AnyValue(array_value=ArrayValue(values=vs)), st.lists(_scalar, max_size=4))
_ints = st.builds(
    lambda vs: AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=v) for v in vs])),
    st.lists(st.integers(-(2**33), 2**33), max_size=6),
)
_kvlist = st.builds(
    lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in kvs])),
    st.lists(st.tuples(st.text(max_size=5), _scalar), max_size=3),
)
_packed = st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=40))
_b64 = st.one_of(
    st.builds(lambda b: AnyValue(string_value=base64.b64encode(b).decode()), st.binary(max_size=40)),
    st.just(AnyValue(string_value="not base64!")),
)
_value = st.one_of(_scalar, _array, _ints, _kvlist, _packed, _b64)
_key = st.one_of(
    st.sampled_from(sorted(span_rows.SLOTS)),
    st.sampled_from(["a", "", "llm.input_messages.0.message.role"]),
    st.text(max_size=8),
)
_attributes = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), _key, _value), max_size=12)


@st.composite
def _span(draw) -> Span:
    span = Span(
        trace_id=draw(st.sampled_from([16, 16, 0, 3])) * b"\x01",
        span_id=draw(st.binary(min_size=8, max_size=8)),
        parent_span_id=draw(st.sampled_from([b"", b"\x02" * 8])),
        name=draw(st.text(max_size=12)),
        kind=draw(st.integers(-2, 8)),
        start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        end_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
    )
    span.attributes.extend(draw(_attributes))
    span.status.code = draw(st.integers(-1, 4))
    span.status.message = draw(st.text(max_size=6))
    for _ in range(draw(st.integers(0, 2))):
        event = span.events.add(name=draw(st.text(max_size=5)), time_unix_nano=draw(st.integers(0, 2**64 - 1)))
        event.attributes.extend(
            draw(st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), _key, _scalar), max_size=2))
        )
    return span


@st.composite
def _request(draw) -> bytes:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        resource_spans = request.resource_spans.add()
        resource = draw(
            st.lists(
                st.builds(
                    lambda k, v: KeyValue(key=k, value=v),
                    st.sampled_from([schema.SERVICE_NAME, "host", "", "x"]),
                    _value,
                ),
                max_size=4,
            )
        )
        resource_spans.resource.attributes.extend(resource)
        for _ in range(draw(st.integers(0, 2))):
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = draw(st.text(max_size=6))
            scope_spans.spans.extend(draw(st.lists(_span(), max_size=3)))
    return request.SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_request())
def test_generated_requests_decode_the_same(body):
    assert_same(body)


def test_fields_out_of_order_decode_the_same():
    # Protobuf allows any field order: scope after its spans, resource after its scope spans.
    request = ExportTraceServiceRequest.FromString(build_request(3, training=True, seed=2))
    resource_spans = request.resource_spans[0]
    scope = resource_spans.scope_spans[0].scope.SerializeToString()
    spans = b"".join(
        b"\x12" + _varint(len(raw)) + raw
        for raw in (s.SerializeToString() for s in resource_spans.scope_spans[0].spans)
    )
    scope_spans = spans + b"\x0a" + _varint(len(scope)) + scope  # spans (field 2) first, then the scope (field 1)
    resource = resource_spans.resource.SerializeToString()
    body_rs = b"\x12" + _varint(len(scope_spans)) + scope_spans + b"\x0a" + _varint(len(resource)) + resource
    body = b"\x0a" + _varint(len(body_rs)) + body_rs
    assert reference(body).num_rows == 3
    assert_same(body)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_unusual_shapes_go_to_the_reference_decoder():
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="x")
    span.status.code = 2
    twice = span.SerializeToString() + b"\x7a" + _varint(2) + b"\x18\x01"  # a second status (field 15): merged
    scope = b"\x12" + _varint(len(twice)) + twice
    rs = b"\x12" + _varint(len(scope)) + scope
    body = b"\x0a" + _varint(len(rs)) + rs
    with pytest.raises(span_decoder._spans_codec.Fallback):
        _fast_batch(body)
    assert _normal(batch_from_body(body).to_pylist()) == _normal(reference(body).to_pylist())  # merged status: OK
    assert batch_from_body(body).column("status_code").to_pylist() == ["OK"]


def test_corrupted_bodies_never_crash_and_agree_when_the_reference_decodes():
    rng = random.Random(7)
    base = build_request(4, training=True, seed=1)
    for trial in range(600):
        body = bytearray(base)
        if trial % 3 == 0:
            body = body[: rng.randrange(len(body))]
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        body = bytes(body)
        try:
            ref = reference(body)
        except ValueError:
            try:  # the receiver rejects such bodies before they are logged; the decoder must only not crash
                _fast_batch(body)
            except ValueError:
                pass
            continue
        assert _normal(batch_from_body(body).to_pylist()) == _normal(ref.to_pylist())


def test_pure_python_switch(monkeypatch):
    monkeypatch.setenv("LIGHTNING_OTEL_PURE_PYTHON", "1")
    assert not span_decoder.available()
    body = build_request(2, training=True, seed=3)
    assert _normal(batch_from_body(body).to_pylist()) == _normal(reference(body).to_pylist())


def test_packed_arrays_are_copied_exactly():
    values = list(range(-5, 4096))
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    span.attributes.add(
        key=schema.PACKED_PROMPT_TOKEN_IDS, value=AnyValue(bytes_value=struct.pack(f"<{len(values)}i", *values))
    )
    span.attributes.add(
        key=schema.PACKED_COMPLETION_LOGPROBS, value=AnyValue(bytes_value=struct.pack("<2d", -0.5, float("-inf")))
    )
    batch = _fast_batch(request.SerializeToString())
    assert batch.column("prompt_token_ids").to_pylist() == [values]
    assert batch.column("completion_logprobs").to_pylist() == [[-0.5, float("-inf")]]
    assert batch.column("completion_token_ids").to_pylist() == [None]


@pytest.mark.parametrize("packed_as", ["bytes", "base64"])
def test_a_packed_array_wins_over_a_plain_one_in_either_order(packed_as):
    packed = struct.pack("<2i", 3, 4)
    packed_value = (
        AnyValue(bytes_value=packed)
        if packed_as == "bytes"
        else AnyValue(string_value=base64.b64encode(packed).decode())
    )
    plain_value = AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(int_value=2)]))
    for order in (
        ((schema.PROMPT_TOKEN_IDS, plain_value), (schema.PACKED_PROMPT_TOKEN_IDS, packed_value)),
        ((schema.PACKED_PROMPT_TOKEN_IDS, packed_value), (schema.PROMPT_TOKEN_IDS, plain_value)),
    ):
        request = ExportTraceServiceRequest()
        span = request.resource_spans.add().scope_spans.add().spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
        for key, value in order:
            span.attributes.add(key=key, value=value)
        body = request.SerializeToString()
        assert _fast_batch(body).column("prompt_token_ids").to_pylist() == [[3, 4]]
        assert_same(body)


def test_reused_freed_memory_leaves_no_stale_values_or_nulls():
    # Conversion workers keep freed heap blocks (span_decoder.keep_freed_memory): a request's token
    # buffers, offsets and null bitmaps then land on bytes an earlier one left behind, not on zeroed
    # pages. Fill freed memory with set bits first; every row must still hold exactly what was sent.
    assert span_decoder.keep_freed_memory(), "glibc here: the workers' allocator setting must take"
    with pytest.raises(ValueError):
        span_decoder._spans_codec.keep_freed_memory(0)
    rng = random.Random(7)
    for _ in range(4):
        expected_prompts, expected_logprobs = [], []
        request = ExportTraceServiceRequest()
        spans = request.resource_spans.add().scope_spans.add().spans
        for row in range(rng.randrange(9, 70)):
            span = spans.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name=f"s{row}")
            prompt = [rng.randrange(-(2**31), 2**31) for _ in range(rng.choice((0, 1, 300, 5000)))]
            if rng.random() < 0.7:  # else no prompt ids: a null row
                packed = struct.pack(f"<{len(prompt)}i", *prompt)
                span.attributes.add(key=schema.PACKED_PROMPT_TOKEN_IDS, value=AnyValue(bytes_value=packed))
                expected_prompts.append(prompt)
            else:
                expected_prompts.append(None)
            logprobs = [rng.uniform(-30.0, 0.0) for _ in range(rng.randrange(0, 40))]
            if row % 3:
                packed = struct.pack(f"<{len(logprobs)}d", *logprobs)
                span.attributes.add(key=schema.PACKED_COMPLETION_LOGPROBS, value=AnyValue(bytes_value=packed))
                expected_logprobs.append(logprobs)
            else:
                expected_logprobs.append(None)
        body = request.SerializeToString()
        for size in (24, 40, 100, 5000, 1 << 20, 8 << 20):  # freed blocks of every size class, all bits set
            junk = [bytearray(b"\xff" * size) for _ in range(max(1, (16 << 20) // size // 8))]
            del junk
        batch = _fast_batch(body)
        assert batch.column("prompt_token_ids").to_pylist() == expected_prompts
        assert batch.column("completion_logprobs").to_pylist() == expected_logprobs
        assert batch.column("completion_token_ids").null_count == len(expected_prompts)
        assert_same(body)
