"""The span schema is one module, agrees with OpenInference, and is fully documented."""

from __future__ import annotations

import re

from openinference.semconv.trace import (
    MessageAttributes,
    MessageContentAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolCallAttributes,
)
from repo_paths import REPO

from lightning_otel.core import schema

ROOT = REPO


def test_openinference_names_match_the_semantic_conventions_package():
    semconv = {}
    for names in (SpanAttributes, MessageAttributes, MessageContentAttributes, ToolCallAttributes):
        semconv.update({k: v for k, v in vars(names).items() if k.isupper()})
    semconv["TOOL_CALL_FUNCTION_ARGUMENTS"] = ToolCallAttributes.TOOL_CALL_FUNCTION_ARGUMENTS_JSON
    for name in (
        "OPENINFERENCE_SPAN_KIND",
        "LLM_MODEL_NAME",
        "LLM_PROVIDER",
        "LLM_SYSTEM",
        "LLM_INVOCATION_PARAMETERS",
        "LLM_TOKEN_COUNT_PROMPT",
        "LLM_TOKEN_COUNT_COMPLETION",
        "LLM_TOKEN_COUNT_TOTAL",
        "TOOL_NAME",
        "TOOL_PARAMETERS",
        "INPUT_VALUE",
        "INPUT_MIME_TYPE",
        "OUTPUT_VALUE",
        "OUTPUT_MIME_TYPE",
        "SESSION_ID",
        "AGENT_NAME",
        "LLM_INPUT_MESSAGES",
        "LLM_OUTPUT_MESSAGES",
        "MESSAGE_ROLE",
        "MESSAGE_CONTENT",
        "MESSAGE_NAME",
        "MESSAGE_TOOL_CALL_ID",
        "MESSAGE_TOOL_CALLS",
        "TOOL_CALL_ID",
        "TOOL_CALL_FUNCTION_NAME",
        "TOOL_CALL_FUNCTION_ARGUMENTS",
        "MESSAGE_CONTENTS",
        "MESSAGE_CONTENT_TYPE",
        "MESSAGE_CONTENT_TEXT",
    ):
        assert getattr(schema, name) == semconv[name], name
    for kind in ("LLM", "TOOL", "AGENT", "CHAIN", "EVALUATOR"):
        assert getattr(schema, f"KIND_{kind}") == OpenInferenceSpanKindValues[kind].value


def test_every_attribute_we_write_is_documented():
    doc = (ROOT / "docs" / "span-schema.md").read_text()
    for name in schema.LIGHTNING_ATTRIBUTES:
        assert f"`{name}`" in doc, f"{name} missing from docs/span-schema.md"
    documented = set(re.findall(r"`(lightning\.[a-z_.]+)`", doc))
    assert documented <= set(schema.LIGHTNING_ATTRIBUTES), documented - set(schema.LIGHTNING_ATTRIBUTES)


def test_no_module_spells_our_attribute_names_itself():
    """Attribute names live in core/lightning_otel/core/schema.py only; everyone else imports them."""
    offenders = []
    for folder in ("instrument", "collector", "trainer", "dashboards", "lightning_otel"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "schema.py" and path.parent.name == "instrument":
                continue
            for name in schema.LIGHTNING_ATTRIBUTES:
                if f'"{name}"' in path.read_text() or f"'{name}'" in path.read_text():
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []
