"""Hostile exports on the ingest side (issue 34): values that once broke conversion, records the
converter cannot read, decode errors that were 500s, size caps, and the log a client can cause.

Every acknowledged span ends in SQL exactly once, or in the quarantine with its reason, and the
collector says which when it stops.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path

import duckdb
import grpc
import pytest
from helpers import local_collector, wait_for
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from otlp_helpers import post

from lightning_otel.collector import connect, size_caps
from lightning_otel.collector.ingest import drop_invalid_spans
from lightning_otel.collector.otlp_json import decode_json
from lightning_otel.collector.pipeline import MAX_ATTEMPTS
from lightning_otel.collector.request_check import available, span_count
from lightning_otel.collector.span_rows import count_spans
from lightning_otel.collector.wal import GZIP, record_bytes
from lightning_otel.core.servers import free_port
from lightning_otel.testing.servers import CollectorProcess

pytestmark = pytest.mark.integration
PROTOBUF, JSON = "application/x-protobuf", "application/json"
_ids = random.Random(34)


def _export(service: str | None, names: list[str], attributes: dict | None = None) -> ExportTraceServiceRequest:
    """One resource (service.name = `service`), one span per name, each with `attributes`."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    if service is not None:
        kv = resource_spans.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", service
    scope = resource_spans.scope_spans.add()
    now = time.time_ns()
    for name in names:
        span = scope.spans.add()
        span.trace_id, span.span_id = _ids.randbytes(16), _ids.randbytes(8)
        span.name, span.start_time_unix_nano, span.end_time_unix_nano = name, now, now + 1000
        for key, value in (attributes or {}).items():
            kv = span.attributes.add()
            kv.key = key
            if isinstance(value, AnyValue):
                kv.value.CopyFrom(value)
            else:
                kv.value.string_value = value
    return request


def _names_in_files(data_dir) -> dict[str, int]:
    """name -> rows in the Parquet files themselves (no view's deduplication)."""
    rows = duckdb.execute(
        f"SELECT name, count(*) FROM read_parquet('{data_dir}/spans/**/*.parquet') GROUP BY name"
    ).fetchall()
    return dict(rows)


def _nested(depth: int, kind: str) -> AnyValue:
    value = AnyValue(string_value="bottom")
    for _ in range(depth):
        outer = AnyValue()
        if kind == "kvlist":
            kv = outer.kvlist_value.values.add()
            kv.key = "k"
            kv.value.CopyFrom(value)
        else:
            outer.array_value.values.add().CopyFrom(value)
        value = outer
    return value


# -- partition values from span data ---------------------------------------------------------------


