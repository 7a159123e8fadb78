"""Fuzzing the OTLP/HTTP receiver with hypothesis: every bad body gets a 4xx, the server stays up,
and what was stored before is intact. A body is accepted exactly when it is a valid OTLP message."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from helpers import local_collector
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.collector.otlp_json import decode_json
from lightning_otel.collector.span_rows import decode_request


def _valid_body() -> bytes:
    return request_bytes(make_spans(lambda t: [t.start_span(f"seed-{i}").end() for i in range(3)]))


VALID = _valid_body()


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    with local_collector(tmp_path_factory.mktemp("fuzz") / "d", max_body_bytes=256 * 1024) as running:
        assert post(running.http_endpoint + "/v1/traces", VALID)[0] == 200
        running.flush()
        yield running


def _mutations():
    flip = st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)).map(
        lambda p: VALID[: p[0]] + bytes([VALID[p[0]] ^ p[1]]) + VALID[p[0] + 1 :]
    )
    truncate = st.integers(0, len(VALID) - 1).map(lambda n: VALID[:n])
    return st.one_of(st.binary(max_size=2048), flip, truncate)


def _expect_protobuf(body: bytes) -> int:
    try:
        decode_request(body)
    except ValueError:
        return 400
    return 200


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_mutations())
def test_protobuf_bodies(collector, body):
    status = post(collector.http_endpoint + "/v1/traces", body)[0]
    assert status == _expect_protobuf(body)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.one_of(
        st.text(max_size=300),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
            lambda children: st.one_of(
                st.lists(children, max_size=4),
                st.dictionaries(
                    st.sampled_from(["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "attributes", "x"]),
                    children,
                    max_size=4,
                ),
            ),
            max_leaves=20,
        ).map(json.dumps),
    )
)
def test_json_bodies(collector, text):
    body = text.encode()
    try:
        decode_json(body)
        expected = 200
    except ValueError:
        expected = 400
    assert post(collector.http_endpoint + "/v1/traces", body, "application/json")[0] == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.integers(1, 40), content_type=st.sampled_from(["text/plain", "application/xml", "", "application/protobuf"])
)
def test_truncated_gzip_and_wrong_content_types(collector, cut, content_type):
    url = collector.http_endpoint + "/v1/traces"
    compressed = gzip.compress(VALID)
    assert post(url, compressed[:-cut], headers={"Content-Encoding": "gzip"})[0] == 400
    assert post(url, VALID, content_type)[0] == 415


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_invalid_ids_are_rejected_per_span(collector, seed):
    rng = random.Random(seed)
    request = encode_spans(make_spans(lambda t: [t.start_span(f"fuzz-id-{i}").end() for i in range(4)]))
    spans = request.resource_spans[0].scope_spans[0].spans
    bad = rng.sample(range(4), rng.randint(1, 4))
    for index in bad:
        field = rng.choice(["trace_id", "span_id", "parent_span_id"])
        setattr(spans[index], field, rng.randbytes(rng.choice([1, 3, 7, 9, 15, 17])))
    status, _, reply = post(collector.http_endpoint + "/v1/traces", request.SerializeToString())
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    assert status == 200
    assert ExportTraceServiceResponse.FromString(reply).partial_success.rejected_spans == len(bad)


def test_oversize_and_bombs_then_the_earlier_data_is_intact(collector):
    url = collector.http_endpoint + "/v1/traces"
    assert post(url, b"\x00" * (300 * 1024))[0] == 413
    assert post(url, gzip.compress(b"\x00" * (50 * 1024 * 1024)), headers={"Content-Encoding": "gzip"})[0] == 413
    collector.flush()
    original = decode_request(VALID).resource_spans[0].scope_spans[0].spans
    expected = sorted((s.trace_id.hex(), s.span_id.hex(), s.name) for s in original)
    keys = ", ".join(f"('{trace_id}', '{span_id}')" for trace_id, span_id, _ in expected)
    rows = (
        connect(collector.data_dir)
        .execute(f"SELECT trace_id, span_id, name FROM spans WHERE (trace_id, span_id) IN ({keys}) ORDER BY 1, 2")
        .fetchall()
    )
    # Every original row is still there, unchanged. Valid mutants that reuse an id with other
    # content (a sender bug) are stored too and are not merged with the original.
    assert set(expected) <= set(rows)
    assert post(url, VALID)[0] == 200  # still serving
