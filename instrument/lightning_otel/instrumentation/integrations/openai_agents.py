"""OpenAI Agents SDK: OpenInference's processor turns agent, handoff, tool and generation
spans into OpenTelemetry spans, and replaces the SDK's default exporter (which would upload traces
to OpenAI). Model calls through the OpenAI SDK get token capture from that integration."""

from __future__ import annotations

from typing import Any

from lightning_otel.instrumentation.integrations._installed import installed
from lightning_otel.instrumentation.options import Options

NAME = "openai-agents"
TRIGGER = "agents"  # turned on when this module is imported (now, if it already is)


def available() -> bool:
    return installed("agents", "openinference.instrumentation.openai_agents")


def enable(tracer_provider: Any, options: Options) -> None:
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    instrumentor = OpenAIAgentsInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(
            tracer_provider=tracer_provider, config=options.trace_config(), exclusive_processor=True
        )
