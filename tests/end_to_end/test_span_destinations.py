"""Where each command's spans go: its --help says so, it says so when it starts, and the gateway's
spans reach a collector on a port other than the default (they once went to 4318, and nothing said so)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import openai
import pytest
from helpers import wait_for

from lightning_otel.cli import build_parser
from lightning_otel.collector import connect
from lightning_otel.core.otlp import traces_endpoint
from lightning_otel.core.servers import free_port
from lightning_otel.testing.servers import CollectorProcess, GatewayProcess

DEFAULT = "http://127.0.0.1:4318/v1/traces"


def _help(command: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "lightning_otel", command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split())  # argparse wraps lines: compare words


@pytest.mark.parametrize("command", ["gateway", "train"])
def test_help_of_a_command_that_exports_spans_says_where_and_how_to_change_it(command):
    text = _help(command)
    for words in (
        "--otlp-endpoint",
        "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "$OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces",
        DEFAULT,
    ):
        assert words in text, words
    required = ["--upstream", "http://127.0.0.1:8000"] if command == "gateway" else []
    args = build_parser().parse_args([command, *required, "--otlp-endpoint", "http://collector:9999/v1/traces"])
    assert "http://collector:9999/v1/traces" in vars(args).values()  # the flag the help names exists


@pytest.mark.parametrize("command", ["serve", "dashboard"])
def test_help_of_a_server_that_exports_nothing_says_so(command):
    assert "sends no spans" in _help(command).lower()


def test_collector_help_says_where_spans_arrive_and_where_they_are_stored():
    text = _help("collector")
    for words in ("POST /v1/traces", "default 4318", "default 4317", "Parquet under --data-dir", "sends no spans"):
        assert words in text, words


def test_the_endpoint_is_the_flag_then_the_standard_variables_then_the_default(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert traces_endpoint(None) == DEFAULT
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:1/")
    assert traces_endpoint(None) == "http://base:1/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:2/custom")
    assert traces_endpoint(None) == "http://traces:2/custom"
    assert traces_endpoint("http://flag:3/v1/traces") == "http://flag:3/v1/traces"


@pytest.mark.parametrize("flag", [[], ["--otlp-endpoint", "http://127.0.0.1:8/v1/traces"]])
def test_train_says_where_its_spans_go_first(tmp_path, flag):
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}
    env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lightning_otel",
            "train",
            "--store-data-dir",
            str(tmp_path / "store"),
            "--checkpoints-dir",
            str(tmp_path / "ck"),
            "--model-base",
            str(tmp_path / "no-model"),
            *flag,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = process.stderr.readline()
    finally:
        process.kill()
        process.wait()
    expected = flag[1] if flag else "http://127.0.0.1:9/v1/traces"
    assert first.strip() == f"lightning-otel train: spans -> {expected}"


def test_the_gateway_beside_a_collector_on_another_port_sends_its_spans_there(vllm_server, tmp_path):
    with CollectorProcess(tmp_path / "traces", flush_interval_s=0.2, log_path=tmp_path / "collector.log") as collector:
        assert collector.port != 4318
        dead = f"http://127.0.0.1:{free_port()}/v1/traces"  # the environment names a dead endpoint: the flag wins
        with GatewayProcess(
            [vllm_server.url],
            dead,
            log_path=tmp_path / "gateway.log",
            extra_args=["--otlp-endpoint", collector.traces_endpoint],
        ) as gateway:
            rollout_id = f"port-{uuid.uuid4().hex[:8]}"
            client = openai.OpenAI(base_url=f"{gateway.url}/rollout/{rollout_id}/v1", api_key="x")
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            query = "SELECT count(*) FROM llm_calls WHERE rollout_id = ? AND completion_token_ids IS NOT NULL"
            count = wait_for(
                lambda: connect(collector.data_dir).execute(query, [rollout_id]).fetchone()[0], lambda n: n >= 1
            )
    log = (tmp_path / "gateway.log").read_text()
    assert count == 1
    assert f"spans -> {collector.traces_endpoint}" in log and "nothing listens" not in log


def test_a_gateway_whose_collector_is_not_there_says_so_when_it_starts(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    with GatewayProcess([f"http://127.0.0.1:{free_port()}"], dead, log_path=tmp_path / "gateway.log"):
        pass
    log = (tmp_path / "gateway.log").read_text()
    assert f"spans -> {dead}" in log and f"warning: nothing listens at {dead}" in log
