"""What `instrument()` was asked for, readable by every integration (and by @tool)."""

from __future__ import annotations

from dataclasses import dataclass

CAPTURE_MODES = ("auto", "always", "off")
OPENAI_SPAN_MODES = ("openinference", "lean")
MIN_ATTRIBUTE_LENGTH = 256  # the smallest attribute cap instrument() takes: ids must stay whole


@dataclass(frozen=True)
class Options:
    capture_tokens: str = "auto"  # ask vLLM for token ids: servers that say they are vLLM / all / none
    hide_inputs: bool = False  # prompts, messages and tool arguments (token ids are kept)
    hide_outputs: bool = False  # completions and tool results (token ids and logprobs are kept)
    openai_spans: str = "lean"  # OpenAI SDK completions: our lean span, or OpenInference's
    max_attribute_length: int | None = None  # the cap on string attributes, if any

    def check_id(self, what: str, value: str) -> str:
        """An id that goes on spans as an attribute, refused if the attribute cap would cut it."""
        if self.max_attribute_length is not None and len(value) > self.max_attribute_length:
            raise ValueError(f"{what} is {len(value)} characters, over max_attribute_length={self.max_attribute_length}: "
                             "it would be cut on the spans")  # fmt: skip
        return value

    def trace_config(self):  # noqa: ANN201 - openinference TraceConfig
        from openinference.instrumentation import TraceConfig

        return TraceConfig(hide_inputs=self.hide_inputs, hide_outputs=self.hide_outputs)


current = Options()
