"""Agents whose spans follow OpenTelemetry's GenAI conventions, from instrumentations no one here
wrote, run in a subprocess of the test (they patch the OpenAI SDK for the whole process).

    python tests/genai_agent.py CONFIG_JSON

CONFIG: {"mode": "openai-v2" | "pydantic-ai", "base_url", "model", "endpoint" (OTLP/HTTP traces),
"rollouts": [{"rollout_id", "task_id", "reward"}], "lightning": bool}.
- lightning false: the process exports with a plain OpenTelemetry SDK, as a team that does not use
  lightning_otel would; rollout identity comes from a span processor of its own that stamps
  lightning.rollout.id / lightning.task.id on every span, and the reward is one EVALUATOR span.
- lightning true: lightning_otel.instrument() and lightning_otel.rollout() / reward() instead (its
  own OpenAI integration then records each call too, with token ids).
The shape of openai-v2's spans follows OTEL_SEMCONV_STABILITY_OPT_IN from the environment.
Prints one JSON line: what the agent saw (per rollout: model replies, tool calls).
"""

from __future__ import annotations

import asyncio
import json
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from lightning_otel.core import schema


class StampRollout(SpanProcessor):
    """Puts the current rollout's identity on every span started while it is set."""

    current: dict = {}

    def on_start(self, span, parent_context=None) -> None:
        for key, value in self.current.items():
            span.set_attribute(key, value)


def setup(config: dict):
    if config["lightning"]:
        import lightning_otel

        lightning_otel.instrument(endpoint=config["endpoint"], service_name="genai-agent")
        return trace.get_tracer_provider()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({schema.SERVICE_NAME: "genai-agent"}))
    provider.add_span_processor(StampRollout())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config["endpoint"])))
    trace.set_tracer_provider(provider)
    return provider


def in_rollout(config: dict, spec: dict, run):
    """run() inside the rollout `spec`, then its reward."""
    if config["lightning"]:
        import lightning_otel

        with lightning_otel.rollout(task_id=spec["task_id"], rollout_id=spec["rollout_id"]):
            result = run()
            lightning_otel.reward(spec["reward"])
        return result
    StampRollout.current = {schema.ROLLOUT_ID: spec["rollout_id"], schema.TASK_ID: spec["task_id"]}
    tracer = trace.get_tracer("genai-agent")
    with tracer.start_as_current_span("agent run"):
        result = run()
    reward = {
        schema.OPENINFERENCE_SPAN_KIND: schema.KIND_EVALUATOR,
        schema.REWARD_NAME: schema.DEFAULT_REWARD_NAME,
        schema.REWARD_VALUE: float(spec["reward"]),
    }
    tracer.start_span(schema.SPAN_REWARD, attributes=reward).end()
    StampRollout.current = {}
    return result


ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def openai_v2(config: dict) -> list:
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=trace.get_tracer_provider())
    client = openai.OpenAI(base_url=config["base_url"], api_key="x")
    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"}]

    def run() -> dict:
        # a forced tool call (the reply is a tool_call part), then a plain answer after the tool's result
        first = client.chat.completions.create(
            model=config["model"],
            messages=messages,
            tools=[ADD_TOOL],
            tool_choice={"type": "function", "function": {"name": "add"}},
            max_tokens=32,
        )
        call = first.choices[0].message.tool_calls[0]
        follow_up = [
            *messages,
            {"role": "assistant", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        second = client.chat.completions.create(model=config["model"], messages=follow_up, max_tokens=8)
        return {
            "tool_call": {"name": call.function.name, "arguments": call.function.arguments},
            "answer": second.choices[0].message.content,
            "answer_finish_reason": second.choices[0].finish_reason,
            "usage": [first.usage.model_dump(), second.usage.model_dump()],
        }

    return [in_rollout(config, spec, run) for spec in config["rollouts"]]


def pydantic_ai(config: dict) -> list:
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability, Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Answer(BaseModel):
        value: int

    class AddFirst(AbstractCapability):
        """The tiny model cannot choose well: force the `add` tool at the first step, the answer after."""

        def get_model_settings(self):
            return lambda ctx: {"tool_choice": ["add"] if ctx.run_step <= 1 else ["final_result"], "max_tokens": 48}

    model = OpenAIChatModel(config["model"], provider=OpenAIProvider(base_url=config["base_url"], api_key="x"))
    settings = InstrumentationSettings(tracer_provider=trace.get_tracer_provider(), include_content=True)
    agent = Agent(
        model, output_type=Answer, capabilities=[Instrumentation(settings=settings), AddFirst()], name="adder"
    )
    seen: list[dict] = []

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        seen.append({"a": a, "b": b})
        return a + b

    def run() -> dict:
        seen.clear()
        result = asyncio.run(agent.run("What is 2 + 3? Use the add tool."))
        return {"tool_calls": list(seen), "answer": result.output.value}

    return [in_rollout(config, spec, run) for spec in config["rollouts"]]


def main() -> None:
    config = json.loads(sys.argv[1])
    provider = setup(config)
    runs = {"openai-v2": openai_v2, "pydantic-ai": pydantic_ai}[config["mode"]](config)
    provider.force_flush()
    print(json.dumps(runs))
    provider.shutdown()


if __name__ == "__main__":
    main()
