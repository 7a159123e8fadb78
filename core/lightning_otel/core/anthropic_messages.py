"""The Anthropic Messages API served from chat completions: a Messages request becomes a chat
completions request, the chat reply becomes an Anthropic Message (anthropic_stream.py: a chat stream
becomes Anthropic's server-sent events).

Why: vLLM's own `/v1/messages` returns no token ids and no logprobs for any request field, while its
chat completions return both exactly (`return_token_ids`, chosen-token logprobs, the prompt ids it
ran). Serving a Messages call from chat completions makes it trainable, and the span recorded is the
chat call's, the same one a chat client gets.

What maps to what (anything else in a request is refused with a clear error, never dropped silently,
except the fields listed in IGNORED_FIELDS, which change nothing a chat completion can do):
  system (string or text blocks)        -> a first `system` message (blocks joined by "\\n")
  a message with role system             -> a `system` message where it stands
  user text blocks                       -> the user message's text (blocks joined by "\\n")
  user tool_result blocks                -> `tool` messages before the user's text, in order; content a
                                            string or text blocks; `is_error` prefixes "Error: "
  assistant text / tool_use blocks       -> the assistant's content and `tool_calls` (input as JSON)
  assistant thinking blocks              -> left out (a chat template has no place for them)
  a final assistant message (a prefill)  -> continued, not closed (vLLM's `continue_final_message`)
  tools [{name, description, input_schema}] -> function tools; tool_choice auto / any (required) /
                                            tool (that function) / none; disable_parallel_tool_use
  max_tokens, stop_sequences (stop), temperature, top_p, top_k, stream

Standard library only: this runs in agents and in the gateway.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from lightning_otel.core.vllm_endpoint import first_choice

# Fields that change nothing a chat completion of this model can do: accepted and left out.
IGNORED_FIELDS = frozenset(
    (
        "metadata",
        "service_tier",
        "cache_control",
        "container",
        "context_management",
        "diagnostics",
        "inference_geo",
        "speed",
        "thinking",
        "mcp_servers",
        "betas",
    )
)
_MAPPED_FIELDS = frozenset(
    (
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "output_config",
    )
)
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


class MessagesRequestError(ValueError):
    """A Messages request that cannot be served from chat completions (the message says why)."""


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """An error in the Anthropic API's shape, which Anthropic clients parse and raise."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def _refuse(message: str) -> MessagesRequestError:
    return MessagesRequestError(message)


