"""What `instrument()` was asked for, readable by every integration (and by @tool)."""

from __future__ import annotations

from dataclasses import dataclass

CAPTURE_MODES = ("auto", "always", "off")
OPENAI_SPAN_MODES = ("openinference", "lean")


@dataclass(frozen=True)
class Options:
    capture_tokens: str = "auto"  # ask vLLM for token ids: servers that say they are vLLM / all / none
    hide_inputs: bool = False  # prompts, messages and tool arguments (token ids are kept)
    hide_outputs: bool = False  # completions and tool results (token ids and logprobs are kept)
    openai_spans: str = "lean"  # OpenAI SDK completions: our lean span, or OpenInference's

    def trace_config(self):  # noqa: ANN201 - openinference TraceConfig
        from openinference.instrumentation import TraceConfig

        return TraceConfig(hide_inputs=self.hide_inputs, hide_outputs=self.hide_outputs)


current = Options()
