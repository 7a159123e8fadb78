"""core.anthropic_messages / anthropic_stream: Messages requests as chat completions requests, chat
replies and streams as Anthropic Messages and events, each checked against the installed `anthropic`
SDK's own types and stream parser."""

from __future__ import annotations

import json
import random

import anthropic
import httpx2
import pytest
from anthropic.lib.streaming import MessageStream
from anthropic.types import Message, RawMessageStreamEvent

from lightning_otel.core.anthropic_messages import (
    MessagesRequestError,
    chat_request,
    error_body,
    error_from_chat,
    message,
)
from lightning_otel.core.anthropic_stream import MessagesStream

ADD = {
    "name": "add",
    "description": "Add.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
}


def test_request_maps_system_blocks_tools_and_sampling():
    body = {
        "model": "policy",
        "max_tokens": 30,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Use tools."}],
        "messages": [
            {"role": "user", "content": "2+3?"},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "5"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                {"type": "text", "text": "and now?"},
            ]},
        ],
        "tools": [ADD],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 4,
        "metadata": {"user_id": "u"},
    }  # fmt: skip
    chat = chat_request(body)
    assert chat == {
        "model": "policy",
        "max_tokens": 30,
        "messages": [
            {"role": "system", "content": "Be brief.\nUse tools."},
            {"role": "user", "content": "2+3?"},
            {"role": "system", "content": "# Environment"},
            {"role": "assistant", "content": "Calling.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "5"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
            {"role": "user", "content": "and now?"},
        ],
        "tools": [{"type": "function", "function": {"name": "add", "parameters": ADD["input_schema"], "description": "Add."}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stop": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 4,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "add"}, {"type": "function", "function": {"name": "add"}}),
    ],
)
def test_tool_choice(choice, expected):
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [ADD]}
    assert chat_request({**body, "tool_choice": choice})["tool_choice"] == expected


def test_a_final_assistant_message_is_continued_not_closed():
    # Anthropic's prefill: the reply continues the last assistant turn (vLLM's continue_final_message)
    asked = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": [{"type": "text", "text": "It is"}]}]
    chat = chat_request({"model": "m", "max_tokens": 4, "messages": asked})
    assert chat["messages"][-1] == {"role": "assistant", "content": "It is"}
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False
    answered = chat_request({"model": "m", "max_tokens": 4, "messages": asked[:1]})
    assert "continue_final_message" not in answered and "add_generation_prompt" not in answered
    call = {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}
    calling = chat_request(
        {"model": "m", "max_tokens": 4, "messages": [asked[0], {"role": "assistant", "content": [call]}]}
    )
    assert "continue_final_message" not in calling  # a tool call is not a prefill to continue


def test_stream_asks_for_usage():
    chat = chat_request({"model": "m", "max_tokens": 1, "messages": [], "stream": True})
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image blocks are not supported"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]}, "image blocks"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool 'web_search_20250305'"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role must be"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config"),
        ({"temperature": "hot"}, "temperature"),
    ],
)  # fmt: skip
def test_unservable_requests_are_refused_clearly(change, says):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **change}
    with pytest.raises(MessagesRequestError, match=says):
        chat_request(body)


def _chat_reply(content, tool_calls=None, finish="stop", stop_reason=None):
    return {
        "id": "chatcmpl-abc",
        "model": "policy",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
                     "finish_reason": finish, "stop_reason": stop_reason}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }  # fmt: skip


def test_reply_is_a_valid_sdk_message_with_tool_use():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]
    reply = Message.model_validate(message(_chat_reply("Sure.", calls, "tool_calls"), {"model": "policy"}))
    assert reply.id == "msg_abc" and reply.role == "assistant" and reply.stop_reason == "tool_use"
    assert [b.type for b in reply.content] == ["text", "tool_use"]
    assert reply.content[1].id == "call_1" and reply.content[1].input == {"a": 1}
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (11, 7)


@pytest.mark.parametrize(
    ("finish", "matched", "reason", "sequence"),
    [("stop", None, "end_turn", None), ("length", None, "max_tokens", None), ("stop", "END", "stop_sequence", "END"),
     ("stop", 2, "end_turn", None)],
)  # fmt: skip
def test_stop_reasons(finish, matched, reason, sequence):
    reply = Message.model_validate(message(_chat_reply("hi", None, finish, matched), {"stop_sequences": ["END"]}))
    assert (reply.stop_reason, reply.stop_sequence) == (reason, sequence)


def test_arguments_that_are_not_an_object_stay_as_text():
    calls = [{"id": "c", "type": "function", "function": {"name": "add", "arguments": "[1, 2"}}]
    reply = Message.model_validate(message(_chat_reply(None, calls, "tool_calls"), {}))
    assert [(b.type, b.text) for b in reply.content] == [("text", "[1, 2")] and reply.stop_reason == "end_turn"


def test_errors_in_anthropic_shape():
    body = error_from_chat(400, json.dumps({"error": {"message": "too long", "type": "BadRequestError"}}).encode())
    assert (
        body
        == error_body("too long")
        == {"type": "error", "error": {"type": "invalid_request_error", "message": "too long"}}
    )
    assert error_from_chat(502, b"")["error"]["type"] == "api_error"


def _sdk_events(data: bytes) -> list:
    """Anthropic SSE bytes as the installed SDK parses them."""
    client = anthropic.Anthropic(api_key="x", base_url="http://127.0.0.1:9")
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/messages")
    response = httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=data, request=request)
    return anthropic.Stream(cast_to=RawMessageStreamEvent, response=response, client=client)


