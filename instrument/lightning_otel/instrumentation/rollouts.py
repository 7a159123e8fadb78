"""Rollouts, rewards, tool steps and sub-agents: the agent-facing marks training needs.

A rollout is one run of the agent on one task. `rollout(task_id=...)` opens its root span and
puts its identity in the OpenTelemetry context; `LightningSpanProcessor` copies that identity
onto every span started inside (LLM calls, tools, sub-agents), so the collector can group spans
by rollout with a plain column filter. Rewards are EVALUATOR spans of their own, which is what
lets a reward arrive after its rollout ended (the rollout span is immutable once exported).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor

from lightning_otel.core import gen_ai, schema
from lightning_otel.instrumentation import sdk_fallbacks
from lightning_otel.instrumentation.options import STATE

_TRACER_NAME = "lightning_otel"
_ROLLOUT_KEY = context_api.create_key("lightning_otel.rollout")
_MAX_IO_CHARS = 4096  # tool input/output kept on the span, for people reading traces


@dataclass(frozen=True)
class Rollout:
    """Identity of the rollout in progress; yielded by `rollout()`."""

    rollout_id: str
    task_id: str
    attempt: int = 0
    split: str = schema.SPLIT_TRAIN

    def attributes(self) -> dict[str, Any]:
        return dict(self._attributes)

    @functools.cached_property
    def _attributes(self) -> dict[str, Any]:  # stamped on every span of the rollout: built once
        identity = {schema.ROLLOUT_ID: self.rollout_id, schema.TASK_ID: self.task_id, schema.ATTEMPT: self.attempt}
        if self.split != schema.SPLIT_TRAIN:  # absent means train: no bytes on every training span
            identity[schema.ROLLOUT_SPLIT] = self.split
        return identity

    def reward(self, value: float, name: str = schema.DEFAULT_REWARD_NAME) -> None:
        reward(value, name=name, rollout_id=self.rollout_id, task_id=self.task_id)


def current_rollout() -> Rollout | None:
    """The rollout whose context we are in, or None."""
    return cast("Rollout | None", context_api.get_value(_ROLLOUT_KEY))  # only rollout() sets the key


def _tracer() -> trace.Tracer:
    return trace.get_tracer(_TRACER_NAME)


class LightningSpanProcessor(SpanProcessor):
    """Stamps the rollout identity on every span started inside a rollout."""

    def on_start(self, span, parent_context=None) -> None:
        current = cast("Rollout | None", context_api.get_value(_ROLLOUT_KEY, parent_context))
        if current is not None:
            span.set_attributes(current._attributes)  # set_attributes copies


@contextmanager
def rollout(
    task_id: str,
    rollout_id: str | None = None,
    attempt: int = 0,
    name: str = schema.SPAN_ROLLOUT,
    attributes: dict[str, Any] | None = None,
    split: str = schema.SPLIT_TRAIN,
) -> Iterator[Rollout]:
    """Open a rollout's root span. `task_id` is the GRPO group key: rollouts of the same task
    are compared with each other. `split="eval"` marks an evaluation rollout: recorded and
    rewarded like any other, never trained on. Exceptions are recorded on the span and re-raised."""
    if not task_id:
        raise ValueError("rollout() needs a non-empty task_id (the GRPO group key)")
    if split not in schema.SPLITS:
        raise ValueError(f"rollout(split=...) must be one of {', '.join(map(repr, schema.SPLITS))}, not {split!r}")
    chosen = STATE.options
    current = Rollout(
        rollout_id=chosen.check_id("rollout_id", rollout_id or uuid.uuid4().hex),
        task_id=chosen.check_id("task_id", str(task_id)),
        attempt=int(attempt),
        split=split,
    )
    span_attributes = {
        schema.OPENINFERENCE_SPAN_KIND: schema.KIND_AGENT,
        schema.ROLLOUT_ROOT: True,
        **current.attributes(),
        **(attributes or {}),
    }
    span_name = name
    if chosen.gen_ai is not None:  # an agent's run on a task: invoke_agent, the rollout its conversation
        span_attributes = {**gen_ai.agent_attributes(name, chosen.gen_ai, current.rollout_id), **span_attributes}
        span_name = gen_ai.agent_span_name(name)
    with (
        _tracer().start_as_current_span(span_name, attributes=span_attributes) as span,
        _error_type(span, chosen.gen_ai),
    ):
        token = context_api.attach(context_api.set_value(_ROLLOUT_KEY, current))
        try:
            yield current
        finally:
            context_api.detach(token)
            if STATE.dropped_spans is not None:  # so the store can show what the agent lost
                span.set_attribute(schema.SDK_DROPPED_SPANS, STATE.dropped_spans())
            if sdk_fallbacks.count():  # private SDK internals gone: capture runs on slower public paths
                span.set_attribute(schema.SDK_FALLBACKS, sdk_fallbacks.count())


def reward(
    value: float,
    name: str = schema.DEFAULT_REWARD_NAME,
    rollout_id: str | None = None,
    task_id: str | None = None,
) -> None:
    """Record a reward for the current rollout, or for `rollout_id` (also after it ended).

    A non-finite value raises ValueError here, at its source, rather than poisoning training."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"reward {name!r} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"reward {name!r} must be finite, got {number}")
    current = current_rollout()
    if rollout_id is None:
        if current is None:
            raise RuntimeError("reward() outside a rollout: pass rollout_id= or call it inside `with rollout(...)`")
        rollout_id = current.rollout_id
    STATE.options.check_id("rollout_id", rollout_id)
    attributes: dict[str, Any] = {
        schema.OPENINFERENCE_SPAN_KIND: schema.KIND_EVALUATOR,
        schema.ROLLOUT_ID: rollout_id,
        schema.REWARD_NAME: name,
        schema.REWARD_VALUE: number,
    }
    if task_id is None and current is not None and current.rollout_id == rollout_id:
        task_id = current.task_id
    if task_id is not None:
        attributes[schema.TASK_ID] = STATE.options.check_id("task_id", task_id)
    # Inside its own rollout the reward span joins the rollout's trace; a late reward for another
    # rollout starts a trace of its own and is tied to the rollout by its id alone.
    parent = None if current is not None and current.rollout_id == rollout_id else context_api.Context()
    _tracer().start_span(schema.SPAN_REWARD, context=parent, attributes=attributes).end()