def _text_of(blocks: Any, where: str) -> str:
    """The text of a string or a list of text blocks (joined by "\\n"); anything else is refused."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _refuse(f"{where} must be a string or a list of text blocks, not {type(blocks).__name__}")
    texts = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise _refuse(_unsupported(kind, where))
        texts.append(block["text"])
    return "\n".join(texts)


def _unsupported(kind: Any, where: str) -> str:
    if kind in ("image", "document", "search_result"):
        return (
            f"{where}: {kind} blocks are not supported: Messages calls are served from chat completions of a "
            "text model; send text only"
        )
    return f"{where}: a block of type {kind!r} is not supported here"


def _user_messages(content: Any, index: int) -> list[dict[str, Any]]:
    """A user turn: its tool results as `tool` messages (first, in order), then its text, if any."""
    where = f"messages[{index}]"
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise _refuse(f"{where}.content must be a string or a list of blocks")
    tools, texts = [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise _refuse(f"{where}.content[{j}]: a tool_result needs a tool_use_id")
            result = _text_of(block.get("content", ""), f"{where}.content[{j}].content")
            if block.get("is_error"):
                result = "Error: " + result
            tools.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        else:
            raise _refuse(_unsupported(kind, f"{where}.content[{j}]"))
    return tools + ([{"role": "user", "content": "\n".join(texts)}] if texts or not tools else [])


def _assistant_message(content: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _refuse(f"{where}.content must be a string or a list of blocks")
    texts, calls = [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _refuse(f"{where}.content[{j}]: a tool_use needs an id and a name")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # a chat template has no place for them; the model never saw them as tokens here
        else:
            raise _refuse(_unsupported(kind, f"{where}.content[{j}]"))
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _refuse("tools must be a list")
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise _refuse(f"tools[{i}] must be an object with a name")
        if tool.get("type") not in (None, "custom"):
            raise _refuse(
                f"tools[{i}]: Anthropic's server tool {tool['type']!r} is not supported: only client tools "
                "(name, description, input_schema) can be served from chat completions"
            )
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _refuse('tool_choice must be {"type": "auto" | "any" | "tool" | "none"}')
    kind = choice["type"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _refuse('tool_choice {"type": "tool"} needs the tool\'s name')
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def chat_request(body: Any) -> dict[str, Any]:
    """The chat completions request that serves the Messages request `body` (a dict as sent on the
    wire); MessagesRequestError says what cannot be served."""
    if not isinstance(body, dict):
        raise _refuse("request body must be a JSON object")
    unknown = sorted(k for k in body if k not in _MAPPED_FIELDS and k not in IGNORED_FIELDS)
    if unknown:
        raise _refuse(f"fields not supported when served from chat completions: {', '.join(unknown)}")
    if not isinstance(body.get("model"), str):
        raise _refuse("model: a string is required")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _refuse("max_tokens: a positive integer is required")
    if not isinstance(body.get("messages"), list):
        raise _refuse("messages: a list is required")
    output_config = body.get("output_config")
    if output_config is not None and (not isinstance(output_config, dict) or set(output_config) - {"effort"}):
        raise _refuse("output_config: only `effort` (ignored) is supported when served from chat completions")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text_of(body["system"], "system")})
    for i, message in enumerate(body["messages"]):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user":
            messages.extend(_user_messages(message.get("content"), i))
        elif role == "assistant":
            messages.append(_assistant_message(message.get("content"), i))
        elif role == "system":  # Claude Code sends its environment notes as one, after the first user turn
            messages.append({"role": "system", "content": _text_of(message.get("content"), f"messages[{i}].content")})
        else:
            raise _refuse(f"messages[{i}].role must be 'user', 'assistant' or 'system'")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": max_tokens}
    if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        # A prefill: Anthropic continues a final assistant message, where chat completions would
        # close it and open a new turn; vLLM renders it open when asked to continue it.
        chat["continue_final_message"], chat["add_generation_prompt"] = True, False
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    stops = body.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _refuse("stop_sequences must be a list of strings")
        chat["stop"] = list(stops)
    for name in ("temperature", "top_p", "top_k"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _refuse(f"{name} must be a number")
            chat[name] = value
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # Anthropic's last event carries the usage
    return chat


def message_id(chat_id: Any) -> str:
    """An Anthropic message id (msg_...) for a chat completion's id."""
    text = str(chat_id or "") or uuid.uuid4().hex
    return "msg_" + text.removeprefix("chatcmpl-")


def stop_reason(finish_reason: Any, matched: Any, stop_sequences: Any, has_tool_calls: bool) -> tuple[str | None, Any]:
    """(Anthropic stop_reason, stop_sequence) of a chat choice's finish_reason and vLLM's `stop_reason`
    (the stop string matched, when one was)."""
    if has_tool_calls:
        return "tool_use", None
    if finish_reason == "stop" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    if finish_reason is None:
        return None, None
    reason = _STOP_REASONS.get(str(finish_reason), "end_turn")
    return ("end_turn" if reason == "tool_use" else reason), None  # no tool_use block came of it


def tool_input(arguments: Any) -> dict[str, Any] | None:
    """A tool call's arguments as a tool_use block's input: a JSON object, else None."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def message(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic Message for a chat completion `chat` (the JSON vLLM answered) of the Messages
    request `request`. A tool call whose arguments are not a JSON object stays as text (what the model
    wrote), since a tool_use input must be an object."""
    choice = first_choice(chat) or {}
    reply = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if reply.get("content"):
        content.append({"type": "text", "text": reply["content"]})
    used_tool = False
    for call in reply.get("tool_calls") or ():
        function = call.get("function") or {}
        arguments = tool_input(function.get("arguments"))
        if arguments is None:
            content.append({"type": "text", "text": str(function.get("arguments") or "")})
            continue
        used_tool = True
        content.append(
            {"type": "tool_use", "id": call.get("id") or _tool_id(), "name": function.get("name"), "input": arguments}
        )
    reason, sequence = stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), request.get("stop_sequences"), used_tool
    )
    usage = chat.get("usage") or {}
    return {
        "id": message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": chat.get("model") or request.get("model"),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": usage.get("prompt_tokens") or 0,
            "output_tokens": usage.get("completion_tokens") or 0,
        },
    }


def _tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def error_from_chat(status: int, payload: bytes) -> dict[str, Any]:
    """An upstream's (or the gateway's) OpenAI-shaped error body, in Anthropic's shape."""
    try:
        error = json.loads(payload).get("error")
        text = error.get("message") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        text = None
    if not text:
        text = payload.decode("utf-8", "replace")[:2000] or f"upstream answered {status}"
    return error_body(str(text), _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error"))


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
