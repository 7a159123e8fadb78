"""The collector against real OTLP exporters and real bad input; queries through DuckDB."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys

import pytest
from google.rpc import status_pb2
from helpers import local_collector, wait_for
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.core.servers import free_port
from lightning_otel.testing.servers import CollectorProcess


@pytest.fixture
def collector(tmp_path):
    with local_collector(tmp_path / "data") as running:
        yield running


def _llm_spans(n: int = 3):
    def build(tracer):
        with tracer.start_as_current_span("rollout", attributes={schema.ROLLOUT_ID: "r1", schema.TASK_ID: "t1"}):
            for i in range(n):
                tracer.start_span(
                    f"call-{i}",
                    attributes={
                        schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                        schema.ROLLOUT_ID: "r1",
                        schema.PROMPT_TOKEN_IDS: [1, 2, i],
                        schema.COMPLETION_TOKEN_IDS: [7, 8],
                        schema.COMPLETION_LOGPROBS: [-0.5, -1.5],
                        "custom.attr": "kept",
                        "custom.number": 3,
                    },
                ).end()

    return make_spans(build)


def test_real_exporter_spans_land_in_parquet_with_list_columns(collector):
    spans = _llm_spans()
    exporter = OTLPSpanExporter(endpoint=collector.http_endpoint + "/v1/traces")
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    collector.flush()
    conn = connect(collector.data_dir)
    rows = conn.execute(
        "SELECT name, prompt_token_ids, completion_logprobs, attributes['custom.attr'], attributes['custom.number'], "
        "service_name, rollout_id FROM spans WHERE span_kind = 'LLM' ORDER BY name"
    ).fetchall()
    assert rows == [(f"call-{i}", [1, 2, i], [-0.5, -1.5], "kept", "3", "unit", "r1") for i in range(3)]
    # token ids are list columns, not strings
    types = dict(conn.execute("SELECT column_name, column_type FROM (DESCRIBE llm_calls)").fetchall())
    assert types["prompt_token_ids"] == "INTEGER[]" and types["completion_logprobs"] == "DOUBLE[]"
    # Hive partitions by service and hour; snappy for text in files fresh from the log (compaction
    # rewrites them with zstd: test_collector_storage), token arrays stored uncompressed
    files = list((collector.data_dir / "spans").rglob("part-*.parquet"))
    assert files and all("service=unit/date=" in f.as_posix() and "/hour=" in f.as_posix() for f in files)
    codecs = dict(conn.execute(f"SELECT path_in_schema, compression FROM parquet_metadata('{files[0]}')").fetchall())
    assert codecs["attributes, key_value, value"] == "SNAPPY" and codecs["name"] == "SNAPPY"
    assert codecs["prompt_token_ids, list, element"] == "UNCOMPRESSED"


def test_retried_export_is_seen_once(collector):
    body = request_bytes(_llm_spans())
    for _ in range(3):
        assert post(collector.http_endpoint + "/v1/traces", body)[0] == 200
        collector.flush()  # each copy in its own segment and Parquet file
    conn = connect(collector.data_dir)
    assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 4
    assert conn.execute("SELECT count(*) FROM llm_calls").fetchone()[0] == 3


def test_gzip_body_is_accepted(collector):
    body = gzip.compress(request_bytes(_llm_spans(1)))
    status, headers, reply = post(collector.http_endpoint + "/v1/traces", body, headers={"Content-Encoding": "gzip"})
    assert status == 200 and headers["Content-Type"] == "application/x-protobuf"
    ExportTraceServiceResponse.FromString(reply)
    collector.flush()
    assert connect(collector.data_dir).execute("SELECT count(*) FROM spans").fetchone()[0] == 2


@pytest.mark.parametrize(
    "body,content_type,encoding,expected",
    [
        (b"\xff\xfe not protobuf \x00\x01", "application/x-protobuf", None, 400),
        (b"{}", "text/plain", None, 415),
        (gzip.compress(b"x")[:-6], "application/x-protobuf", "gzip", 400),  # truncated gzip
        (gzip.compress(b"\0" * (30 * 1024 * 1024)), "application/x-protobuf", "gzip", 413),  # gzip bomb
    ],
)
def test_bad_requests_get_a_4xx_and_lose_nothing(collector, body, content_type, encoding, expected):
    url = collector.http_endpoint + "/v1/traces"
    assert post(url, request_bytes(_llm_spans(1)))[0] == 200
    headers = {"Content-Encoding": encoding} if encoding else {}
    status, _, reply = post(url, body, content_type=content_type, headers=headers)
    assert status == expected
    if status in (400, 413, 415):
        assert status_pb2.Status.FromString(reply).message  # a google.rpc.Status saying why
    assert post(url, request_bytes(_llm_spans(1)))[0] == 200  # still serving
    collector.flush()
    assert connect(collector.data_dir).execute("SELECT count(*) FROM spans").fetchone()[0] == 4


def test_invalid_ids_are_rejected_as_partial_success(collector):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    request = encode_spans(_llm_spans(2))
    request.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x01\x02"  # 2 bytes, not 8
    status, _, reply = post(collector.http_endpoint + "/v1/traces", request.SerializeToString())
    assert status == 200
    response = ExportTraceServiceResponse.FromString(reply)
    assert response.partial_success.rejected_spans == 1
    assert "invalid" in response.partial_success.error_message
    collector.flush()
    assert connect(collector.data_dir).execute("SELECT count(*) FROM spans").fetchone()[0] == 2


def test_empty_store_has_views_with_no_rows(tmp_path):
    conn = connect(tmp_path / "nothing-here")
    for view in ("spans", "llm_calls", "tool_calls", "rollouts", "rewards"):
        assert conn.execute(f"SELECT count(*) FROM {view}").fetchone()[0] == 0


def test_kill_9_then_restart_loses_no_acknowledged_span(tmp_path):
    """Acknowledged = fsynced in the write-ahead log: spans survive a SIGKILL before any Parquet."""
    data_dir = tmp_path / "data"
    port = free_port()
    first = CollectorProcess(data_dir, port=port, flush_interval_s=3600).start()  # never flushes by itself
    acknowledged = 0
    for _ in range(5):
        if post(first.url + "/v1/traces", request_bytes(_llm_spans(2)))[0] == 200:
            acknowledged += 3
    os.killpg(first.process.pid, signal.SIGKILL)
    first.process.wait()
    assert not list((data_dir / "spans").rglob("part-*.parquet"))  # nothing was in Parquet yet
    with CollectorProcess(data_dir, port=port, flush_interval_s=0.2):
        count = wait_for(
            lambda: connect(data_dir).execute("SELECT count(*) FROM spans").fetchone()[0], lambda n: n >= acknowledged
        )
    assert acknowledged == 15 and count == 15


def test_another_process_queries_while_the_collector_runs(collector):
    assert post(collector.http_endpoint + "/v1/traces", request_bytes(_llm_spans(2)))[0] == 200
    collector.flush()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_otel",
            "sql",
            "--data-dir",
            str(collector.data_dir),
            "--format",
            "csv",
            "SELECT name FROM llm_calls ORDER BY name",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["name", "call-0", "call-1"]


def test_restarts_never_overwrite_earlier_data(tmp_path):
    """An empty log restarts its sequence; the Parquet files of earlier runs must survive that."""
    for run in range(3):
        with local_collector(tmp_path / "data") as collector:
            assert post(collector.http_endpoint + "/v1/traces", request_bytes(_llm_spans(1)))[0] == 200
        assert connect(tmp_path / "data").execute("SELECT count(*) FROM spans").fetchone()[0] == 2 * (run + 1)


def test_token_arrays_in_every_encoding_become_the_same_list_columns(collector):
    import base64

    from lightning_otel.core.token_encoding import pack_floats, pack_ints

    ids, logprobs = [5, 0, 2**31 - 1, 7], [-0.25, -1e-9, -30.5, 0.0]
    packed_ids, packed_lps = pack_ints(ids), pack_floats(logprobs)
    assert isinstance(packed_ids, bytes)
    encodings = {
        "plain": {schema.PROMPT_TOKEN_IDS: ids, schema.COMPLETION_LOGPROBS: logprobs},
        "bytes": {schema.PACKED_PROMPT_TOKEN_IDS: packed_ids, schema.PACKED_COMPLETION_LOGPROBS: packed_lps},
        "base64": {
            schema.PACKED_PROMPT_TOKEN_IDS: base64.b64encode(packed_ids).decode(),
            schema.PACKED_COMPLETION_LOGPROBS: base64.b64encode(packed_lps).decode(),
        },
        # broken packed values: wrong length, not base64; the span is kept, the value stays in the map
        "broken": {schema.PACKED_PROMPT_TOKEN_IDS: b"\x01\x02\x03", schema.PACKED_COMPLETION_LOGPROBS: "%%%"},
    }
    spans = make_spans(lambda t: [t.start_span(name, attributes=attrs).end() for name, attrs in encodings.items()])
    assert post(collector.http_endpoint + "/v1/traces", request_bytes(spans))[0] == 200
    collector.flush()
    rows = dict(
        (r[0], r[1:])
        for r in connect(collector.data_dir)
        .execute(
            f"SELECT name, prompt_token_ids, completion_logprobs, attributes['{schema.PACKED_PROMPT_TOKEN_IDS}'] FROM spans"
        )
        .fetchall()
    )
    for name in ("plain", "bytes", "base64"):
        assert rows[name] == (ids, logprobs, None), name
    assert rows["broken"] == (None, None, "010203")
