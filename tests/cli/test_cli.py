"""`lightning-otel sql` output formats and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.core import schema


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    def build(tracer):
        for i in range(2):
            tracer.start_span(
                f"call-{i}",
                attributes={schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM, schema.PROMPT_TOKEN_IDS: [i, i + 1]},
            ).end()

    with local_collector(tmp_path_factory.mktemp("cli") / "data") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
        return collector.data_dir


def _sql(data_dir, *args):
    return subprocess.run(
        [sys.executable, "-m", "lightning_otel", "sql", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_table_output(data_dir):
    result = _sql(data_dir, "SELECT name, prompt_token_ids FROM llm_calls ORDER BY name")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["name", "|", "prompt_token_ids"]
    assert "call-0" in lines[2] and "[0, 1]" in lines[2] and lines[-1] == "(2 rows)"


def test_json_output(data_dir):
    result = _sql(data_dir, "--format", "json", "SELECT name, prompt_token_ids FROM llm_calls ORDER BY name")
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"name": "call-0", "prompt_token_ids": [0, 1]},
        {"name": "call-1", "prompt_token_ids": [1, 2]},
    ]


def test_bad_sql_is_a_clear_error(data_dir):
    result = _sql(data_dir, "SELECT nope FROM llm_calls")
    assert result.returncode == 2 and "nope" in result.stderr and "Traceback" not in result.stderr
