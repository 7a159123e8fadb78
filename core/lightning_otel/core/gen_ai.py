"""OpenTelemetry's GenAI semantic conventions, written next to OpenInference's attributes when asked
(instrument(gen_ai_conventions=...), the gateway's --gen-ai-conventions): what to write for an
OpenAI-style chat or text completion, a tool step and an agent run (docs/span-schema.md, "Writing
GenAI semantic conventions").

Two shapes, as the conventions' transition plan and opentelemetry-instrumentation-openai-v2 have it:
- "v1.36" (without OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental): `gen_ai.system`, the
  request, response and usage attributes; no message content (v1.36 puts it in log events, which we
  do not emit);
- "latest" (with it): `gen_ai.provider.name` instead of `gen_ai.system`, plus `gen_ai.request.stream`
  and, unless hidden, the messages as JSON parts (`gen_ai.input.messages`, `gen_ai.output.messages`)
  and tool arguments and results. A chat's system messages are part of its chat history, so they stay
  in `gen_ai.input.messages` (the conventions' note on `gen_ai.system_instructions`).

Standard library only (agent side and gateway).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Literal, get_args

from lightning_otel.core import schema
from lightning_otel.core.vllm_endpoint import CHAT, read_field

GenAIConventions = Literal["auto", "on", "off", "latest", "v1.36"]
GEN_AI_SETTINGS: tuple[str, ...] = get_args(GenAIConventions)
GEN_AI_HELP = (
    "also write OpenTelemetry's GenAI semantic-convention attributes: auto (only when "
    "OTEL_SEMCONV_STABILITY_OPT_IN has gen_ai_latest_experimental), on (the shape that variable selects: "
    "latest, else v1.36), off, latest, v1.36"
)


def latest_opted_in() -> bool:
    """Whether OTEL_SEMCONV_STABILITY_OPT_IN (a comma-separated list) asks for the latest GenAI shape."""
    values = os.environ.get(schema.SEMCONV_STABILITY_OPT_IN_ENV, "")
    return schema.SEMCONV_GEN_AI_LATEST in (value.strip() for value in values.split(","))


def chosen_shape(setting: str) -> str | None:
    """The shape to write for a setting ("auto", "on", "off", "latest", "v1.36"), or None for none."""
    if setting not in GEN_AI_SETTINGS:
        raise ValueError(f"gen_ai_conventions must be one of {GEN_AI_SETTINGS}, got {setting!r}")
    if setting in (schema.GEN_AI_SHAPE_LATEST, schema.GEN_AI_SHAPE_V1_36):
        return setting
    if latest_opted_in():
        return None if setting == "off" else schema.GEN_AI_SHAPE_LATEST
    return schema.GEN_AI_SHAPE_V1_36 if setting == "on" else None


def _provider_key(shape: str) -> str:
    return schema.GEN_AI_PROVIDER_NAME if shape == schema.GEN_AI_SHAPE_LATEST else schema.GEN_AI_SYSTEM


def operation(kind: str) -> str:
    return schema.GEN_AI_OP_CHAT if kind == CHAT else schema.GEN_AI_OP_TEXT_COMPLETION


def span_name(kind: str, model: Any) -> str:
    """`{gen_ai.operation.name} {gen_ai.request.model}` (the operation alone without a model)."""
    return f"{operation(kind)} {model}" if model else operation(kind)


_FLOAT_PARAMETERS = (
    ("temperature", schema.GEN_AI_REQUEST_TEMPERATURE),
    ("top_p", schema.GEN_AI_REQUEST_TOP_P),
    ("presence_penalty", schema.GEN_AI_REQUEST_PRESENCE_PENALTY),
    ("frequency_penalty", schema.GEN_AI_REQUEST_FREQUENCY_PENALTY),
)


def request_attributes(kind: str, body: Mapping[str, Any], shape: str, hide_inputs: bool) -> dict[str, Any]:
    """The attributes known when a chat ('chat') or text ('completions') request starts."""
    attributes: dict[str, Any] = {
        schema.GEN_AI_OPERATION_NAME: operation(kind),
        _provider_key(shape): schema.GEN_AI_PROVIDER_OPENAI,
    }
    get = body.get
    if get("model") is not None:
        attributes[schema.GEN_AI_REQUEST_MODEL] = str(get("model"))
    for key, name in _FLOAT_PARAMETERS:
        value = get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[name] = float(value)
    max_tokens = get("max_completion_tokens", get("max_tokens"))
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        attributes[schema.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    seed, n, stop = get("seed"), get("n"), get("stop")
    if isinstance(seed, int) and not isinstance(seed, bool):
        attributes[schema.GEN_AI_REQUEST_SEED] = seed
    if isinstance(n, int) and not isinstance(n, bool) and n != 1:
        attributes[schema.GEN_AI_REQUEST_CHOICE_COUNT] = n
    # string[] values as tuples: what the SDK keeps, and what the lean span's encoder takes as they are
    if isinstance(stop, str):
        attributes[schema.GEN_AI_REQUEST_STOP_SEQUENCES] = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        attributes[schema.GEN_AI_REQUEST_STOP_SEQUENCES] = tuple(stop)
    if shape == schema.GEN_AI_SHAPE_LATEST:
        if get("stream") is True:
            attributes[schema.GEN_AI_REQUEST_STREAM] = True
        if not hide_inputs:
            messages = input_messages(kind, body)
            if messages is not None:
                attributes[schema.GEN_AI_INPUT_MESSAGES] = _dumps(messages)
    return attributes


def input_messages(kind: str, body: Mapping[str, Any]) -> list[dict] | None:
    """The request's messages in the conventions' JSON parts (gen-ai-input-messages.json); a text
    completion's prompt as one user message. None when there is nothing to record."""
    if kind != CHAT:
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            return None  # token-id prompts: no text
        return [{"role": "user", "parts": [_text(p) for p in prompts]}]
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    return [_message(message) for message in messages]


