"""Spans in OpenTelemetry's GenAI semantic conventions, read by the collector's views and the trainer
(no vLLM here; tests/instrument/test_genai_clients.py runs the real instrumentations).

- Ingest fills the promoted columns from gen_ai.* when a span has no value of its own, in both
  decoders alike, and keeps the gen_ai.* attributes in the map.
- The once-per-call rule: a GenAI span around or inside a call captured with token ids, or around
  another span of the same call without ids, is a wrapper.
- The trainer rebuilds a GenAI call from its JSON-parts messages as the chat template renders the
  messages the agent sent.
"""

from __future__ import annotations

import json

import pytest
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes
from transformers import AutoTokenizer

from lightning_otel.collector import connect, span_decoder, span_rows
from lightning_otel.core import schema
from lightning_otel.trainer.reconstruct import reconstruct_call

MS = 1_000_000  # nanoseconds


def _chat_attributes(**extra) -> dict:
    return {
        schema.GEN_AI_OPERATION_NAME: schema.GEN_AI_OP_CHAT,
        schema.GEN_AI_PROVIDER_NAME: "openai",
        schema.GEN_AI_REQUEST_MODEL: "requested",
        schema.GEN_AI_RESPONSE_MODEL: "served",
        schema.GEN_AI_USAGE_INPUT_TOKENS: 12,
        schema.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        schema.GEN_AI_RESPONSE_FINISH_REASONS: ("length",),
        **extra,
    }


def _rows(spans) -> tuple[list[dict], list[dict]]:
    body = request_bytes(spans)
    fast = span_decoder.batch_from_body(body).to_pylist()
    reference = span_rows.to_batch([span_rows.decode_request(body)]).to_pylist()
    return fast, reference


def test_both_decoders_fill_columns_from_gen_ai_attributes():
    def build(tracer):
        tracer.start_span("chat served", attributes=_chat_attributes()).end()
        # v1.36: gen_ai.system, no response model; request model is the fallback
        tracer.start_span(
            "chat old",
            attributes={
                schema.GEN_AI_OPERATION_NAME: "chat",
                schema.GEN_AI_SYSTEM: "openai",
                schema.GEN_AI_REQUEST_MODEL: "requested",
            },
        ).end()
        tool = {schema.GEN_AI_OPERATION_NAME: "execute_tool", schema.GEN_AI_TOOL_NAME: "add"}
        tracer.start_span("execute_tool add", attributes=tool).end()
        tracer.start_span("invoke_agent a", attributes={schema.GEN_AI_OPERATION_NAME: "invoke_agent"}).end()
        # OpenInference's own values win, whatever the order; values of the wrong type fill nothing
        both = {
            schema.GEN_AI_RESPONSE_MODEL: "gen-ai",
            schema.LLM_MODEL_NAME: "openinference",
            schema.OPENINFERENCE_SPAN_KIND: schema.KIND_CHAIN,
            schema.GEN_AI_OPERATION_NAME: "chat",
            schema.GEN_AI_USAGE_INPUT_TOKENS: "12",
        }
        tracer.start_span("both", attributes=both).end()
        tracer.start_span("unknown op", attributes={schema.GEN_AI_OPERATION_NAME: "retrieve"}).end()

    fast, reference = _rows(make_spans(build))
    assert span_decoder.available()  # the C decoder ran (built in this environment)
    assert fast == reference
    columns = ("span_kind", "model_name", "token_count_prompt", "token_count_completion", "tool_name", "finish_reason")
    got = {row["name"]: tuple(row[c] for c in columns) for row in fast}
    assert got == {
        "chat served": ("LLM", "served", 12, 5, None, "length"),
        "chat old": ("LLM", "requested", None, None, None, None),
        "execute_tool add": ("TOOL", None, None, None, "add", None),
        "invoke_agent a": ("AGENT", None, None, None, None, None),
        "both": ("CHAIN", "openinference", None, None, None, None),
        "unknown op": (None, None, None, None, None, None),
    }
    served = dict(next(row for row in fast if row["name"] == "chat served")["attributes"])
    assert served[schema.GEN_AI_RESPONSE_MODEL] == "served"  # the convention's names stay queryable
    assert json.loads(served[schema.GEN_AI_RESPONSE_FINISH_REASONS]) == ["length"]


@pytest.fixture
def collector(tmp_path):
    with local_collector(tmp_path / "data") as running:
        yield running


def _calls(collector, build) -> tuple[dict, dict, dict]:
    """llm_calls' training_source, llm_spans' is_wrapper and span ids, by span name."""
    assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
    collector.flush()
    conn = connect(collector.data_dir)
    calls = dict(conn.execute("SELECT name, training_source FROM llm_calls").fetchall())
    wrappers = dict(conn.execute("SELECT name, is_wrapper FROM llm_spans").fetchall())
    ids = dict(conn.execute("SELECT name, span_id FROM llm_spans").fetchall())
    return calls, wrappers, ids


