"""The Responses API <-> chat completions translation (core.responses_api, core.responses_stream),
checked against the installed openai SDK's own types and stream parser."""

from __future__ import annotations

import json
import random

import httpx2
import openai
import pytest
from openai.types.responses import Response

from lightning_otel.core.responses_api import ResponsesRequestError, chat_request, response_object
from lightning_otel.core.responses_stream import ResponsesStream, sse

TOOL = {"type": "function", "name": "add", "description": "Add.", "parameters": {"type": "object"}, "strict": True}


def test_a_tool_turn_becomes_the_chat_request_the_model_ran():
    body = {
        "model": "policy",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "2+3?"},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}],
            },
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add", "arguments": '{"a":2,"b":3}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "5"},
            {
                "role": "developer",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            },
        ],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "name": "add"},
        "max_output_tokens": 7,
        "temperature": 0.5,
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}},
        "store": False,
        "metadata": {"x": "y"},
        "top_k": 3,  # a vLLM sampling field: passed on
        "stream": True,
    }
    assert chat_request(body) == {
        "model": "policy",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+3?"},
            {
                "role": "assistant",
                "content": "Let me add.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "5"},
            {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}, "strict": True},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "max_tokens": 7,
        "temperature": 0.5,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
        },
        "top_k": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ],
)
def test_stateful_and_untranslatable_requests_are_refused_saying_what_to_send(extra, param):
    with pytest.raises(ResponsesRequestError) as refused:
        chat_request({"model": "m", "input": "hi", **extra})
    error = refused.value.body()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    if param in ("previous_response_id", "conversation", "input[0]"):
        assert "send the whole conversation in `input`" in error["message"]


def test_a_chat_reply_is_a_response_the_sdk_accepts():
    request = {"model": "policy", "input": "hi", "tools": [TOOL], "max_output_tokens": 4}
    chat = {
        "id": "chatcmpl-1",
        "created": 1700000000,
        "model": "policy",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "ok",
                    "tool_calls": [
                        {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
                    ],
                },
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15},
    }
    reply = Response.model_validate(response_object(chat, request))
    assert reply.output_text == "ok"
    [message, call] = reply.output
    assert (call.type, call.call_id, call.name, call.arguments) == ("function_call", "call_9", "add", '{"a":1}')
    assert (reply.status, reply.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.total_tokens) == (11, 4, 15)
    assert reply.max_output_tokens == 4 and reply.tools[0].name == "add"


def _conversation(rng: random.Random) -> list[dict]:
    """A random chat conversation as a harness builds it: user turns, model turns (text and/or tool
    calls), tool results."""
    words = ["alpha", "beta", "  spaced  ", "ünïcode", "line\nbreak", '{"json": 1}']
    chat = [{"role": "system", "content": rng.choice(words)}] if rng.random() < 0.5 else []
    calls = 0
    for _ in range(rng.randint(1, 4)):
        chat.append({"role": "user", "content": " ".join(rng.choices(words, k=3))})
        turn: dict = {"role": "assistant", "content": rng.choice(words) if rng.random() < 0.6 else None}
        ids = []
        for _ in range(rng.randint(0 if turn["content"] else 1, 2)):
            calls += 1
            ids.append(f"call_{calls}")
            function = {"name": rng.choice(["add", "look"]), "arguments": json.dumps({"q": rng.choice(words)})}
            turn.setdefault("tool_calls", []).append({"id": ids[-1], "type": "function", "function": function})
        chat.append(turn)
        chat += [{"role": "tool", "tool_call_id": i, "content": rng.choice(words)} for i in ids]
    return chat


@pytest.mark.parametrize("seed", range(40))
def test_generated_conversations_round_trip_through_responses_items(seed):
    """A harness sends back the output items of each Responses reply as input: the chat request
    rebuilt from them is the conversation the model ran, turn for turn (what makes prompt ids of
    later calls extend earlier ones)."""
    rng = random.Random(seed)
    chat = _conversation(rng)
    system = chat[0]["content"] if chat and chat[0]["role"] == "system" else None
    items: list = []
    for message in chat[1:] if system is not None else chat:
        if message["role"] == "user":
            text = message["content"]
            items.append(
                {"role": "user", "content": text if rng.random() < 0.5 else [{"type": "input_text", "text": text}]}
            )
        elif message["role"] == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}
            )
        else:  # the model's turn: what the Responses reply held
            reply = response_object({"choices": [{"message": message, "finish_reason": "stop"}]}, {"model": "m"})
            items += Response.model_validate({**reply, "created_at": 0}).model_dump(exclude_none=True)["output"]
    assert chat_request({"model": "m", "instructions": system, "input": items})["messages"] == chat


def _chunks(rng: random.Random, text: str, calls: list[tuple[str, str, str]], finish: str) -> list[dict]:
    """A chat stream of `text` then `calls` (id, name, arguments), cut at random places."""
    chunks: list[dict] = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}], "model": "policy", "created": 5}]
    position = 0
    while position < len(text):
        step = rng.randint(1, 4)
        chunks.append({"choices": [{"index": 0, "delta": {"content": text[position : position + step]}}]})
        position += step
    for index, (call_id, name, arguments) in enumerate(calls):
        first = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
        cut = rng.randint(0, len(arguments))
        for piece in (arguments[:cut], arguments[cut:]):
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            chunks.append({"choices": [{"index": 0, "delta": delta}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}})
    return chunks


@pytest.mark.parametrize("seed", range(12))
def test_streamed_events_are_parsed_by_the_sdk_into_the_same_response(seed):
    rng = random.Random(seed)
    text = rng.choice(["", "hello there", "ünï ✓ code"])
    calls = [(f"call_{i}", "add", json.dumps({"a": i})) for i in range(rng.randint(0 if text else 1, 2))]
    finish = rng.choice(["stop", "tool_calls", "length"])
    request = {"model": "policy", "input": "hi", "tools": [TOOL], "stream": True}
    stream = ResponsesStream(request)
    events = stream.start()
    for chunk in _chunks(rng, text, calls, finish):
        events += stream.feed(chunk)
    events += stream.finish()
    wire = b"".join(map(sse, events))

    def answer(_request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=wire)

    client = openai.OpenAI(
        base_url="http://test/v1", api_key="x", http_client=httpx2.Client(transport=httpx2.MockTransport(answer))
    )
    seen = list(client.responses.create(model="policy", input="hi", stream=True))
    assert seen[0].type == "response.created" and [e.sequence_number for e in seen] == list(range(len(seen)))
    final = seen[-1].response  # response.incomplete at max_output_tokens, as OpenAI's API ends it
    assert seen[-1].type == ("response.incomplete" if finish == "length" else "response.completed")
    assert final.output_text == text == "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert [(c.call_id, c.name, c.arguments) for c in final.output if c.type == "function_call"] == calls
    assert final.status == ("incomplete" if finish == "length" else "completed")
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 3)
    if finish != "length":  # the SDK's stream helper accumulates the same response from the events
        with client.responses.stream(model="policy", input="hi") as helper:
            helped = helper.get_final_response()
        assert helped.output_text == text and helped.model_dump(exclude={"output"}) == final.model_dump(
            exclude={"output"}
        )
        assert [(c.call_id, c.arguments) for c in helped.output if c.type == "function_call"] == [c[::2] for c in calls]
