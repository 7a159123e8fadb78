"""OpenInference attributes of an OpenAI-style call, from its request body and its response.

Used by the lean OpenAI SDK span (`instrument(openai_spans="lean")`): the attributes OpenInference's
OpenAI instrumentor writes for chat and text completions that people read (model, invocation
parameters, messages with tool calls, token counts, input as JSON), built with as little work as
possible, because this runs on every model call. Left out, on purpose: a chat request's body as
`input.value` (its messages and parameters are recorded, which together are the body),
`output.value` as the whole response JSON (with vLLM's token ids and logprobs it is mostly numbers
the span already holds packed; the assistant's text goes to `output.value` instead) and the tool
definitions as `llm.tools` (they are in the parameters). Standard library only (agent side).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from lightning_otel.instrument import schema
from lightning_otel.instrument.vllm_endpoint import CHAT, first_choice, read_field

_NOT_PARAMETERS = frozenset(("messages", "prompt"))


def _message(prefix: str, index: int, message: Any, attributes: dict[str, Any]) -> None:
    start = schema.message_attribute(prefix, index, "")  # "llm.input_messages.0."

    def name(field: str) -> str:
        return start + field

    role = read_field(message, "role")
    if role is not None:
        attributes[name(schema.MESSAGE_ROLE)] = str(role)
    content = read_field(message, "content")
    if isinstance(content, str):
        attributes[name(schema.MESSAGE_CONTENT)] = content
    elif isinstance(content, list):  # content parts: text parts kept, others by type only
        for j, part in enumerate(content):
            part_prefix = f"{name(schema.MESSAGE_CONTENTS)}.{j}."
            kind = read_field(part, "type")
            attributes[part_prefix + schema.MESSAGE_CONTENT_TYPE] = str(kind)
            if kind == "text":
                attributes[part_prefix + schema.MESSAGE_CONTENT_TEXT] = str(read_field(part, "text"))
    for field, key in ((schema.MESSAGE_NAME, "name"), (schema.MESSAGE_TOOL_CALL_ID, "tool_call_id")):
        value = read_field(message, key)
        if value is not None:
            attributes[name(field)] = str(value)
    for j, call in enumerate(read_field(message, "tool_calls") or ()):
        call_prefix = f"{name(schema.MESSAGE_TOOL_CALLS)}.{j}."
        function = read_field(call, "function")
        for field, value in ((schema.TOOL_CALL_ID, read_field(call, "id")),
                             (schema.TOOL_CALL_FUNCTION_NAME, read_field(function, "name")),
                             (schema.TOOL_CALL_FUNCTION_ARGUMENTS, read_field(function, "arguments"))):  # fmt: skip
            if value is not None:
                attributes[call_prefix + field] = str(value)


def request_attributes(kind: str, body: Mapping[str, Any], hide_inputs: bool) -> dict[str, Any]:
    """Span-start attributes of a chat ('chat') or text ('completions') request body. A chat request
    is recorded as its messages plus its parameters (which together are the whole body, so the body
    is not serialized a third time into `input.value`); a text completion's prompt is `input.value`."""
    attributes: dict[str, Any] = {schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM, schema.LLM_SYSTEM: "openai"}
    if body.get("model") is not None:
        attributes[schema.LLM_MODEL_NAME] = str(body["model"])
    parameters = {k: v for k, v in body.items() if k not in _NOT_PARAMETERS}
    attributes[schema.LLM_INVOCATION_PARAMETERS] = _json(parameters)
    if hide_inputs:
        attributes[schema.INPUT_VALUE] = schema.REDACTED
    elif kind == CHAT:
        for index, message in enumerate(body.get("messages") or ()):
            _message(schema.LLM_INPUT_MESSAGES, index, message, attributes)
    else:
        prompt = body.get("prompt")
        attributes[schema.INPUT_VALUE] = prompt if isinstance(prompt, str) else _json(prompt)
        attributes[schema.INPUT_MIME_TYPE] = "text/plain" if isinstance(prompt, str) else "application/json"
    return attributes


_ENCODER = json.JSONEncoder(default=str)  # json.dumps(default=...) would build an encoder per call


def _json(value: Any) -> str:
    try:
        return _ENCODER.encode(value)
    except ValueError:  # a circular structure: the call itself will fail to send it too
        return str(value)


def output_attributes(kind: str, text: str | None, hide_outputs: bool, message: Any = None) -> dict[str, Any]:
    """The completion's text (and, for chat, the assistant message) as attributes."""
    attributes: dict[str, Any] = {}
    if message is not None and not hide_outputs:
        _message(schema.LLM_OUTPUT_MESSAGES, 0, message, attributes)
    elif kind == CHAT and text is not None and not hide_outputs:
        attributes[schema.message_attribute(schema.LLM_OUTPUT_MESSAGES, 0, schema.MESSAGE_ROLE)] = "assistant"
        attributes[schema.message_attribute(schema.LLM_OUTPUT_MESSAGES, 0, schema.MESSAGE_CONTENT)] = text
    if text is not None or hide_outputs:
        attributes[schema.OUTPUT_VALUE] = schema.REDACTED if hide_outputs else text
        attributes[schema.OUTPUT_MIME_TYPE] = "text/plain"
    return attributes


def response_attributes(kind: str, response: Any, hide_outputs: bool) -> dict[str, Any]:
    """Span-end attributes of a non-streaming response (an SDK object or a dict): model, token
    counts, and choice 0's output."""
    attributes: dict[str, Any] = {}
    model = read_field(response, "model")
    if model:
        attributes[schema.LLM_MODEL_NAME] = str(model)
    usage = read_field(response, "usage")
    if usage is not None:
        for name, key in ((schema.LLM_TOKEN_COUNT_PROMPT, "prompt_tokens"),
                          (schema.LLM_TOKEN_COUNT_COMPLETION, "completion_tokens"),
                          (schema.LLM_TOKEN_COUNT_TOTAL, "total_tokens")):  # fmt: skip
            value = read_field(usage, key)
            if isinstance(value, int):
                attributes[name] = value
    choice = first_choice(response)
    if choice is not None:
        if kind == CHAT:
            message = read_field(choice, "message")
            text = read_field(message, "content") if message is not None else None
            attributes.update(output_attributes(kind, text if isinstance(text, str) else None, hide_outputs, message))
        else:
            text = read_field(choice, "text")
            attributes.update(output_attributes(kind, text if isinstance(text, str) else None, hide_outputs))
    return attributes


def stream_text(kind: str, chunk: Any) -> str | None:
    """The text a stream chunk adds to choice 0 (chat: delta.content; completions: text)."""
    choice = first_choice(chunk)
    if choice is None:
        return None
    if kind == CHAT:
        delta = read_field(choice, "delta")
        text = read_field(delta, "content") if delta is not None else None
    else:
        text = read_field(choice, "text")
    return text if isinstance(text, str) else None