def _captured(tracer, name, start, end):
    """An LLM span with token ids, as instrument() or the gateway writes it."""
    attributes = {
        schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
        schema.PROMPT_TOKEN_IDS: (1, 2, 3),
        schema.COMPLETION_TOKEN_IDS: (4, 5),
        schema.COMPLETION_LOGPROBS: (-0.5, -0.25),
    }
    tracer.start_span(name, attributes=attributes, start_time=start).end(end_time=end)


def _gen_ai(tracer, name, start, end, **extra):
    tracer.start_span(name, attributes=_chat_attributes(**extra), start_time=start).end(end_time=end)


def test_a_call_seen_by_two_instrumentations_counts_once(collector):
    from opentelemetry import trace

    def build(tracer):
        root = tracer.start_span("agent", start_time=0)
        with trace.use_span(root, end_on_exit=False):
            _gen_ai(tracer, "genai around", 10 * MS, 20 * MS)  # openai-v2 outside instrument()
            _captured(tracer, "captured inside", 11 * MS, 19 * MS)
            _captured(tracer, "captured around", 30 * MS, 40 * MS)  # instrument() outside openai-v2
            _gen_ai(tracer, "genai inside", 31 * MS, 39 * MS)
            _gen_ai(tracer, "framework chat", 50 * MS, 60 * MS)  # Pydantic AI around openai-v2, no ids
            _gen_ai(tracer, "sdk chat", 51 * MS, 59 * MS)
            _gen_ai(tracer, "twin a", 70 * MS, 80 * MS)  # one window: the larger span id is the call
            _gen_ai(tracer, "twin b", 70 * MS, 80 * MS)
            _gen_ai(tracer, "alone", 90 * MS, 95 * MS)  # a call nobody else saw
            _gen_ai(tracer, "next", 96 * MS, 99 * MS)  # sequential, not nested: a call of its own
        root.end(end_time=100 * MS)

    calls, wrappers, ids = _calls(collector, build)
    twin_call, twin_wrapper = sorted(["twin a", "twin b"], key=ids.get, reverse=True)  # span ids are random
    assert calls == {
        "captured inside": "token_ids",
        "captured around": "token_ids",
        "sdk chat": "none",
        twin_call: "none",
        "alone": "none",
        "next": "none",
    }
    assert {name for name, wrapper in wrappers.items() if wrapper} == {
        "genai around",
        "genai inside",
        "framework chat",
        twin_wrapper,
    }