def test_long_and_huge_service_names_reach_sql_exactly_once_with_their_segment(tmp_path, caplog):
    long_name, huge_name = "s" * 300, "h" * 10_000_000
    with local_collector(tmp_path / "data") as collector:  # converts on flush: all three share one segment
        url = collector.http_endpoint + "/v1/traces"
        exports = [("ok", ["ok-0", "ok-1"]), (long_name, ["long-0", "long-1"]), (huge_name, ["huge-0"])]
        for service, names in exports:
            status, _, body = post(url, _export(service, names).SerializeToString())
            assert status == 200, body[:200]
            assert ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 0
        collector.flush()
        assert collector.wal.segments() == []  # converted, not left for a retry
        conn = connect(collector.data_dir)
        found = dict(conn.execute("SELECT name, service_name FROM spans ORDER BY name").fetchall())
        # the views give the name only from the rows, never the (cut) directory value
        assert "service" not in [column[0] for column in conn.execute("SELECT * FROM spans_raw LIMIT 0").description]
        collector.stop()
        assert collector.conversion_report() == "all acknowledged spans are in Parquet"
    assert found == {
        "ok-0": "ok",
        "ok-1": "ok",
        "long-0": long_name,
        "long-1": long_name,
        "huge-0": huge_name,
    }
    assert _names_in_files(tmp_path / "data") == dict.fromkeys(found, 1)  # exactly once in the files
    parts = [path.name for path in (tmp_path / "data" / "spans").rglob("part-*.parquet")]
    assert len(parts) == 3 and len(set(parts)) == 1  # three services' files of one WAL segment
    for directory in (tmp_path / "data" / "spans").iterdir():
        assert len(directory.name) <= len("service=") + 96
    assert [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_services_that_share_a_directory_share_its_file_and_a_dotted_name_leaves_the_query_door_open(tmp_path):
    # No service.name, "" and "unknown" all go to service=unknown: one file for the three, not three
    # writes of one name that overwrite each other. "x.parquet" must not make a directory a glob of
    # *.parquet matches (the query door read it as a file and failed every statement).
    from lightning_otel.collector.query_limits import QueryLimiter

    with local_collector(tmp_path / "data") as collector:
        url = collector.http_endpoint + "/v1/traces"
        exports = [(None, ["none-0"]), ("", ["empty-0"]), ("unknown", ["unknown-0"]), ("x.parquet", ["dotted-0"])]
        for service, names in exports:
            assert post(url, _export(service, names).SerializeToString())[0] == 200
        collector.flush()
        collector.stop()
        assert collector.conversion_report() == "all acknowledged spans are in Parquet"
    assert _names_in_files(tmp_path / "data") == {"none-0": 1, "empty-0": 1, "unknown-0": 1, "dotted-0": 1}
    assert not [p for p in (tmp_path / "data" / "spans").rglob("*.parquet") if p.is_dir()]
    limiter = QueryLimiter(str(tmp_path / "data"), timeout_s=30)
    try:
        status, payload, _ = limiter.answer(json.dumps({"sql": "SELECT count(*) FROM spans"}).encode())
        assert (status, payload["rows"]) == (200, [[4]]), payload
        status, payload, _ = limiter.answer(json.dumps({"sql": "SELECT * FROM nowhere"}).encode())
        assert status == 400 and str(tmp_path) not in payload["error"] and "Traceback" not in payload["error"]
    finally:
        limiter.close()


# -- quarantine ----------------------------------------------------------------------------------


def _record(payload: bytes, flags: int = 0) -> bytes:
    return record_bytes(payload, flags)  # a whole record, its CRC right


def test_undecodable_records_are_quarantined_the_rest_converted_and_the_stop_message_says_so(tmp_path):
    """A real segment as a crash would leave it, with two records whose CRCs are right but whose
    content the converter cannot read (not protobuf; a GZIP flag on bytes that are not gzip)."""
    data_dir, log_path = tmp_path / "data", tmp_path / "collector.log"
    wal_dir = data_dir / "wal"
    wal_dir.mkdir(parents=True)
    first = _export("svc", ["before-0", "before-1"]).SerializeToString()
    last = _export("svc", ["after-0"]).SerializeToString()
    segment = "000000000001-0badc0de"
    records = [_record(first), _record(b"\xff\xff\xff not protobuf"), _record(b"not gzip", GZIP), _record(last)]
    (wal_dir / f"{segment}.wal").write_bytes(b"".join(records))
    collector = CollectorProcess(data_dir, port=free_port(), flush_interval_s=0.2, log_path=log_path).start()
    try:
        names = wait_for(
            lambda: _names_in_files(data_dir) if (data_dir / "spans").exists() else {},
            lambda found: len(found) == 3,
        )
    finally:
        collector.stop()
    assert names == {"before-0": 1, "before-1": 1, "after-0": 1}
    assert not (wal_dir / f"{segment}.wal").exists()  # never retried again
    raw = wal_dir / "quarantine" / f"{segment}.wal"
    assert raw.read_bytes() == records[1] + records[2]  # the log's own format: it can be moved back
    reasons = (
        connect(data_dir)
        .execute("SELECT record, bytes, reason FROM read_json(?) ORDER BY record", [f"{data_dir}/quarantine/*.json"])
        .fetchall()
    )
    assert [(r[0], r[1]) for r in reasons] == [(1, len(b"\xff\xff\xff not protobuf")), (2, len(b"not gzip"))]
    assert "protobuf" in reasons[0][2] and "gzip" in reasons[1][2].lower()
    log = log_path.read_text()
    assert log.count("quarantined") == 2, log  # one warning when it happened, one line at stop
    assert "all acknowledged spans are in Parquet" not in log
    assert "2 acknowledged export(s) could not be converted and are quarantined in" in log
    assert "Traceback" not in log


def test_a_segment_that_keeps_failing_is_quarantined_whole_after_a_few_attempts(tmp_path, caplog):
    """Writing its Parquet fails every time (a plain file where its partition directory goes):
    tried MAX_ATTEMPTS times, logged twice, then moved aside; later exports convert."""
    data_dir = tmp_path / "data"
    with local_collector(data_dir) as collector:
        (data_dir / "spans" / "service=blocked").write_text("a file, not a directory")
        url = collector.http_endpoint + "/v1/traces"
        assert post(url, _export("blocked", ["stuck-0"]).SerializeToString())[0] == 200
        collector.flush()
        (segment,) = collector.wal.segments()  # kept for a retry
        flushes = 1
        while collector.wal.segments() and flushes < 10:  # the pipeline's own retries count as well
            collector.flush()
            flushes += 1
        assert collector.wal.segments() == [] and flushes <= MAX_ATTEMPTS
        assert (data_dir / "wal" / "quarantine" / f"{segment}.wal").exists()
        assert post(url, _export("fine", ["fine-0"]).SerializeToString())[0] == 200
        collector.flush()
        assert collector.pipeline.quarantined_segments == 1
        collector.stop()
        report = collector.conversion_report()
    assert _names_in_files(data_dir) == {"fine-0": 1}
    assert report.startswith("1 acknowledged export(s) could not be converted and are quarantined")
    (reason,) = [json.loads(line) for line in (data_dir / "quarantine" / f"{segment}.json").read_text().splitlines()]
    assert reason["record"] is None and "service=blocked" in reason["reason"]
    lines = [r for r in caplog.records if r.name == "lightning_otel.collector.pipeline"]
    assert [r.levelname for r in lines] == ["WARNING", "WARNING"] and not any(r.exc_info for r in lines)


# -- decode errors are 400s ------------------------------------------------------------------------


def _json_span(**fields) -> bytes:
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "j", **fields}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


