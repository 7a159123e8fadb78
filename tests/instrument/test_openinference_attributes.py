"""The lean OpenAI span's attributes (instrument/lightning_otel/instrumentation/openinference_attributes.py): OpenInference's names
and layout, from dict bodies and SDK objects alike, and redaction."""

from __future__ import annotations

import json

from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from lightning_otel.core import schema
from lightning_otel.instrumentation.openinference_attributes import request_attributes, response_attributes, stream_text


def _input(i: int, field: str) -> str:
    return schema.message_attribute(schema.LLM_INPUT_MESSAGES, i, field)


def _output(field: str) -> str:
    return schema.message_attribute(schema.LLM_OUTPUT_MESSAGES, 0, field)


BODY = {
    "model": "policy",
    "max_tokens": 8,
    "messages": [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "what is 2+2?"}, {"type": "image_url", "image_url": {"url": "x"}}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    ],
}


def test_request_attributes_flatten_messages_like_openinference():
    a = request_attributes("chat", BODY, hide_inputs=False)
    assert a[schema.OPENINFERENCE_SPAN_KIND] == schema.KIND_LLM and a[schema.LLM_MODEL_NAME] == "policy"
    assert json.loads(a[schema.LLM_INVOCATION_PARAMETERS]) == {"model": "policy", "max_tokens": 8}
    assert schema.INPUT_VALUE not in a  # messages + parameters are the body
    assert a[_input(0, schema.MESSAGE_ROLE)] == "system" and a[_input(0, schema.MESSAGE_CONTENT)] == "be brief"
    parts = f"{_input(1, schema.MESSAGE_CONTENTS)}"
    assert a[f"{parts}.0.{schema.MESSAGE_CONTENT_TYPE}"] == "text"
    assert a[f"{parts}.0.{schema.MESSAGE_CONTENT_TEXT}"] == "what is 2+2?"
    assert a[f"{parts}.1.{schema.MESSAGE_CONTENT_TYPE}"] == "image_url"
    assert f"{parts}.1.{schema.MESSAGE_CONTENT_TEXT}" not in a
    call = f"{_input(2, schema.MESSAGE_TOOL_CALLS)}.0."
    assert a[call + schema.TOOL_CALL_ID] == "call_1" and a[call + schema.TOOL_CALL_FUNCTION_NAME] == "add"
    assert json.loads(a[call + schema.TOOL_CALL_FUNCTION_ARGUMENTS]) == {"a": 2, "b": 2}
    assert _input(2, schema.MESSAGE_CONTENT) not in a  # None content: nothing recorded
    assert a[_input(3, schema.MESSAGE_TOOL_CALL_ID)] == "call_1" and a[_input(3, schema.MESSAGE_CONTENT)] == "4"
    assert all(isinstance(v, (str, int, float, bool)) for v in a.values())  # valid OpenTelemetry values


def test_hidden_inputs_keep_only_the_parameters():
    a = request_attributes("chat", BODY, hide_inputs=True)
    assert a[schema.INPUT_VALUE] == schema.REDACTED
    assert not any(k.startswith(schema.LLM_INPUT_MESSAGES) for k in a)
    assert "be brief" not in json.dumps(a)
    assert json.loads(a[schema.LLM_INVOCATION_PARAMETERS]) == {"model": "policy", "max_tokens": 8}


def test_text_completion_request_has_no_messages():
    a = request_attributes("completions", {"model": "m", "prompt": "one two"}, hide_inputs=False)
    assert a[schema.INPUT_VALUE] == "one two" and a[schema.INPUT_MIME_TYPE] == "text/plain"
    assert json.loads(request_attributes("completions", {"prompt": [1, 2]}, False)[schema.INPUT_VALUE]) == [1, 2]
    assert json.loads(a[schema.LLM_INVOCATION_PARAMETERS]) == {"model": "m"}
    assert not any(k.startswith(schema.LLM_INPUT_MESSAGES) for k in a)


CHAT_RESPONSE = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "policy",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "let me add",
                "tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
            },
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
}


def test_response_attributes_from_sdk_object_and_dict_agree():
    from_dict = response_attributes("chat", CHAT_RESPONSE, hide_outputs=False)
    from_sdk = response_attributes("chat", ChatCompletion.model_validate(CHAT_RESPONSE), hide_outputs=False)
    assert from_dict == from_sdk
    assert from_sdk[schema.LLM_MODEL_NAME] == "policy"
    assert (
        from_sdk[schema.LLM_TOKEN_COUNT_PROMPT],
        from_sdk[schema.LLM_TOKEN_COUNT_COMPLETION],
        from_sdk[schema.LLM_TOKEN_COUNT_TOTAL],
    ) == (12, 5, 17)
    assert (
        from_sdk[_output(schema.MESSAGE_ROLE)] == "assistant"
        and from_sdk[_output(schema.MESSAGE_CONTENT)] == "let me add"
    )
    assert from_sdk[f"{_output(schema.MESSAGE_TOOL_CALLS)}.0.{schema.TOOL_CALL_FUNCTION_NAME}"] == "add"
    assert from_sdk[schema.OUTPUT_VALUE] == "let me add" and from_sdk[schema.OUTPUT_MIME_TYPE] == "text/plain"


def test_hidden_outputs_keep_model_and_counts():
    a = response_attributes("chat", CHAT_RESPONSE, hide_outputs=True)
    assert a[schema.OUTPUT_VALUE] == schema.REDACTED
    assert not any(k.startswith(schema.LLM_OUTPUT_MESSAGES) for k in a)
    assert a[schema.LLM_TOKEN_COUNT_COMPLETION] == 5 and a[schema.LLM_MODEL_NAME] == "policy"


def test_text_completion_response_and_stream_chunks():
    response = {
        "id": "t",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": " three", "finish_reason": "length", "logprobs": None}],
    }
    a = response_attributes("completions", Completion.model_validate(response), hide_outputs=False)
    assert a[schema.OUTPUT_VALUE] == " three" and not any(k.startswith(schema.LLM_OUTPUT_MESSAGES) for k in a)
    assert stream_text("completions", response) == " three"
    chunk = {"choices": [{"index": 0, "delta": {"content": "fo"}}]}
    assert stream_text("chat", chunk) == "fo"
    assert stream_text("chat", {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}) is None
    assert stream_text("chat", {"choices": []}) is None
