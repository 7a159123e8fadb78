"""The OpenAI Responses API served from chat completions: a Responses request becomes a chat request,
and the chat reply becomes a Responses `response` object (its stream: responses_stream.py).

Why: vLLM's own /v1/responses cannot return exact token ids and logprobs for tool-call turns, while
its chat completions return both, for exactly the tokens it ran. Serving a Responses call from chat
completions makes it trainable wherever a chat call is (the gateway, instrument()).

Stateless only: the conversation must come in the request (`input`). `previous_response_id`,
`conversation`, `background` and stored `prompt` templates are refused with a ResponsesRequestError
that says what to send instead; `store` is accepted and nothing is stored. Standard library only:
this runs in agents.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

# Responses request fields with no chat counterpart that change nothing the model sees.
_DROPPED = frozenset(
    {
        "store",
        "metadata",
        "include",
        "truncation",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "reasoning",
        "stream_options",
        "max_tool_calls",
        "context_management",
        "client_metadata",  # Codex CLI's session ids
    }
)
# Fields translated below (anything else unknown to Responses goes to the chat request as is:
# vLLM's own sampling fields, `seed`, `chat_template_kwargs`, ...).
_TRANSLATED = frozenset(
    {
        "model",
        "instructions",
        "input",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "text",
        "stream",
        "user",
        "top_logprobs",
        "previous_response_id",
        "conversation",
        "background",
        "prompt",
    }
)
_STATEFUL_ADVICE = (
    "this server answers the Responses API from chat completions and keeps no state: send the whole "
    "conversation in `input` (earlier output items and function_call_output items) and leave this field unset"
)
OUTPUT_LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for output logprobs


class ResponsesRequestError(ValueError):
    """A Responses request that cannot be served from chat completions; `body()` is the API's error shape."""

    def __init__(self, message: str, param: str | None = None, code: str = "unsupported_parameter") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, "invalid_request_error", self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    """The Responses API's error shape (as OpenAI's): {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- request ------------------------------------------------------------------------------------------
def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request that answers the Responses request `body`."""
    if not isinstance(body, dict):
        raise ResponsesRequestError("the request body must be a JSON object", None, "invalid_request")
    for name in ("previous_response_id", "conversation", "prompt"):
        if body.get(name) is not None:
            raise ResponsesRequestError(f"`{name}` is not supported: {_STATEFUL_ADVICE}", name)
    if body.get("background"):
        raise ResponsesRequestError("`background: true` is not supported: " + _STATEFUL_ADVICE, "background")
    if not isinstance(body.get("model"), str):
        raise ResponsesRequestError("`model` (a string) is required", "model", "missing_required_parameter")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages(body.get("instructions"), body.get("input"))}
    if body.get("tools"):
        chat["tools"] = [_tool(tool, i) for i, tool in enumerate(_list(body["tools"], "tools"))]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    for ours, theirs in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("user", "user"),
    ):
        if body.get(ours) is not None:
            chat[theirs] = body[ours]
    response_format = _response_format((body.get("text") or {}).get("format"))
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("top_logprobs") or OUTPUT_LOGPROBS in (body.get("include") or ()):
        chat["logprobs"] = True
        chat["top_logprobs"] = int(body.get("top_logprobs") or 0)
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the usage of response.completed
    for key, value in body.items():
        if key not in _TRANSLATED and key not in _DROPPED and key not in chat:
            chat[key] = value
    return chat


def messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """Chat messages for `instructions` and `input`: a model turn split into a message item and
    function_call items becomes one assistant message again (as the model produced it), so the
    chat template renders earlier turns as the tokens the model ran."""
    chat: list[dict[str, Any]] = []
    if instructions:
        if not isinstance(instructions, str):
            raise ResponsesRequestError("`instructions` must be a string", "instructions", "invalid_type")
        chat.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        chat.append({"role": "user", "content": items})
        return chat
    assistant: dict[str, Any] | None = None  # the open model turn that function calls join
    for index, item in enumerate(_list(items, "input")):
        param = f"input[{index}]"
        if not isinstance(item, dict):
            raise ResponsesRequestError(f"`{param}` must be an object", param, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ResponsesRequestError(f"`{param}.role` {role!r} is not a message role", param, "invalid_value")
            message = {"role": "system" if role == "developer" else role, "content": _content(item, param)}
            chat.append(message)
            assistant = message if role == "assistant" else None
        elif kind == "function_call":
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
                chat.append(assistant)
            call: dict[str, Any] = {"id": _text(item, "call_id", param), "type": "function"}
            call["function"] = {"name": _text(item, "name", param), "arguments": _text(item, "arguments", param)}
            assistant.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _joined_text(output, param + ".output")
            chat.append({"role": "tool", "tool_call_id": _text(item, "call_id", param), "content": output})
            assistant = None
        elif kind == "item_reference":
            raise ResponsesRequestError(f"`{param}` is an item_reference: {_STATEFUL_ADVICE}", param)
        else:
            raise ResponsesRequestError(
                f"`{param}` of type {kind!r} is not supported here: input items can be messages, "
                "function_call and function_call_output",
                param,
            )
    return chat


def _list(value: Any, param: str) -> list:
    if not isinstance(value, list):
        raise ResponsesRequestError(f"`{param}` must be a list", param, "invalid_type")
    return value


def _text(item: dict, key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ResponsesRequestError(f"`{param}.{key}` (a string) is required", f"{param}.{key}", "invalid_type")
    return value


def _content(item: dict, param: str) -> Any:
    """A message's content for chat: a string stays one; a single text part becomes its string (as
    chat clients send it); images become image_url parts."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(_list(content, param + ".content")):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": _text(part, "text", f"{param}.content[{index}]")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _text(part, "refusal", f"{param}.content[{index}]")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise ResponsesRequestError(
                f"`{param}.content[{index}]` of type {kind!r} is not supported here "
                "(input_text, output_text, refusal and input_image with an image_url are)",
                f"{param}.content[{index}]",
            )
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _joined_text(parts: Any, param: str) -> str:
    texts = []
    for index, part in enumerate(_list(parts, param)):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            raise ResponsesRequestError(f"`{param}[{index}]` must be a text part", f"{param}[{index}]")
        texts.append(_text(part, "text", f"{param}[{index}]"))
    return "".join(texts)


def _tool(tool: Any, index: int) -> dict[str, Any]:
    param = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise ResponsesRequestError(f"`{param}` of type {kind!r} is not supported here: only function tools are", param)
    function = {"name": _text(tool, "name", param)}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ResponsesRequestError(
        f"`tool_choice` {choice!r} is not supported here: use auto, none, required or a function", "tool_choice"
    )


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise ResponsesRequestError(f"`text.format` {fmt!r} is not supported here", "text.format")


# -- reply --------------------------------------------------------------------------------------------
def response_object(chat: dict[str, Any], request: dict[str, Any], response_id: str | None = None) -> dict[str, Any]:
    """The Responses `response` object for the chat-completions reply `chat` to `request`."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] or {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    text = message.get("content")
    if text:
        logprobs = output_logprobs((choice.get("logprobs") or {}).get("content")) if wants_logprobs(request) else None
        output.append(message_item(new_id("msg"), text, "completed", logprobs))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        output.append(
            function_call_item(
                new_id("fc"), call.get("id") or new_id("call"), function.get("name", ""), function.get("arguments", "")
            )
        )
    return response_shell(
        request,
        response_id or new_id("resp"),
        chat.get("created") or time.time(),
        chat.get("model") or request.get("model"),
        finish_reason=choice.get("finish_reason"),
        output=output,
        usage=usage(chat.get("usage")),
    )


def response_shell(
    request: dict[str, Any],
    response_id: str,
    created: float,
    model: Any,
    finish_reason: Any = None,
    output: list | None = None,
    usage: dict | None = None,
    in_progress: bool = False,
) -> dict[str, Any]:
    """A `response` object echoing the request's settings, as the API returns them."""
    status, incomplete = "completed", None
    if in_progress:
        status = "in_progress"
    elif finish_reason in ("length", "content_filter"):
        status = "incomplete"
        incomplete = {"reason": "max_output_tokens" if finish_reason == "length" else "content_filter"}
    asked = request.get("text")
    text: dict[str, Any] = asked if isinstance(asked, dict) else {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": status,
        "incomplete_details": incomplete,
        "error": None,
        "instructions": request.get("instructions"),
        "output": output or [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "max_output_tokens": request.get("max_output_tokens"),
        "previous_response_id": None,
        "text": {**text, "format": text.get("format") or {"type": "text"}},
        "metadata": request.get("metadata") or {},
        "store": False,  # nothing is stored (module docstring)
        "usage": usage,
    }


def message_item(item_id: str, text: str, status: str, logprobs: list | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": [part]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def usage(chat_usage: Any) -> dict[str, Any] | None:
    if not isinstance(chat_usage, dict):
        return None
    prompt, completion = int(chat_usage.get("prompt_tokens") or 0), int(chat_usage.get("completion_tokens") or 0)
    cached = ((chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(chat_usage.get("total_tokens") or prompt + completion),
    }


def wants_logprobs(request: dict[str, Any]) -> bool:
    return bool(request.get("top_logprobs")) or OUTPUT_LOGPROBS in (request.get("include") or ())


def output_logprobs(content: Any) -> list[dict[str, Any]]:
    """Chat's per-token logprobs in the Responses shape (token, logprob, bytes, top_logprobs)."""
    entries = []
    for entry in content or ():
        top = [
            {"token": t.get("token", ""), "logprob": t.get("logprob", 0.0), "bytes": t.get("bytes") or []}
            for t in entry.get("top_logprobs") or ()
        ]
        entries.append(
            {
                "token": entry.get("token", ""),
                "logprob": entry.get("logprob", 0.0),
                "bytes": entry.get("bytes") or [],
                "top_logprobs": top,
            }
        )
    return entries