def _deep_json(depth: int, kind: str) -> bytes:
    """A span attribute nested `depth` deep, written as text (json.dumps itself would recurse)."""
    if kind == "kvlist":
        opening, closing = '{"kvlistValue": {"values": [{"key": "k", "value": ', "}]}}"
    else:
        opening, closing = '{"arrayValue": {"values": [', "]}}"
    value = opening * depth + '{"stringValue": "bottom"}' + closing * depth
    marker = '"@deep@"'
    body = _json_span(attributes=[{"key": "deep", "value": "@deep@"}]).decode()
    return body.replace(marker, value).encode()


HOSTILE_JSON = {
    "kind 1e400": _json_span(kind=1).replace(b'"kind": 1', b'"kind": 1e400'),
    "kind Infinity": _json_span(kind=1).replace(b'"kind": 1', b'"kind": Infinity'),
    "kind -Infinity": _json_span(kind=1).replace(b'"kind": 1', b'"kind": -Infinity'),
    "kind NaN": _json_span(kind=1).replace(b'"kind": 1', b'"kind": NaN'),
    "time 1e400": _json_span(startTimeUnixNano=1).replace(b'"startTimeUnixNano": 1', b'"startTimeUnixNano": 1e400'),
    "kvlist 300 deep": _deep_json(300, "kvlist"),
    "kvlist 40 deep (upb's depth limit as protobuf)": _deep_json(40, "kvlist"),
    "array 1000 deep": _deep_json(1000, "array"),
    "raw array 100000 deep": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
def test_hostile_otlp_json_is_a_400_and_logged_nothing_the_converter_cannot_read(tmp_path, case):
    with local_collector(tmp_path / "data") as collector:
        status, _, body = post(collector.http_endpoint + "/v1/traces", HOSTILE_JSON[case], JSON)
        assert status == 400, body[:300]
        assert "undecodable" in json.loads(body)["message"]
        assert collector.wal.segments() == []  # nothing acknowledged, nothing logged


def test_deep_protobuf_nesting_is_a_400_over_http_and_invalid_argument_over_grpc(tmp_path):
    body = _export("svc", ["deep"], {"deep": _nested(60, "kvlist")}).SerializeToString()
    with local_collector(tmp_path / "data", grpc_port=free_port()) as collector:
        status, _, reply = post(collector.http_endpoint + "/v1/traces", body)
        assert status == 400, reply[:300]
        with grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            with pytest.raises(grpc.RpcError) as error:
                export(body, timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert collector.wal.segments() == []


def test_no_exception_but_value_error_escapes_the_json_decoder():
    """Seeded mutations of a valid OTLP/JSON body (values swapped for hostile ones, bytes flipped):
    every one decodes or raises ValueError, never anything else (a 500)."""
    rng = random.Random(3434)
    base = _json_span(
        kind=2,
        startTimeUnixNano="1",
        attributes=[{"key": "a", "value": {"intValue": "7"}}, {"key": "d", "value": {"doubleValue": 1.5}}],
        status={"code": 1},
        events=[{"name": "e", "timeUnixNano": "5"}],
    )
    values = [at + 2 for at in range(len(base)) if base[at : at + 2] == b": "]
    hostile = [b"1e400", b"-1e400", b"Infinity", b"NaN", b"-1", b"null", b"[]", b"{}", b'"x"', b"true", b"1.5"]
    hostile += [b"99999999999999999999999", b"-99999999999999999999", b'"1e400"', b"[" * 2000 + b"]" * 2000]
    outcomes: dict[str, int] = {}
    for _ in range(3000):
        data = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.8:  # swap one value (up to its comma or closing bracket) for a hostile one
                at = rng.choice([v for v in values if v < len(data)] or [0])
                end = at
                while end < len(data) and data[end : end + 1] not in (b",", b"}", b"]"):
                    end += 1
                data[at:end] = rng.choice(hostile)
            else:
                data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            decode_json(bytes(data))
            outcome = "ok"
        except ValueError:
            outcome = "400"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert set(outcomes) == {"ok", "400"}, outcomes


# -- size caps -------------------------------------------------------------------------------------


def _cap_cases() -> dict[str, tuple[ExportTraceServiceRequest, int]]:
    """name -> (request, spans over a cap); each request also holds one resource that is fine."""
    big = "v" * (size_caps.MAX_RESOURCE_BYTES + 1)
    copies = "c" * (size_caps.MAX_RESOURCE_COPY_BYTES // 100 + 1)  # x 100 spans: past the copy cap
    cases = {
        "resource over its cap": (_export(big, ["r-0", "r-1"]), 2),
        "resource copied into too many spans": (_export(copies, [f"c-{i}" for i in range(100)]), 100),
        "resource attribute key too long": (_export("svc", ["k-0"]), 1),
        "span attribute key too long": (_export("svc", ["a-0"], {"k" * (size_caps.MAX_KEY_BYTES + 1): "v"}), 1),
        "span attribute over its cap": (_export("svc", ["v-0"], {"big": "x" * size_caps.MAX_ATTRIBUTE_BYTES}), 1),
        "resource just under the caps": (_export("u" * (size_caps.MAX_RESOURCE_COPY_BYTES // 100 - 64), ["u"] * 99), 0),
    }
    kv = cases["resource attribute key too long"][0].resource_spans[0].resource.attributes.add()
    kv.key, kv.value.string_value = "r" * (size_caps.MAX_KEY_BYTES + 1), "v"
    for request, _ in cases.values():
        request.resource_spans.add().CopyFrom(_export("fine", ["fine-0", "fine-1"]).resource_spans[0])
    return cases


def test_size_caps_reject_only_the_spans_over_them_with_a_partial_success(tmp_path):
    cases = _cap_cases()
    with local_collector(tmp_path / "data", max_body_bytes=64 * 1024 * 1024) as collector:
        url = collector.http_endpoint + "/v1/traces"
        for name, (request, over) in cases.items():
            status, _, body = post(url, request.SerializeToString())
            assert status == 200, (name, body[:300])
            partial = ExportTraceServiceResponse.FromString(body).partial_success
            assert partial.rejected_spans == over, name
            assert ("size cap" in partial.error_message) == bool(over), (name, partial.error_message)
        collector.flush()
        stored = dict(connect(collector.data_dir).execute("SELECT name, count(*) FROM spans_raw GROUP BY 1").fetchall())
    assert stored["fine-0"] == len(cases) and stored["u"] == 99
    assert not {"r-0", "c-0", "k-0", "a-0", "v-0"} & set(stored)


@pytest.mark.skipif(not available(), reason="the compiled quick check is not built")
def test_the_quick_check_never_vouches_for_a_body_the_caps_would_cut():
    """The C walk's count is only given for bodies the upb path keeps whole; every case over a cap
    is sent to upb (None), and a body well under them is counted."""
    for name, (request, over) in _cap_cases().items():
        body = request.SerializeToString()
        count = span_count(body)
        parsed = ExportTraceServiceRequest.FromString(body)
        drop_invalid_spans(parsed)
        rejected, _ = size_caps.drop_oversized(parsed)
        assert rejected == over, name
        if over:
            assert count is None, name
        elif count is not None:
            assert count == count_spans(parsed), name
    assert span_count(_export("svc", ["small"], {"k": "v"}).SerializeToString()) == 1


# -- the log a client can cause --------------------------------------------------------------------


def test_malformed_requests_log_one_warning_per_client_and_no_traceback(tmp_path):
    log_path, grpc_port = tmp_path / "collector.log", free_port()
    collector = CollectorProcess(
        tmp_path / "data", port=free_port(), log_path=log_path, extra_args=["--grpc-port", str(grpc_port)]
    ).start()
    try:
        url = collector.traces_endpoint
        bad = [
            (HOSTILE_JSON["kind 1e400"], JSON),
            (HOSTILE_JSON["kvlist 300 deep"], JSON),
            (b"\xff\xff garbage", PROTOBUF),
            (b"{not json", JSON),
        ]
        for i in range(60):
            body, content_type = bad[i % len(bad)]
            assert post(url, body, content_type)[0] == 400
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            for _ in range(20):
                with pytest.raises(grpc.RpcError):
                    export(b"\xff\xff garbage", timeout=10)
        assert post(url, _export("svc", ["good"]).SerializeToString())[0] == 200
    finally:
        collector.stop()
    log = log_path.read_text()
    warnings = [line for line in log.splitlines() if line.startswith("WARNING") and "rejected a request" in line]
    assert 1 <= len(warnings) <= 2, log  # one client (127.0.0.1) on two receivers, within a minute
    assert "Traceback" not in log and "ERROR" not in log, log
    assert os.path.getsize(log_path) < 4096
    assert "all acknowledged spans are in Parquet" in log


def test_the_quarantine_survives_a_restart_and_is_reported_again(tmp_path):
    """A restart neither retries nor forgets what was quarantined; the stop line stays honest."""
    data_dir = tmp_path / "data"
    raw = data_dir / "wal" / "quarantine"
    raw.mkdir(parents=True)
    (raw / "000000000007-00000000.wal").write_bytes(_record(b"\xff\xff"))
    with local_collector(data_dir) as collector:
        assert post(collector.http_endpoint + "/v1/traces", _export("s", ["x"]).SerializeToString())[0] == 200
        collector.stop()
        report = collector.conversion_report()
    assert report.startswith("1 acknowledged export(s) could not be converted")
    assert Path(raw / "000000000007-00000000.wal").exists()