def _chat_sse(chunks: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _chunk(delta=None, finish=None, ids=None, **top):
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish, "token_ids": ids}
    return {"id": "chatcmpl-abc", "model": "policy", "choices": [choice], **top}


def test_stream_parses_with_the_sdk_and_matches_the_plain_reply():
    chunks = [
        _chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]),
        _chunk({"content": "Let me "}, ids=[5, 6]),
        _chunk({"content": "add."}, ids=[7]),
        _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]}, ids=[8, 9]),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "4}"}}]}, ids=[10]),
        _chunk({}, "tool_calls"),
        {"id": "chatcmpl-abc", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}},
    ]  # fmt: skip
    data = _chat_sse(chunks)
    stream = MessagesStream({"model": "policy"})
    cut = random.Random(0).sample(range(1, len(data)), 25)  # any split of the bytes
    pieces = [data[a:b] for a, b in zip([0, *sorted(cut)], [*sorted(cut), len(data)])]
    translated = b"".join(stream.feed(p) for p in pieces) + stream.end()
    events = list(_sdk_events(translated))
    assert [e.type for e in events] == ["message_start", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    assert events[0].message.usage.input_tokens == 3 and events[-2].usage.output_tokens == 5  # usage over ids
    final = MessageStream(_sdk_events(translated), anthropic.NOT_GIVEN).get_final_message()
    calls = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 4}'}}]
    plain = Message.model_validate(message(_chat_reply("Let me add.", calls, "tool_calls"), {"model": "policy"}))

    def blocks(content):
        return [b.model_dump(include={"type", "text", "id", "name", "input"}) for b in content]

    assert blocks(final.content) == blocks(plain.content) and final.stop_reason == plain.stop_reason == "tool_use"
    assert final.id == plain.id


def test_stream_error_and_broken_stream_end_in_an_error_event():
    stream = MessagesStream({})
    data = stream.feed(_chat_sse([_chunk({"content": "a"}, ids=[1]), {"error": {"message": "engine died"}}]))
    with pytest.raises(anthropic.APIStatusError, match="engine died"):
        list(_sdk_events(data + stream.end()))
    broken = MessagesStream({})
    data = broken.feed(b"data: " + json.dumps(_chunk({"content": "a"})).encode() + b"\n\n") + broken.end("cut off")
    with pytest.raises(anthropic.APIStatusError, match="cut off"):
        list(_sdk_events(data))


def _random_request(rng: random.Random) -> dict:
    """A Messages conversation of random shape: text as strings or blocks, tool calls and results."""

    def text():
        return "".join(rng.choice('ab \n{}"é') for _ in range(rng.randint(0, 6)))

    messages, pending = [], []
    for turn in range(rng.randint(1, 6)):
        if turn % 2 == 0:
            blocks = [{"type": "tool_result", "tool_use_id": i, "content": rng.choice([text(), [{"type": "text", "text": text()}]]),
                       "is_error": rng.random() < 0.3} for i in pending]  # fmt: skip
            blocks += [{"type": "text", "text": text()} for _ in range(rng.randint(0 if blocks else 1, 2))]
            messages.append(
                {
                    "role": "user",
                    "content": blocks if blocks[0]["type"] != "text" or rng.random() < 0.5 else blocks[0]["text"],
                }
            )
            pending = []
        else:
            blocks = [{"type": "text", "text": text()} for _ in range(rng.randint(0, 2))]
            pending = [f"toolu_{turn}_{k}" for k in range(rng.randint(0, 2))]
            blocks += [
                {"type": "tool_use", "id": i, "name": "add", "input": {"a": rng.randint(0, 9), "s": text()}}
                for i in pending
            ]
            messages.append({"role": "assistant", "content": blocks or text()})
    body = {"model": "m", "max_tokens": rng.randint(1, 99), "messages": messages}
    if rng.random() < 0.5:
        body["system"] = rng.choice([text(), [{"type": "text", "text": text()}, {"type": "text", "text": text()}]])
    return body


def _texts(content) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content if b["type"] == "text"]


@pytest.mark.parametrize("seed", range(200))
def test_generated_conversations_keep_every_turn_in_order(seed):
    body = _random_request(random.Random(seed))
    chat = chat_request(json.loads(json.dumps(body)))
    json.dumps(chat)  # JSON as sent
    messages = chat["messages"]
    if "system" in body:
        assert messages.pop(0) == {"role": "system", "content": "\n".join(_texts(body["system"]))}
    expected = []  # an independent reading of the conversation: what each turn says, in order
    for turn in body["messages"]:
        content = turn["content"]
        if turn["role"] == "assistant":
            uses = [] if isinstance(content, str) else [b for b in content if b["type"] == "tool_use"]
            texts = _texts(content)
            expected.append(("assistant", "\n".join(texts) if texts or not uses else None,
                             [(u["id"], u["name"], u["input"]) for u in uses]))  # fmt: skip
            continue
        results = [] if isinstance(content, str) else [b for b in content if b["type"] == "tool_result"]
        for r in results:
            value = r["content"] if isinstance(r["content"], str) else "\n".join(_texts(r["content"]))
            expected.append(("tool", r["tool_use_id"], ("Error: " if r["is_error"] else "") + value))
        if _texts(content) or not results:
            expected.append(("user", "\n".join(_texts(content))))
    got = []
    for m in messages:
        if m["role"] == "assistant":
            calls = [
                (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in m.get("tool_calls", [])
            ]
            got.append(("assistant", m["content"], calls))
        elif m["role"] == "tool":
            got.append(("tool", m["tool_call_id"], m["content"]))
        else:
            got.append((m["role"], m["content"]))
    assert got == expected