def _message(message: Any) -> dict[str, Any]:
    role = read_field(message, "role")
    content = read_field(message, "content")
    parts: list[dict[str, Any]] = []
    if role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": _str(read_field(message, "tool_call_id")), "response": content}
        )
    else:
        parts.extend(_content_parts(content))
        parts.extend(_tool_call(call) for call in read_field(message, "tool_calls") or ())
    result: dict[str, Any] = {"role": str(role) if role is not None else "user", "parts": parts}
    name = read_field(message, "name")
    if isinstance(name, str):
        result["name"] = name
    return result


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [_text(content)]
    parts = []
    for part in content if isinstance(content, list) else ():
        kind = read_field(part, "type")
        if kind == "text":
            parts.append(_text(str(read_field(part, "text"))))
        elif kind == "image_url":
            url = read_field(read_field(part, "image_url"), "url")
            parts.append(_image(str(url)) if url is not None else {"type": "image_url"})
        else:
            parts.append({"type": str(kind)})  # a part we do not map: its type only (the generic part)
    return parts


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        mime_type, data = url[5:].split(";base64,", 1)
        return {"type": "blob", "modality": "image", "mime_type": mime_type or None, "content": data}
    return {"type": "uri", "modality": "image", "uri": url}


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "content": text}


def _tool_call(call: Any) -> dict[str, Any]:
    function = read_field(call, "function")
    arguments = read_field(function, "arguments") if function is not None else None
    return {
        "type": "tool_call",
        "id": _str(read_field(call, "id")),
        "name": str(read_field(function, "name") or "") if function is not None else "",
        "arguments": _parsed(arguments),
    }


