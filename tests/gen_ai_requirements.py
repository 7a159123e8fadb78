"""What a GenAI-convention span must carry, transcribed from the conventions' own text (not from our
encoder), and the checks that hold a span to it; used by test_gen_ai_output.py and test_gen_ai_gateway.py.
Sources: semantic-conventions tag v1.41.0, docs/gen-ai/gen-ai-spans.md ("Inference", "Execute tool span",
"Capturing instructions, inputs, and outputs"), gen-ai-agent-spans.md ("Invoke agent internal span"),
openai.md ("Spans"), and the message JSON schemas beside them (tests/gen_ai_schemas/); for the default
shape, tag v1.36.0's gen-ai-spans.md ("Inference")."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from lightning_otel.core import schema

SCHEMAS = Path(__file__).resolve().parent / "gen_ai_schemas"
LATEST = {schema.SEMCONV_STABILITY_OPT_IN_ENV: schema.SEMCONV_GEN_AI_LATEST}

# --- the conventions' text, transcribed --------------------------------------------------------------
# gen-ai-spans.md @ v1.41.0, "Inference" (span.gen_ai.inference.client): attribute -> (requirement, type).
# Requirement levels: "required", "conditional" (Conditionally Required, condition in the comment),
# "recommended", "opt-in". Types: the table's "Value Type"; "any" on spans "MAY be recorded as a JSON
# string if structured format is not supported" (notes [16]-[19]) - the Python SDK has no structured
# attributes, so a JSON string.
INFERENCE_LATEST = {
    "gen_ai.operation.name": ("required", "string"),
    "gen_ai.provider.name": ("required", "string"),
    "error.type": ("conditional", "string"),  # if the operation ended in an error
    "gen_ai.conversation.id": ("conditional", "string"),  # when available
    "gen_ai.output.type": ("conditional", "string"),  # when applicable and if the request includes an output format
    "gen_ai.request.choice.count": ("conditional", "int"),  # if available, in the request, and !=1
    "gen_ai.request.model": ("conditional", "string"),  # If available.
    "gen_ai.request.seed": ("conditional", "int"),  # if applicable and if the request includes a seed
    "gen_ai.request.stream": ("conditional", "boolean"),  # [8] If and only if the request is streaming.
    "server.port": ("conditional", "int"),  # If `server.address` is set.
    "gen_ai.request.frequency_penalty": ("recommended", "double"),
    "gen_ai.request.max_tokens": ("recommended", "int"),
    "gen_ai.request.presence_penalty": ("recommended", "double"),
    "gen_ai.request.stop_sequences": ("recommended", "string[]"),
    "gen_ai.request.temperature": ("recommended", "double"),
    "gen_ai.request.top_k": ("recommended", "double"),
    "gen_ai.request.top_p": ("recommended", "double"),
    "gen_ai.response.finish_reasons": ("recommended", "string[]"),
    "gen_ai.response.id": ("recommended", "string"),
    "gen_ai.response.model": ("recommended", "string"),
    "gen_ai.response.time_to_first_chunk": ("recommended", "double"),
    "gen_ai.usage.cache_creation.input_tokens": ("recommended", "int"),
    "gen_ai.usage.cache_read.input_tokens": ("recommended", "int"),
    "gen_ai.usage.input_tokens": ("recommended", "int"),
    "gen_ai.usage.output_tokens": ("recommended", "int"),
    "gen_ai.usage.reasoning.output_tokens": ("recommended", "int"),
    "server.address": ("recommended", "string"),
    "gen_ai.input.messages": ("opt-in", "any"),
    "gen_ai.output.messages": ("opt-in", "any"),
    "gen_ai.system_instructions": ("opt-in", "any"),
    "gen_ai.tool.definitions": ("opt-in", "any"),
}
# gen-ai-spans.md @ v1.36.0, "Inference": `gen_ai.system` (Required) where the latest has
# `gen_ai.provider.name`; no gen_ai.request.stream, time_to_first_chunk, cache or reasoning usage; no
# content attributes on spans (v1.36 records content as events, "Capturing inputs and outputs").
INFERENCE_V1_36 = {
    "gen_ai.operation.name": ("required", "string"),
    "gen_ai.system": ("required", "string"),
    **{
        k: v
        for k, v in INFERENCE_LATEST.items()
        if k not in ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.stream")
        and not k.startswith(("gen_ai.usage.cache", "gen_ai.usage.reasoning", "gen_ai.response.time"))
        and v[0] != "opt-in"
    },
}
# "Span name SHOULD be `{gen_ai.operation.name} {gen_ai.request.model}`"; "Span kind SHOULD be CLIENT ...
# RECOMMENDED ... when the GenAI call happens over instrumented protocol such as HTTP" (both shapes).
INFERENCE_KIND = "CLIENT"
# openai.md @ v1.41.0, "Spans": "`gen_ai.provider.name` MUST be set to `"openai"`"; v1.36.0's
# gen_ai.system well-known value for OpenAI is `openai` too. gen-ai-spans.md, `gen_ai.operation.name`'s
# well-known values: `chat` (OpenAI Chat API), `text_completion` (OpenAI Completions API (Legacy)).
OPENAI = "openai"
# gen-ai-spans.md @ v1.41.0, "Execute tool span" (span.gen_ai.execute_tool.internal): operation name
# SHOULD be `execute_tool`; span name SHOULD be `execute_tool {gen_ai.tool.name}`; kind SHOULD be INTERNAL.
EXECUTE_TOOL = {
    "gen_ai.operation.name": ("required", "string"),
    "gen_ai.tool.name": ("required", "string"),
    "error.type": ("conditional", "string"),  # if the operation ended in an error
    "gen_ai.tool.call.id": ("recommended", "string"),  # if available
    "gen_ai.tool.description": ("recommended", "string"),  # if available
    "gen_ai.tool.type": ("recommended", "string"),  # if available; `function`: executed on the client side
    "gen_ai.tool.call.arguments": ("opt-in", "any"),  # [4] "expected to be an object"
    "gen_ai.tool.call.result": ("opt-in", "any"),  # [5] "(if any and if execution was successful)"
}
# gen-ai-agent-spans.md @ v1.41.0, "Invoke agent internal span" (span.gen_ai.invoke_agent.internal):
# operation name SHOULD be `invoke_agent`; span name `invoke_agent {gen_ai.agent.name}` when the name is
# readily available; kind SHOULD be INTERNAL. (Only the attributes an agent span of ours can have.)
INVOKE_AGENT = {
    "gen_ai.operation.name": ("required", "string"),
    "gen_ai.provider.name": ("required", "string"),
    "error.type": ("conditional", "string"),
    "gen_ai.agent.description": ("conditional", "string"),
    "gen_ai.agent.id": ("conditional", "string"),
    "gen_ai.agent.name": ("conditional", "string"),  # when available
    "gen_ai.conversation.id": ("conditional", "string"),  # when available
}
INVOKE_AGENT_V1_36 = {**INVOKE_AGENT, "gen_ai.system": ("required", "string")}
del INVOKE_AGENT_V1_36["gen_ai.provider.name"]
# Content, gen-ai-spans.md @ v1.41.0 "Capturing instructions, inputs, and outputs": the messages are
# sensitive; we record them only where our own (OpenInference-style) capture records them: never when hidden.
CONTENT = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions")
TOOL_CONTENT = ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result")
# The part types the message schemas define by a `const` type (a part of such a type must match that
# definition, not only the schema's catch-all GenericPart, which accepts any object with a `type`).
TYPED_PARTS = {
    "text": "TextPart",
    "tool_call": "ToolCallRequestPart",
    "tool_call_response": "ToolCallResponsePart",
    "server_tool_call": "ServerToolCallPart",
    "server_tool_call_response": "ServerToolCallResponsePart",
    "blob": "BlobPart",
    "file": "FilePart",
    "uri": "UriPart",
    "reasoning": "ReasoningPart",
}


def _is_type(value, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "double":
        return isinstance(value, float)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string[]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, str) and json.loads(value) is not None  # "any": a JSON string


def check_span(span: dict, table: dict, *, failed: bool = False) -> None:
    """The span's gen_ai.* (and error.*, server.*) attributes are the table's, typed as the table says;
    its required ones are there, and error.type exactly when it failed."""
    ours = {k: v for k, v in span["attributes"].items() if k.startswith(("gen_ai.", "error.", "server."))}
    for name, value in ours.items():
        assert name in table, f"{span['name']}: {name} is not an attribute of this span type"
        assert _is_type(value, table[name][1]), f"{span['name']}: {name}={value!r} is not {table[name][1]}"
    for name, (level, _) in table.items():
        if level == "required":
            assert name in ours, f"{span['name']}: required {name} missing"
    assert ("error.type" in ours) == failed, f"{span['name']}: failed={failed}, span: {span}"
    if "server.address" in ours:
        assert "server.port" in ours  # conditionally required when server.address is set


def schema_validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / f"gen-ai-{name}.json").read_text()))


def validate_messages(text: str, which: str) -> list:
    """A gen_ai.input.messages / gen_ai.output.messages value: JSON valid against the conventions' schema,
    every part of a defined type valid against that type's own definition."""
    messages = json.loads(text)
    validator = schema_validator(f"{which}-messages")
    validator.validate(messages)
    defs = validator.schema["$defs"]
    for message in messages:
        for part in message["parts"]:
            if part["type"] in TYPED_PARTS:
                definition = {**defs[TYPED_PARTS[part["type"]]], "$defs": defs}
                jsonschema.Draft202012Validator(definition).validate(part)
    return messages
