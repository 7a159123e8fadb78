"""instrument/lightning_otel/instrumentation/otlp_encoding.py writes the bytes the OTLP exporter's own encoder (`encode_spans`)
serializes, for spans made by the real SDK (generated), for values only a hand-made ReadableSpan
holds, and for attributes neither can encode; `instrument()`'s exporter sends them, and falls back to
the SDK's encoder when ours fails."""

from __future__ import annotations

import http.server
import logging
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from lightning_otel.instrumentation import configure, otlp_encoding
from lightning_otel.instrumentation.otlp_encoding import encode_request

INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
SCALARS = st.one_of(st.text(max_size=30), st.booleans(), INT64, st.floats(allow_nan=False), st.binary(max_size=40))
ARRAYS = st.one_of(
    st.lists(st.text(max_size=5), max_size=4),
    st.lists(INT64, max_size=4),
    st.lists(st.floats(allow_nan=False), max_size=4),
    st.lists(st.booleans(), max_size=4),
)  # fmt: skip  (the SDK keeps homogeneous sequences only)
ATTRIBUTES = st.dictionaries(st.text(max_size=12), st.one_of(SCALARS, ARRAYS), max_size=8)
SPAN = st.fixed_dictionaries(
    {
        "name": st.text(max_size=20),
        "kind": st.sampled_from(list(SpanKind)),
        "attributes": ATTRIBUTES,
        "events": st.lists(st.tuples(st.text(max_size=8), ATTRIBUTES), max_size=2),
        "status": st.sampled_from([None, (StatusCode.OK, None), (StatusCode.ERROR, "boom"), (StatusCode.ERROR, None)]),
        "parent": st.sampled_from(["none", "local", "remote"]),
        "link": st.booleans(),
        "scope": st.integers(0, 2),
    }
)


def _finished(specs: list[dict], limits: SpanLimits | None = None) -> list[ReadableSpan]:
    """Spans made by the SDK from the specs, under two resources and three scopes."""
    memory = InMemorySpanExporter()
    providers = [
        TracerProvider(resource=Resource.create({"service.name": name, "n": i}), span_limits=limits)
        for i, name in enumerate("ab")
    ]
    for provider in providers:
        provider.add_span_processor(SimpleSpanProcessor(memory))
    scopes = [("s0", None, None, None), ("s1", "1.2", "https://schema", {"k": "v"}), ("s2", "", None, {"n": 3})]
    state = TraceState([("vendor", "x1")])
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state)
    local = SpanContext(0x123, 0x456, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    for i, spec in enumerate(specs):
        name, version, schema_url, attributes = scopes[spec["scope"]]
        tracer = providers[i % 2].get_tracer(name, version, schema_url=schema_url, attributes=attributes)
        parent = {"none": None, "local": local, "remote": remote}[spec["parent"]]
        context = set_span_in_context(NonRecordingSpan(parent)) if parent else None
        links = [Link(remote, {"l": 1})] if spec["link"] else []
        span = tracer.start_span(
            spec["name"], context=context, kind=spec["kind"], attributes=spec["attributes"], links=links
        )
        for event_name, event_attributes in spec["events"]:
            span.add_event(event_name, event_attributes)
        if spec["status"]:
            span.set_status(Status(*spec["status"]))
        span.end()
    return list(memory.get_finished_spans())


def _same_as_sdk(spans) -> bytes:
    """Our bytes (through the compiled encoder where it takes the span, and through the Python one
    alone) are the OTLP exporter's bytes."""
    theirs = encode_spans(spans).SerializeToString()
    ours = encode_request(spans)
    compiled, otlp_encoding._compiled = otlp_encoding._compiled, None
    try:
        pure = encode_request(spans)
    finally:
        otlp_encoding._compiled = compiled
    assert ours == pure == theirs
    assert ExportTraceServiceRequest.FromString(ours) == encode_spans(spans)
    return ours


def test_the_compiled_encoder_is_built():
    """CI installs with a compiler: the fast path must exist there (it is optional only for installs
    without one), or the tests below would compare the Python encoder with itself."""
    assert otlp_encoding._compiled is not None


PLAIN = st.one_of(
    st.none(),
    st.text(max_size=30),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False),
    st.binary(max_size=40),
    st.text(min_size=200, max_size=300),
    st.lists(st.text(max_size=8), max_size=3).map(tuple),  # string[] (gen_ai.response.finish_reasons)
)
HAND_MADE = st.fixed_dictionaries(
    {
        "name": st.text(max_size=20),
        "kind": st.sampled_from(list(SpanKind)),
        "attributes": st.dictionaries(st.text(max_size=12), PLAIN, max_size=10),
        "parent": st.sampled_from([None, False, True]),
        "times": st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1)),
        "status": st.sampled_from(
            [
                Status(StatusCode.UNSET),
                Status(StatusCode.OK),
                Status(StatusCode.ERROR, "boom"),
                Status(StatusCode.ERROR),
            ]
        ),
        "ids": st.tuples(st.integers(1, (1 << 128) - 1), st.integers(1, (1 << 64) - 1)),
    }
)


