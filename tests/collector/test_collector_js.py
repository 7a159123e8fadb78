"""The official OpenTelemetry JavaScript SDK, driven by Node, exports to the collector.

Its OTLP/HTTP exporters send bodies with `Transfer-Encoding: chunked` (no Content-Length), plain
or gzip: the receiver must read them (the standard library's http.server answered 411 to every
one). Each exporter's spans are counted through SQL, with their array attributes intact.

The npm packages are pinned in tests/npm_packages.py and installed once into a cache folder named
after the pins (~/.cache/lightning-otel-npm/<hash>, or $LIGHTNING_OTEL_NPM_CACHE/<hash>); `node`
(>= 18.19) and `npm` must be on PATH: without them these tests fail, they do not skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import local_collector
from npm_packages import OPENTELEMETRY_JS, install
from repo_paths import TESTS

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.core.servers import free_port

pytestmark = pytest.mark.integration

SCRIPT = TESTS / "js" / "export_spans.js"
SPANS = 1200  # three batches of the processor's 512

ATTRIBUTES = {
    schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
    schema.PROMPT_TOKEN_IDS: [151644, 872, 0, 2147483647],
    schema.COMPLETION_TOKEN_IDS: [9707, 13],
    # JavaScript has one number type: 0 goes out as an intValue, -0.25 as a doubleValue.
    schema.COMPLETION_LOGPROBS: [0, -0.25],
    "js.tags": ["alpha", "beta"],
    "js.flags": [True, False],
    "js.weights": [0.5, 1.5],
}


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """The pinned OpenTelemetry JS packages (tests/npm_packages.py), installed once per pin set."""
    return install(OPENTELEMETRY_JS)


def export_with_node(
    node_modules: Path,
    exporter: str,
    url: str,
    service: str,
    compression: str = "none",
    spans: int = SPANS,
    headers: dict | None = None,
) -> subprocess.CompletedProcess:
    options = {
        "exporter": exporter,
        "url": url,
        "compression": compression,
        "service": service,
        "spans": spans,
        "attributes": ATTRIBUTES,
        "headers": headers or {},
    }
    return subprocess.run(
        ["node", str(SCRIPT), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NODE_PATH": str(node_modules)},
    )


@pytest.fixture(scope="module")
def js_exports(node_modules, tmp_path_factory):
    """One collector (HTTP and gRPC), every exporter and encoding; yields (runs, data_dir)."""
    grpc_port = free_port()
    with local_collector(tmp_path_factory.mktemp("js") / "data", grpc_port=grpc_port) as collector:
        traces = collector.http_endpoint + "/v1/traces"
        plan = {
            "js-proto": ("proto", traces, "none"),
            "js-proto-gzip": ("proto", traces, "gzip"),
            "js-json": ("http", traces, "none"),
            "js-json-gzip": ("http", traces, "gzip"),
            "js-grpc": ("grpc", f"http://127.0.0.1:{grpc_port}", "none"),
        }
        runs = {
            service: export_with_node(node_modules, exporter, url, service, compression)
            for service, (exporter, url, compression) in plan.items()
        }
        collector.flush()
        yield runs, collector.data_dir


@pytest.mark.parametrize("service", ["js-proto", "js-proto-gzip", "js-json", "js-json-gzip", "js-grpc"])
def test_js_sdk_spans_arrive_with_array_attributes(js_exports, service):
    runs, data_dir = js_exports
    run = runs[service]
    assert run.returncode == 0, f"node exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert json.loads(run.stdout.strip().splitlines()[-1])["exported"] == SPANS
    conn = connect(data_dir)
    count, distinct = conn.execute(
        "SELECT count(*), count(DISTINCT attributes['js.index']) FROM spans WHERE service_name = ?", [service]
    ).fetchone()
    assert (count, distinct) == (SPANS, SPANS)
    rows = conn.execute(
        "SELECT DISTINCT span_kind, prompt_token_ids, completion_token_ids, completion_logprobs, "
        "attributes['js.tags'], attributes['js.flags'], attributes['js.weights'] FROM spans WHERE service_name = ?",
        [service],
    ).fetchall()
    assert rows == [
        (
            "LLM",
            [151644, 872, 0, 2147483647],
            [9707, 13],
            [0.0, -0.25],
            '["alpha", "beta"]',
            "[true, false]",
            "[0.5, 1.5]",
        )
    ]


def test_js_sdk_with_a_token_and_a_wrong_one(node_modules, tmp_path):
    with local_collector(tmp_path / "data", token="js-secret") as collector:
        traces = collector.http_endpoint + "/v1/traces"
        good = export_with_node(
            node_modules, "proto", traces, "js-token", "gzip", spans=10, headers={"Authorization": "Bearer js-secret"}
        )
        bad = export_with_node(
            node_modules, "proto", traces, "js-no-token", "gzip", spans=10, headers={"Authorization": "Bearer wrong"}
        )
        collector.flush()
        counts = dict(
            connect(collector.data_dir).execute("SELECT service_name, count(*) FROM spans GROUP BY 1").fetchall()
        )
    assert good.returncode == 0, good.stderr[-3000:]
    assert bad.returncode != 0 and "Unauthorized" in bad.stderr + bad.stdout
    assert counts == {"js-token": 10}