def test_training_source_and_messages_per_call(collector):
    text = [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": "hello"}], "finish_reason": "stop"}]
    image = [{"role": "user", "parts": [{"type": "blob", "modality": "image", "content": "AAAA"}]}]
    untyped = [{"role": "user", "parts": [{"content": "hi"}]}]

    def build(tracer):
        def chat(name, start, messages_in, messages_out):
            extra = {}
            for attribute, messages in (
                (schema.GEN_AI_INPUT_MESSAGES, messages_in),
                (schema.GEN_AI_OUTPUT_MESSAGES, messages_out),
            ):
                if messages is not None:
                    extra[attribute] = messages if isinstance(messages, str) else json.dumps(messages)
            _gen_ai(tracer, name, start * MS, (start + 1) * MS, **extra)

        chat("latest", 0, text, answer)
        chat("v1.36", 2, None, None)
        chat("image", 4, image, answer)
        chat("untyped part", 6, untyped, answer)
        chat("no output", 8, text, None)
        chat("broken json", 10, text, '[{"role": "assistant", "parts": [')

    calls, _, _ = _calls(collector, build)
    assert calls == {
        "latest": "messages",
        "v1.36": "none",
        "image": "none",
        "untyped part": "none",
        "no output": "none",
        "broken json": "none",
    }
    conn = connect(collector.data_dir)
    row = conn.execute(
        "SELECT model_name, token_count_prompt, token_count_completion, finish_reason, input_messages, output_messages "
        "FROM llm_calls WHERE name = 'latest'"
    ).fetchone()
    assert row[:4] == ("served", 12, 5, "length")
    assert json.loads(row[4]) == text and json.loads(row[5]) == answer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from lightning_otel.testing.tiny_model import build_tiny_model

    # the tool-calling dialect: its template renders tool calls and results (the default one drops them)
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tools-model"), tool_calls=True))


def test_reconstructs_gen_ai_messages_as_the_template_renders_the_sent_ones(tokenizer):
    # what the agent sent, in OpenAI's chat format (the reference), and how openai-v2 recorded it
    sent = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
            ],
        },
        {"role": "tool", "content": "5", "tool_call_id": "c1"},
    ]
    recorded = [
        {"role": "system", "parts": [{"type": "text", "content": "You add numbers."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What is 2 + 3?"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "5"}]},
    ]
    output = [{"role": "assistant", "parts": [{"type": "text", "content": " five"}], "finish_reason": "stop"}]
    attributes = {
        schema.GEN_AI_INPUT_MESSAGES: json.dumps(recorded),
        schema.GEN_AI_OUTPUT_MESSAGES: json.dumps(output),
        schema.GEN_AI_RESPONSE_FINISH_REASONS: json.dumps(["stop"]),
    }
    call = reconstruct_call("s1", attributes, tokenizer, "3")
    expected_prompt = tokenizer.apply_chat_template(sent, add_generation_prompt=True, tokenize=True)
    expected_prompt = expected_prompt["input_ids"] if hasattr(expected_prompt, "keys") else expected_prompt
    assert call.prompt_ids.tolist() == list(expected_prompt)
    assert "<tool_call>" in tokenizer.decode(call.prompt_ids) and "<tool_response>" in tokenizer.decode(call.prompt_ids)
    assert call.completion_ids.tolist() == tokenizer.encode(" five", add_special_tokens=False) + [
        tokenizer.eos_token_id
    ]
    assert call.reconstructed and call.policy_version == "3"
    assert len(call.logprobs) == len(call.completion_ids) and all(lp != lp for lp in call.logprobs)  # NaN

    # a tool call as the answer: the template's rendering of that assistant turn (Qwen2.5's format)
    call_part = {"type": "tool_call", "id": "c2", "name": "add", "arguments": {"a": 5, "b": 1}}
    first_turn = {**attributes, schema.GEN_AI_INPUT_MESSAGES: json.dumps(recorded[:2])}
    first_turn[schema.GEN_AI_OUTPUT_MESSAGES] = json.dumps([{"role": "assistant", "parts": [call_part]}])
    rendered = '<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 1}}\n</tool_call><|im_end|>\n'
    completion = reconstruct_call("s0", first_turn, tokenizer).completion_ids.tolist()
    assert completion == tokenizer.encode(rendered, add_special_tokens=False)

    # Pydantic AI's shape: the tool's result under role "user", arguments as the model's JSON text
    pydantic = [
        recorded[1],
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}],
        },
        {"role": "user", "parts": [{"type": "tool_call_response", "id": "c1", "name": "add", "result": 5}]},
    ]
    attributes[schema.GEN_AI_INPUT_MESSAGES] = json.dumps(pydantic)
    attributes[schema.GEN_AI_SYSTEM_INSTRUCTIONS] = json.dumps([{"type": "text", "content": "You add numbers."}])
    assert reconstruct_call("s1", attributes, tokenizer).prompt_ids.tolist() == list(expected_prompt)

    attributes[schema.GEN_AI_INPUT_MESSAGES] = json.dumps([{"role": "user", "parts": [{"type": "blob"}]}])
    assert reconstruct_call("s1", attributes, tokenizer) is None  # a part no template renders: not rebuilt


def test_openinference_messages_read_in_the_gen_ai_shape(collector):
    def m(index: int, field: str, messages: str = schema.LLM_INPUT_MESSAGES) -> str:
        return schema.message_attribute(messages, index, field)

    call = f"{schema.MESSAGE_TOOL_CALLS}.0."
    attributes = {
        schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
        m(0, schema.MESSAGE_ROLE): "user",
        m(0, schema.MESSAGE_CONTENT): "What is 2 + 3?",
        m(1, schema.MESSAGE_ROLE): "assistant",
        m(1, call + schema.TOOL_CALL_ID): "c1",
        m(1, call + schema.TOOL_CALL_FUNCTION_NAME): "add",
        m(1, call + schema.TOOL_CALL_FUNCTION_ARGUMENTS): '{"a": 2, "b": 3}',
        m(2, schema.MESSAGE_ROLE): "tool",
        m(2, schema.MESSAGE_CONTENT): "5",
        m(2, schema.MESSAGE_TOOL_CALL_ID): "c1",
        m(0, schema.MESSAGE_ROLE, schema.LLM_OUTPUT_MESSAGES): "assistant",
        m(0, schema.MESSAGE_CONTENT, schema.LLM_OUTPUT_MESSAGES): "five",
    }
    assert (
        post(
            collector.http_endpoint + "/v1/traces",
            request_bytes(make_spans(lambda tracer: tracer.start_span("ChatCompletion", attributes=attributes).end())),
        )[0]
        == 200
    )
    collector.flush()
    row = (
        connect(collector.data_dir)
        .execute("SELECT input_messages, output_messages, training_source FROM llm_calls")
        .fetchall()
    )
    ((messages_in, messages_out, source),) = row
    assert json.loads(messages_in) == [
        {"role": "user", "parts": [{"type": "text", "content": "What is 2 + 3?"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "5"}]},
    ]
    assert json.loads(messages_out) == [{"role": "assistant", "parts": [{"type": "text", "content": "five"}]}]
    assert source == "messages"