@settings(max_examples=300, deadline=None)
@given(st.lists(HAND_MADE, min_size=1, max_size=5))
def test_the_lean_spans_shape_encodes_alike_through_the_compiled_path(specs):
    """Plain-dict attributes of scalar values, as DirectSpan ends with: the shape the compiled path
    takes (ids to 128 bits, uint64 times, ints beyond int64 logged and left out by both)."""
    resource = Resource.create({"service.name": "lean"})
    spans = []
    for spec in specs:
        trace_id, span_id = spec["ids"]
        context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        parent = None if spec["parent"] is None else SpanContext(trace_id, 99, is_remote=spec["parent"])
        spans.append(
            ReadableSpan(
                spec["name"],
                context,
                parent,
                resource,
                dict(spec["attributes"]),
                kind=spec["kind"],
                status=spec["status"],
                start_time=spec["times"][0],
                end_time=spec["times"][1],
            )
        )
    _same_as_sdk(spans)
    if otlp_encoding._compiled is not None:
        taken = [otlp_encoding._compiled.span_bytes(span) is not None for span in spans]
        fits = [
            all(not isinstance(v, int) or -(1 << 63) <= v < 1 << 63 for v in span.attributes.values()) for span in spans
        ]
        assert taken == fits  # the compiled path took every span it can encode


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SPAN, min_size=1, max_size=6))
def test_sdk_spans_encode_to_the_exporters_bytes(specs):
    _same_as_sdk(_finished(specs))


@settings(max_examples=30, deadline=None)
@given(st.lists(SPAN, min_size=1, max_size=3))
def test_dropped_counts_and_cut_values_encode_alike(specs):
    _same_as_sdk(_finished(specs, SpanLimits(max_span_attributes=2, max_event_attributes=1, max_attribute_length=3)))


def _readable(attributes: dict) -> ReadableSpan:
    context = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return ReadableSpan(
        "hand-made", context, attributes=attributes, resource=Resource.create({"r": "x"}), start_time=5, end_time=9
    )


def test_values_only_a_hand_made_span_holds_encode_alike():
    """Mappings (kvlist), None in arrays, mixed arrays, long values (multi-byte lengths), subclasses."""

    class Text(str):
        pass

    class Number(int):
        pass

    spans = [
        _readable(
            {
                "map": {"a": 1, "b": [1, "x", None], "c": {"d": b"\x00"}},
                "none": None,
                "mixed": (1, "a", 2.5, True),
                "long": "é" * 20_000,
                "blob": bytes(70_000),
                "sub": Text("t"),
                "subint": Number(7),
                "neg": -1,
                "zero": 0,
                "empty": "",
                "": "no key",
                "false": False,
                "bytearray": bytearray(b"ab"),
            }
        )
    ]
    _same_as_sdk(spans)


def test_an_attribute_neither_can_encode_is_left_out_and_logged(caplog):
    spans = [_readable({"ok": 1, "too_big": 1 << 64, "surrogate": "\ud800", "object": object(), "after": "kept"})]
    ours = _same_as_sdk(spans)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=otlp_encoding.__name__):
        encode_request(spans)
    kept = [
        kv.key for kv in ExportTraceServiceRequest.FromString(ours).resource_spans[0].scope_spans[0].spans[0].attributes
    ]
    assert kept == ["ok", "after"]
    ours_logged = [
        r for r in caplog.records if r.name == otlp_encoding.__name__ and "Failed to encode key" in r.getMessage()
    ]
    assert len(ours_logged) == 3


class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self):
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Receiver.bodies = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", _Receiver.bodies
    finally:
        server.shutdown()
        server.server_close()


def test_instruments_exporter_sends_our_bytes_and_falls_back_to_the_sdks(receiver, monkeypatch):
    url, bodies = receiver
    spans = _finished(
        [
            {
                "name": "x",
                "kind": SpanKind.CLIENT,
                "attributes": {"a": 1},
                "events": [],
                "status": None,
                "parent": "none",
                "link": False,
                "scope": 0,
            }
        ]
    )
    exporter = configure._CountingExporter(endpoint=url, timeout=5)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    assert bodies == [encode_request(spans)]

    def broken(_spans):
        raise RuntimeError("encoder bug")

    monkeypatch.setattr(configure, "encode_request", broken)
    assert exporter.export(spans) == SpanExportResult.SUCCESS  # the SDK's encoder sent it instead
    assert ExportTraceServiceRequest.FromString(bodies[1]) == encode_spans(spans)
    monkeypatch.undo()

    small = configure._CountingExporter(endpoint=url, timeout=5, max_request_size=10)
    assert small.export(spans) == SpanExportResult.FAILURE  # over the size limit: dropped, counted, not sent
    assert (small.failed, len(bodies)) == (1, 2)
