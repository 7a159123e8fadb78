"""What `instrument()` decided for this process, in one state object every module reads (`STATE`):
the options (integrations and `@tool` read them), the `Instrumentation` it returned, and the
dropped-span counter `rollout()` reports. `instrument()` is the only writer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

CaptureMode = Literal["auto", "always", "off"]
OpenAISpans = Literal["lean", "openinference"]
TokenEncoding = Literal["auto", "bytes", "base64"]
CAPTURE_MODES: tuple[str, ...] = get_args(CaptureMode)
OPENAI_SPAN_MODES: tuple[str, ...] = get_args(OpenAISpans)
MIN_ATTRIBUTE_LENGTH = 256  # the smallest attribute cap instrument() takes: ids must stay whole


@dataclass(frozen=True)
class Options:
    capture_tokens: CaptureMode = "auto"  # ask vLLM for token ids: servers that say they are vLLM / all / none
    hide_inputs: bool = False  # prompts, messages and tool arguments (token ids are kept)
    hide_outputs: bool = False  # completions and tool results (token ids and logprobs are kept)
    openai_spans: OpenAISpans = "lean"  # OpenAI SDK completions: our lean span, or OpenInference's
    max_attribute_length: int | None = None  # the cap on string attributes, if any
    gen_ai: str | None = None  # the GenAI-convention shape also written ("v1.36", "latest"), or None

    def check_id(self, what: str, value: str) -> str:
        """An id that goes on spans as an attribute, refused if the attribute cap would cut it."""
        cap = self.max_attribute_length
        if cap is not None and len(value) > cap:
            raise ValueError(
                f"{what} is {len(value)} characters, over max_attribute_length={cap}: it would be cut on the spans"
            )
        return value

    def trace_config(self):
        from openinference.instrumentation import TraceConfig

        return TraceConfig(hide_inputs=self.hide_inputs, hide_outputs=self.hide_outputs)


@dataclass
class AgentState:
    options: Options = field(default_factory=Options)
    instrumentation: Any = None  # the Instrumentation instrument() returned, once it ran
    dropped_spans: Callable[[], int] | None = None  # spans dropped at a full export queue so far
    lock: threading.Lock = field(default_factory=threading.Lock)


STATE = AgentState()
