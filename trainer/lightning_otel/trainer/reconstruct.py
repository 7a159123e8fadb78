"""Rebuild token ids for an LLM call that has none (a provider other than vLLM, or a span in
OpenTelemetry's GenAI conventions), from the messages its span recorded, with the model's chat
template. Such a call is marked `reconstructed` and only trained on when the selection allows it: the
ids are a guess at what the model would have seen (the provider's own template and tokenizer may
differ), and there are no behaviour logprobs (NaN; the update uses the current policy's, so its first
ratio is 1).

Messages come from OpenInference's flattened attributes (llm.input_messages.{i}.message.*, text only)
or, failing those, from the GenAI conventions' latest shape: gen_ai.system_instructions,
gen_ai.input.messages and gen_ai.output.messages (JSON parts: text, tool_call, tool_call_response;
any other part type leaves the call unrebuilt), with gen_ai.tool.definitions as the template's tools.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from lightning_otel.core import schema
from lightning_otel.trainer.merge import LLMCall

_OUTPUT = schema.message_attribute(schema.LLM_OUTPUT_MESSAGES, 0, schema.MESSAGE_CONTENT)


def _input(index: int, field: str) -> str:
    return schema.message_attribute(schema.LLM_INPUT_MESSAGES, index, field)


def recorded_messages(attributes: dict) -> list[dict]:
    messages, index = [], 0
    while _input(index, schema.MESSAGE_ROLE) in attributes:
        messages.append(
            {
                "role": attributes[_input(index, schema.MESSAGE_ROLE)],
                "content": attributes.get(_input(index, schema.MESSAGE_CONTENT), ""),
            }
        )
        index += 1
    return messages


def _json(attributes: dict, name: str):
    try:
        return json.loads(attributes[name]) if name in attributes else None
    except (TypeError, ValueError):
        return None


def _tool_call(part: dict) -> dict:
    arguments = part.get("arguments")
    if isinstance(arguments, str):  # some instrumentations record the model's JSON text, others the object
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    function: dict[str, Any] = {"name": part.get("name"), "arguments": arguments if arguments is not None else {}}
    return {"id": part.get("id"), "type": "function", "function": function}


def gen_ai_messages(parts_messages) -> list[dict] | None:
    """GenAI-convention messages (role + parts) as chat-template messages; None if a part is of a type
    a chat template cannot render here (images, files, ...). A tool_call_response part becomes a
    `tool` message, whatever role carried it."""
    if not isinstance(parts_messages, list):
        return None
    messages: list[dict] = []
    for message in parts_messages:
        if not isinstance(message, dict) or not isinstance(message.get("parts"), list):
            return None
        text, calls = [], []
        for part in message["parts"]:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                text.append(str(part.get("content") or ""))
            elif kind == "tool_call":
                calls.append(_tool_call(part))
            elif kind == "tool_call_response":
                result = part.get("response", part.get("result"))
                content = result if isinstance(result, str) else json.dumps(result)
                messages.append({"role": "tool", "content": content, "tool_call_id": part.get("id")})
            else:
                return None
        if text or calls:
            entry: dict = {"role": message.get("role", "user"), "content": "".join(text)}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
    return messages


def _gen_ai_tools(attributes: dict) -> list[dict] | None:
    tools = _json(attributes, schema.GEN_AI_TOOL_DEFINITIONS)
    if not isinstance(tools, list):
        return None
    # the convention's flat {"type", "name", "description", "parameters"} as chat templates expect it
    return [
        tool if "function" in tool else {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        for tool in tools
        if isinstance(tool, dict)
    ] or None


def _rebuild_gen_ai(attributes: dict, tokenizer) -> tuple[list[int], list[int]] | None:
    messages = gen_ai_messages(_json(attributes, schema.GEN_AI_INPUT_MESSAGES))
    output = gen_ai_messages(_json(attributes, schema.GEN_AI_OUTPUT_MESSAGES))
    if not messages or not output or output[0]["role"] != "assistant":
        return None
    instructions = _json(attributes, schema.GEN_AI_SYSTEM_INSTRUCTIONS)
    if instructions is not None:
        system = gen_ai_messages([{"role": "system", "parts": instructions}])
        if system is None:
            return None
        messages = system + messages
    tools = _gen_ai_tools(attributes)
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    answer = output[0]
    if "tool_calls" in answer:
        # the template's own rendering of the call: the whole conversation minus its prompt
        whole = tokenizer.apply_chat_template([*messages, answer], tools=tools, tokenize=False)
        if not whole.startswith(text):
            return None
        return prompt, tokenizer.encode(whole[len(text) :], add_special_tokens=False)
    completion = tokenizer.encode(answer["content"], add_special_tokens=False)
    reasons = _json(attributes, schema.GEN_AI_RESPONSE_FINISH_REASONS)
    reason = reasons[0] if isinstance(reasons, list) and reasons else "stop"
    if tokenizer.eos_token_id is not None and reason == "stop":
        completion.append(tokenizer.eos_token_id)  # a chat model ends its turn with EOS
    return prompt, completion


def reconstruct_call(span_id: str, attributes: dict, tokenizer, policy_version: str | None = None) -> LLMCall | None:
    """The call rebuilt from its recorded messages, or None when they were not recorded (or redacted)."""
    messages = recorded_messages(attributes)
    output = attributes.get(_OUTPUT)
    if messages and output is not None and output != schema.REDACTED:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer.encode(text, add_special_tokens=False)
        completion = tokenizer.encode(output, add_special_tokens=False)
        if tokenizer.eos_token_id is not None and attributes.get(schema.FINISH_REASON, "stop") == "stop":
            completion.append(tokenizer.eos_token_id)  # a chat model ends its turn with EOS
    elif not messages and (rebuilt := _rebuild_gen_ai(attributes, tokenizer)) is not None:
        prompt, completion = rebuilt
    else:
        return None
    return LLMCall(span_id, prompt, completion, np.full(len(completion), np.nan), policy_version, reconstructed=True)
