"""OTLP protocol coverage: JSON, gRPC with the official exporter, auth, overload, the query endpoint."""

from __future__ import annotations

import gzip
import json
import time

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2
from helpers import local_collector
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.core.servers import free_port

TRACE_ID = "5b8efff798038103d269b633813fc60c"
SPAN_ID = "eee19b7ec3c1b174"


def _spans(n=2, name="s"):
    def build(tracer):
        for i in range(n):
            tracer.start_span(f"{name}-{i}", attributes={schema.TASK_ID: "t"}).end()

    return make_spans(build)


def _count(data_dir, where="true"):
    return connect(data_dir).execute(f"SELECT count(*) FROM spans WHERE {where}").fetchone()[0]


def _otlp_json(trace_id=TRACE_ID, span_id=SPAN_ID):
    """Written as the OTLP/JSON spec says: hex ids, integer enums, int64 as strings, camelCase, extras."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "raw-json-client"},
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": span_id,
                                "parentSpanId": "",
                                "name": "json-span",
                                "kind": 3,
                                "startTimeUnixNano": "1790000000000000000",
                                "endTimeUnixNano": "1790000000500000000",
                                "attributes": [
                                    {"key": schema.OPENINFERENCE_SPAN_KIND, "value": {"stringValue": "LLM"}},
                                    {"key": schema.LLM_TOKEN_COUNT_PROMPT, "value": {"intValue": "42"}},
                                    {
                                        "key": schema.PROMPT_TOKEN_IDS,
                                        "value": {"arrayValue": {"values": [{"intValue": "7"}, {"intValue": "8"}]}},
                                    },
                                    {"key": "flag", "value": {"boolValue": True}},
                                ],
                                "status": {"code": 1},
                                "someFieldFromTheFuture": {"ignored": True},
                            }
                        ],
                    }
                ],
            }
        ],
    }


def test_otlp_json_is_decoded_as_the_spec_says(tmp_path):
    with local_collector(tmp_path / "d") as collector:
        status, headers, reply = post(
            collector.http_endpoint + "/v1/traces", json.dumps(_otlp_json()).encode(), "application/json"
        )
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert json.loads(reply) == {}
        collector.flush()
        row = (
            connect(collector.data_dir)
            .execute(
                "SELECT trace_id, span_id, kind, service_name, token_count_prompt, prompt_token_ids, attributes['flag'], "
                "duration_ms, status_code FROM spans"
            )
            .fetchone()
        )
    assert row == (TRACE_ID, SPAN_ID, "CLIENT", "json-svc", 42, [7, 8], "true", 500.0, "OK")


def test_otlp_json_invalid_id_is_a_partial_success_and_gzip_works(tmp_path):
    body = _otlp_json(trace_id="not-hex")
    body["resourceSpans"][0]["scopeSpans"][0]["spans"].append(
        _otlp_json()["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    )
    with local_collector(tmp_path / "d") as collector:
        status, _, reply = post(
            collector.http_endpoint + "/v1/traces",
            gzip.compress(json.dumps(body).encode()),
            "application/json",
            {"Content-Encoding": "gzip"},
        )
        assert status == 200
        assert json.loads(reply)["partialSuccess"]["rejectedSpans"] == "1"
        status, _, reply = post(collector.http_endpoint + "/v1/traces", b"{not json", "application/json")
        assert status == 400 and json.loads(reply)["message"].startswith("undecodable OTLP/JSON")
        collector.flush()
        assert _count(collector.data_dir) == 1


def test_official_grpc_exporter_with_token_and_large_batch(tmp_path):
    grpc_port = free_port()
    with local_collector(tmp_path / "d", grpc_port=grpc_port, token="s3cret") as collector:
        endpoint = f"127.0.0.1:{grpc_port}"
        good = GrpcExporter(endpoint=endpoint, insecure=True, headers=(("authorization", "Bearer s3cret"),))
        # ~6 MiB in one request: above gRPC's default 4 MiB receive limit
        big = make_spans(
            lambda t: [t.start_span(f"big-{i}", attributes={"blob": "x" * 6000}).end() for i in range(1000)]
        )
        assert good.export(big) == SpanExportResult.SUCCESS
        assert good.export(_spans(3, "grpc")) == SpanExportResult.SUCCESS
        bad = GrpcExporter(endpoint=endpoint, insecure=True, timeout=5)
        assert bad.export(_spans(1, "nope")) == SpanExportResult.FAILURE
        collector.flush()
        assert _count(collector.data_dir, "name LIKE 'big-%'") == 1000
        assert _count(collector.data_dir, "name LIKE 'grpc-%'") == 3
        assert _count(collector.data_dir, "name LIKE 'nope-%'") == 0


def test_grpc_undecodable_body_is_invalid_argument_and_overload_is_unavailable_with_retry_info(tmp_path):
    grpc_port = free_port()
    with local_collector(tmp_path / "d", grpc_port=grpc_port, max_backlog_bytes=1):
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as error:
            export(b"\xff\xff\xff garbage")
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        export(request_bytes(_spans(1)))  # accepted: the backlog was empty
        time.sleep(0.6)  # the backlog measurement is cached for 0.5 s
        with pytest.raises(grpc.RpcError) as error:
            export(request_bytes(_spans(1)))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        details = dict(error.value.trailing_metadata())["grpc-status-details-bin"]
        retry = error_details_pb2.RetryInfo()
        assert status_pb2.Status.FromString(details).details[0].Unpack(retry) and retry.retry_delay.seconds == 5
        channel.close()


def test_http_auth_and_overload_answers(tmp_path):
    with local_collector(tmp_path / "d", token="t0k", max_backlog_bytes=1) as collector:
        url = collector.http_endpoint + "/v1/traces"
        status, headers, reply = post(url, request_bytes(_spans()))
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        assert status_pb2.Status.FromString(reply).code == code_pb2.UNAUTHENTICATED
        assert post(url, request_bytes(_spans()), headers={"Authorization": "Bearer wrong"})[0] == 401
        exporter = HttpExporter(endpoint=url, headers={"Authorization": "Bearer t0k"})
        assert exporter.export(_spans(2, "ok")) == SpanExportResult.SUCCESS
        time.sleep(0.6)
        status, headers, _ = post(url, request_bytes(_spans()), headers={"Authorization": "Bearer t0k"})
        assert status == 503 and headers["Retry-After"] == "5"
    with local_collector(tmp_path / "e", max_inflight=0) as collector:
        status, headers, _ = post(collector.http_endpoint + "/v1/traces", request_bytes(_spans()))
        assert status == 429 and headers["Retry-After"] == "1"


@pytest.fixture
def query_collector(tmp_path):
    with local_collector(tmp_path / "d", query_token="q") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(_spans(3, "row")))[0] == 200
        collector.flush()
        yield collector


def _query(collector, sql, token="q"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, _, reply = post(
        collector.http_endpoint + "/v1/query", json.dumps({"sql": sql}).encode(), "application/json", headers
    )
    return status, json.loads(reply)


def test_query_endpoint_answers_read_only_sql(query_collector):
    status, reply = _query(query_collector, "SELECT name FROM spans ORDER BY name")
    assert status == 200 and reply["columns"] == ["name"] and reply["rows"] == [["row-0"], ["row-1"], ["row-2"]]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/passwd')",
        "COPY (SELECT 1) TO '/tmp/lightning-otel-escape.csv'",
        "COPY spans TO 'spans/escape.parquet'",
        "ATTACH '/tmp/lightning-otel-escape.db' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "CREATE TABLE t AS SELECT 1",
        "SELECT 1; SELECT 2",
        "SELECT * FROM glob('/*')",
    ],
)
def test_query_endpoint_refuses_to_leave_the_store(query_collector, sql):
    status, reply = _query(query_collector, sql)
    assert status == 400 and reply["error"]


def test_query_endpoint_needs_the_token(query_collector):
    assert _query(query_collector, "SELECT 1", token=None)[0] == 401
    assert _query(query_collector, "SELECT 1", token="wrong")[0] == 401
