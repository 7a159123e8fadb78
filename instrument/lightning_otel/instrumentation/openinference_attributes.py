"""OpenInference attributes of an OpenAI-style call, from its request body and its response.

Used by the lean OpenAI SDK span (instrument()'s default): the attributes OpenInference's
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
from collections.abc import Mapping
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from lightning_otel.core import schema
from lightning_otel.core.vllm_endpoint import CHAT, first_choice, read_field

_NOT_PARAMETERS = frozenset(("messages", "prompt"))


_KEYS: dict[tuple[str, int], tuple[str, ...]] = {}


def _keys(prefix: str, index: int) -> tuple[str, ...]:
    """One message's attribute names (role, content, name, tool call id, content parts, tool calls),
    made once per (messages, index): they are the same on every call."""
    keys = _KEYS.get((prefix, index))
    if keys is None:
        start = schema.message_attribute(prefix, index, "")  # "llm.input_messages.0."
        fields = (
            schema.MESSAGE_ROLE,
            schema.MESSAGE_CONTENT,
            schema.MESSAGE_NAME,
            schema.MESSAGE_TOOL_CALL_ID,
            schema.MESSAGE_CONTENTS,
            schema.MESSAGE_TOOL_CALLS,
        )
        keys = tuple(start + field for field in fields)
        if len(_KEYS) < 4096:
            _KEYS[(prefix, index)] = keys
    return keys


def _message(prefix: str, index: int, message: Any, attributes: dict[str, Any]) -> None:
    role_key, content_key, name_key, tool_call_id_key, contents_key, tool_calls_key = _keys(prefix, index)
    if type(message) is dict:  # a request's messages, or the response JSON: plain reads
        get = message.get
        role, content, name, tool_call_id, tool_calls = (
            get("role"),
            get("content"),
            get("name"),
            get("tool_call_id"),
            get("tool_calls"),
        )
    else:
        role, content, name, tool_call_id, tool_calls = (read_field(message, key) for key in _MESSAGE_FIELDS)
    if role is not None:
        attributes[role_key] = str(role)
    if isinstance(content, str):
        attributes[content_key] = content
    elif isinstance(content, list):  # content parts: text parts kept, others by type only
        for j, part in enumerate(content):
            part_prefix = f"{contents_key}.{j}."
            kind = read_field(part, "type")
            attributes[part_prefix + schema.MESSAGE_CONTENT_TYPE] = str(kind)
            if kind == "text":
                attributes[part_prefix + schema.MESSAGE_CONTENT_TEXT] = str(read_field(part, "text"))
    if name is not None:
        attributes[name_key] = str(name)
    if tool_call_id is not None:
        attributes[tool_call_id_key] = str(tool_call_id)
    for j, call in enumerate(tool_calls or ()):
        call_prefix = f"{tool_calls_key}.{j}."
        function = read_field(call, "function")
        for field, value in (
            (schema.TOOL_CALL_ID, read_field(call, "id")),
            (schema.TOOL_CALL_FUNCTION_NAME, read_field(function, "name")),
            (schema.TOOL_CALL_FUNCTION_ARGUMENTS, read_field(function, "arguments")),
        ):
            if value is not None:
                attributes[call_prefix + field] = str(value)


_MESSAGE_FIELDS = ("role", "content", "name", "tool_call_id", "tool_calls")


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
# json's C encoder made once, without the circular-reference memo (JSONEncoder builds both per call:
# half the time of encoding a call's parameters); a circular value ends in RecursionError instead
_C_ENCODER = (
    c_make_encoder(None, str, encode_basestring_ascii, None, ": ", ", ", False, False, True) if c_make_encoder else None
)


def _json(value: Any) -> str:
    try:
        return "".join(_C_ENCODER(value, 0)) if _C_ENCODER is not None else _ENCODER.encode(value)
    except (ValueError, RecursionError):  # a circular structure: the call itself will fail to send it too
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
        for name, key in (
            (schema.LLM_TOKEN_COUNT_PROMPT, "prompt_tokens"),
            (schema.LLM_TOKEN_COUNT_COMPLETION, "completion_tokens"),
            (schema.LLM_TOKEN_COUNT_TOTAL, "total_tokens"),
        ):
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