@contextmanager
def agent(name: str, attributes: dict[str, Any] | None = None) -> Iterator[trace.Span]:
    """A sub-agent step: an AGENT span; LLM calls and tools inside nest under it."""
    span_attributes = {schema.OPENINFERENCE_SPAN_KIND: schema.KIND_AGENT, schema.AGENT_NAME: name, **(attributes or {})}
    shape, span_name = STATE.options.gen_ai, name
    if shape is not None:
        span_attributes = {**gen_ai.agent_attributes(name, shape), **span_attributes}
        span_name = gen_ai.agent_span_name(name)
    with _tracer().start_as_current_span(span_name, attributes=span_attributes) as span, _error_type(span, shape):
        yield span


@contextmanager
def _error_type(span: trace.Span, shape: str | None) -> Iterator[None]:
    """With GenAI conventions on, a failed step's span gets `error.type` (its status and exception
    event are the SDK's)."""
    try:
        yield
    except BaseException as exc:
        if shape is not None and not isinstance(exc, GeneratorExit):
            span.set_attributes(gen_ai.error_attributes(exc))
        raise


def _preview(value: Any, hidden: bool) -> str:
    if hidden:
        return schema.REDACTED
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text[:_MAX_IO_CHARS]


def tool(func: Callable | None = None, *, name: str | None = None) -> Callable:
    """Decorator marking a tool step (sync or async): a TOOL span with the tool's name, its
    arguments and its result. Use as `@tool` or `@tool(name="search")`."""

    def decorate(fn: Callable) -> Callable:
        tool_name = name or fn.__name__
        signature = inspect.signature(fn)

        description = (inspect.getdoc(fn) or "").strip().split("\n", 1)[0]

        @contextmanager
        def start(args: tuple, kwargs: dict) -> Iterator[Callable[[Any], None]]:
            """The tool's span, current while it runs; yields what records its result."""
            options = STATE.options
            arguments = dict(signature.bind_partial(*args, **kwargs).arguments)
            attributes = {
                schema.OPENINFERENCE_SPAN_KIND: schema.KIND_TOOL,
                schema.TOOL_NAME: tool_name,
                schema.INPUT_VALUE: _preview(arguments, options.hide_inputs),
            }
            span_name, shape = tool_name, options.gen_ai
            if shape is not None:
                attributes.update(gen_ai.tool_attributes(tool_name, description, arguments, shape, options.hide_inputs))
                span_name = gen_ai.tool_span_name(tool_name)

            with _tracer().start_as_current_span(span_name, attributes=attributes) as span, _error_type(span, shape):

                def record(result: Any) -> None:
                    span.set_attribute(schema.OUTPUT_VALUE, _preview(result, options.hide_outputs))
                    if shape is not None:
                        span.set_attributes(gen_ai.tool_result_attributes(result, shape, options.hide_outputs))

                yield record

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args, **kwargs):
                with start(args, kwargs) as record:
                    result = await fn(*args, **kwargs)
                    record(result)
                    return result

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with start(args, kwargs) as record:
                result = fn(*args, **kwargs)
                record(result)
                return result

        return wrapper

    return decorate(func) if func is not None else decorate
