"""LangChain: OpenInference's LangChain instrumentor (chains, agents, tools, chat models).

Token capture needs nothing here: LangChain's OpenAI chat models call the OpenAI SDK, whose
integration records token ids on the inner LLM span; the collector's `llm_spans` view marks the
LangChain LLM span around it as a wrapper (`is_wrapper`), so each model call counts once in `llm_calls`.
"""

from __future__ import annotations

from typing import Any

from lightning_otel.instrumentation.integrations._installed import installed
from lightning_otel.instrumentation.options import Options

NAME = "langchain"
TRIGGER = "langchain_core"  # turned on when this module is imported (now, if it already is)


def available() -> bool:
    return installed("langchain_core", "openinference.instrumentation.langchain")


def enable(tracer_provider: Any, options: Options) -> None:
    from openinference.instrumentation.langchain import LangChainInstrumentor

    instrumentor = LangChainInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=tracer_provider, config=options.trace_config())