def _parsed(arguments: Any) -> Any:
    """Tool arguments as an object: the conventions ask to deserialize a JSON string when one is given."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):  # a circular structure
        return json.dumps(str(value), ensure_ascii=False)


def response_attributes(kind: str, response: Any, shape: str, hide_outputs: bool) -> dict[str, Any]:
    """The attributes of a whole (non-streamed) response: an SDK object or its JSON."""
    attributes: dict[str, Any] = {}
    model, response_id, usage = read_field(response, "model"), read_field(response, "id"), read_field(response, "usage")
    if model:
        attributes[schema.GEN_AI_RESPONSE_MODEL] = str(model)
    if response_id:
        attributes[schema.GEN_AI_RESPONSE_ID] = str(response_id)
    if usage is not None:
        for name, key in (
            (schema.GEN_AI_USAGE_INPUT_TOKENS, "prompt_tokens"),
            (schema.GEN_AI_USAGE_OUTPUT_TOKENS, "completion_tokens"),
        ):
            value = read_field(usage, key)
            if isinstance(value, int):
                attributes[name] = value
    choices = read_field(response, "choices")
    choices = choices if isinstance(choices, list) else []
    reasons = tuple(_finish_reason(read_field(choice, "finish_reason")) for choice in choices)
    if reasons:
        attributes[schema.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    if shape == schema.GEN_AI_SHAPE_LATEST and not hide_outputs and choices:
        messages = []
        for choice, reason in zip(choices, reasons, strict=True):
            if kind == CHAT:
                message = read_field(choice, "message")
                role = read_field(message, "role") if message is not None else None
                content = read_field(message, "content") if message is not None else None
                calls = (read_field(message, "tool_calls") if message is not None else None) or ()
                parts = ([_text(content)] if isinstance(content, str) else []) + [_tool_call(c) for c in calls]
            else:
                role, text = None, read_field(choice, "text")
                parts = [_text(text)] if isinstance(text, str) else []
            messages.append({"role": str(role or "assistant"), "parts": parts, "finish_reason": reason})
        attributes[schema.GEN_AI_OUTPUT_MESSAGES] = _dumps(messages)
    return attributes


def _finish_reason(reason: Any) -> str:
    """A choice's finish reason; none given is recorded as "error" (as opentelemetry-instrumentation-openai-v2
    does: the output messages' schema requires one)."""
    return str(reason) if reason else "error"


class StreamedResponse:
    """A streamed response gathered chunk by chunk (SDK objects or their JSON), so its span gets what
    a whole response's would: model, id, usage when the stream carries it, and per choice the text, the
    tool calls and the finish reason."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.model: Any = None
        self.id: Any = None
        self.usage: Any = None
        self.choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: Any) -> None:
        self.model = self.model or read_field(chunk, "model")
        self.id = self.id or read_field(chunk, "id")
        self.usage = read_field(chunk, "usage") or self.usage
        for choice in read_field(chunk, "choices") or ():
            index = read_field(choice, "index") or 0
            state = self.choices.setdefault(index, {"text": [], "calls": {}, "finish_reason": None, "role": None})
            state["finish_reason"] = read_field(choice, "finish_reason") or state["finish_reason"]
            if self.kind != CHAT:
                text = read_field(choice, "text")
                if isinstance(text, str):
                    state["text"].append(text)
                continue
            delta = read_field(choice, "delta")
            if delta is None:
                continue
            state["role"] = read_field(delta, "role") or state["role"]
            text = read_field(delta, "content")
            if isinstance(text, str):
                state["text"].append(text)
            for call in read_field(delta, "tool_calls") or ():
                slot = state["calls"].setdefault(read_field(call, "index") or 0, {"id": None, "name": "", "args": []})
                slot["id"] = read_field(call, "id") or slot["id"]
                function = read_field(call, "function")
                if function is not None:
                    slot["name"] += read_field(function, "name") or ""
                    slot["args"].append(read_field(function, "arguments") or "")

    def response(self) -> dict[str, Any]:
        """What was streamed, as the JSON of a whole response (for response_attributes)."""
        choices = []
        for index in sorted(self.choices):
            state = self.choices[index]
            text = "".join(state["text"]) if state["text"] else None
            if self.kind != CHAT:
                choices.append({"index": index, "text": text, "finish_reason": state["finish_reason"]})
                continue
            calls = [
                {
                    "id": slot["id"],
                    "type": "function",
                    "function": {"name": slot["name"], "arguments": "".join(slot["args"])},
                }
                for _, slot in sorted(state["calls"].items())
            ]
            message = {"role": state["role"] or "assistant", "content": text, "tool_calls": calls or None}
            choices.append({"index": index, "message": message, "finish_reason": state["finish_reason"]})
        usage = self.usage
        if usage is not None and not isinstance(usage, dict):
            usage = {key: read_field(usage, key) for key in ("prompt_tokens", "completion_tokens")}
        return {"id": self.id, "model": self.model, "usage": usage, "choices": choices}


def counted_usage(attributes: Mapping[str, Any]) -> dict[str, int]:
    """`gen_ai.usage.*` from OpenInference's token counts in `attributes`, where no usage was reported
    (a stream that did not ask for it, whose token ids were counted instead)."""
    counted = {}
    for name, counted_name in (
        (schema.GEN_AI_USAGE_INPUT_TOKENS, schema.LLM_TOKEN_COUNT_PROMPT),
        (schema.GEN_AI_USAGE_OUTPUT_TOKENS, schema.LLM_TOKEN_COUNT_COMPLETION),
    ):
        if name not in attributes and isinstance(attributes.get(counted_name), int):
            counted[name] = attributes[counted_name]
    return counted


def error_attributes(exc_or_type: Any) -> dict[str, str]:
    """`error.type` of a failed operation: an exception's class name, or a given low-cardinality code."""
    kind = exc_or_type if isinstance(exc_or_type, str) else type(exc_or_type).__qualname__
    return {schema.ERROR_TYPE: kind}


def tool_attributes(
    name: str, description: str | None, arguments: Any, shape: str, hide_inputs: bool
) -> dict[str, Any]:
    """An `execute_tool` span's start attributes (arguments only in the latest shape, and not hidden)."""
    attributes: dict[str, Any] = {
        schema.GEN_AI_OPERATION_NAME: schema.GEN_AI_OP_EXECUTE_TOOL,
        schema.GEN_AI_TOOL_NAME: name,
        schema.GEN_AI_TOOL_TYPE: schema.GEN_AI_TOOL_TYPE_FUNCTION,
    }
    if description:
        attributes[schema.GEN_AI_TOOL_DESCRIPTION] = description
    if shape == schema.GEN_AI_SHAPE_LATEST and not hide_inputs:
        attributes[schema.GEN_AI_TOOL_CALL_ARGUMENTS] = _dumps(arguments)
    return attributes


def tool_result_attributes(result: Any, shape: str, hide_outputs: bool) -> dict[str, Any]:
    if shape == schema.GEN_AI_SHAPE_LATEST and not hide_outputs:
        return {schema.GEN_AI_TOOL_CALL_RESULT: _dumps(result)}
    return {}


def agent_attributes(name: str, shape: str, conversation_id: str | None = None) -> dict[str, Any]:
    """An `invoke_agent` span's attributes: our rollouts and agents run no one provider's agent."""
    attributes: dict[str, Any] = {
        schema.GEN_AI_OPERATION_NAME: schema.GEN_AI_OP_INVOKE_AGENT,
        _provider_key(shape): schema.GEN_AI_PROVIDER_OTHER,
        schema.GEN_AI_AGENT_NAME: name,
    }
    if conversation_id is not None:
        attributes[schema.GEN_AI_CONVERSATION_ID] = conversation_id
    return attributes


def agent_span_name(name: str) -> str:
    return f"{schema.GEN_AI_OP_INVOKE_AGENT} {name}" if name else schema.GEN_AI_OP_INVOKE_AGENT


def tool_span_name(name: str) -> str:
    return f"{schema.GEN_AI_OP_EXECUTE_TOOL} {name}"
