"""A span that becomes an SDK `ReadableSpan` when it ends, for spans on every model call.

The SDK's own span costs ~50 us from start to end here (attribute validation at every set, a lock
per call, the readable copy made at the end); this one ~15 us. It goes through the same pipeline:
the tracer's sampler decides, its id generator names it, every span processor's `on_start` sees it
(so the rollout identity is stamped as on any span) and `on_end` gets a `ReadableSpan` with the
tracer's resource and scope, its span limits applied. What it leaves out: the SDK's internal
metrics about spans (off unless OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED) and the `_on_ending`
hook. Attribute values set from outside are checked as the SDK checks them; our own (strings,
numbers, bytes, tuples of strings) skip the check.

`start_span(tracer, ...)` falls back to `tracer.start_span(...)` for a tracer that is not the
SDK's (or an SDK laid out differently), so the worst case is the SDK's cost, not a lost span.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import time_ns
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace import Span as SDKSpan
from opentelemetry.sdk.trace import Tracer as SDKTracer
from opentelemetry.sdk.trace.sampling import DEFAULT_ON
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from lightning_otel.instrumentation import sdk_fallbacks

log = logging.getLogger(__name__)
_PLAIN = frozenset((str, int, float, bool, bytes))  # values that need no cleaning


def _plain(values) -> bool:
    """Whether every value needs no cleaning: a _PLAIN one, or a tuple of str (a string[] attribute,
    as the SDK would keep it)."""
    return _PLAIN.issuperset(map(type, values)) or all(
        type(v) in _PLAIN or (type(v) is tuple and all(type(item) is str for item in v)) for v in values
    )


_RANDOM_TRACE_ID = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # W3C trace context level 2 (SDK >= 1.4x)
_UNSET = Status(StatusCode.UNSET)  # immutable: shared by every span until one sets its own
_NEEDED = ("sampler", "id_generator", "span_processor", "resource", "_span_limits", "_instrumentation_scope")


def start_span(tracer: Any, name: str, kind: SpanKind, attributes: dict[str, Any]) -> trace.Span:
    """Start a span under the current context: a DirectSpan for the SDK's tracer (`attributes` is
    taken over, not copied), else whatever the tracer makes."""
    if not _is_sdk_tracer(tracer):
        return tracer.start_span(name, kind=kind, attributes=attributes)
    parent_context = context_api.get_current()
    parent: SpanContext | None = trace.get_current_span(parent_context).get_span_context()
    is_enabled = getattr(tracer, "_is_enabled", None)
    if is_enabled is not None and not is_enabled():
        return NonRecordingSpan(parent if parent is not None else INVALID_SPAN_CONTEXT)
    if tracer.sampler is DEFAULT_ON and parent is not None and parent.is_valid:  # its answer is known without asking:
        trace_id, flags, trace_state, recording = _child_of(parent)  # follow the parent
        extra = None
    else:
        if parent is None or not parent.is_valid:
            parent, trace_id = None, tracer.id_generator.generate_trace_id()
        else:
            trace_id = parent.trace_id
        if tracer.sampler is DEFAULT_ON:  # a root: sampled
            sampled, recording, trace_state, extra = True, True, None, None
        else:
            sampling = tracer.sampler.should_sample(parent_context, trace_id, name, kind, attributes, ())
            sampled, recording = sampling.decision.is_sampled(), sampling.decision.is_recording()
            trace_state, extra = sampling.trace_state, sampling.attributes
        flags = TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT
        random_id = (
            getattr(parent.trace_flags, "random_trace_id", False)
            if parent
            else tracer.id_generator.is_trace_id_random()
        )
        flags = TraceFlags(flags | _RANDOM_TRACE_ID if random_id else flags)
    context = SpanContext(
        trace_id, tracer.id_generator.generate_span_id(), is_remote=False, trace_flags=flags, trace_state=trace_state
    )
    if not recording:
        return NonRecordingSpan(context)
    if extra:
        attributes.update(extra)
    span = DirectSpan(tracer, name, kind, context, parent, attributes)
    hooks = _processor_hooks(tracer.span_processor)
    if hooks is None:
        tracer.span_processor.on_start(span, parent_context=parent_context)
    else:
        for on_start in hooks[0]:
            on_start(span, parent_context=parent_context)
    return span


_last_parent: tuple = (None, None)


def _child_of(parent: SpanContext) -> tuple:
    """(trace id, trace flags, trace state, sampled) of a child of `parent` under the default sampler,
    remembered for the last parent asked (a rollout's model calls share one)."""
    global _last_parent
    known = _last_parent
    if known[0] is parent:
        return known[1]
    flags = TraceFlags.SAMPLED if parent.trace_flags.sampled else TraceFlags.DEFAULT
    if getattr(parent.trace_flags, "random_trace_id", False):
        flags |= _RANDOM_TRACE_ID
    child = (parent.trace_id, TraceFlags(flags), parent.trace_state, parent.trace_flags.sampled)
    _last_parent = (parent, child)
    return child


_hooks: dict[int, tuple] = {}


def _processor_hooks(processor: Any) -> tuple[tuple, tuple] | None:
    """The on_start and on_end methods of the processors behind the provider's (synchronous) span
    processor, without the ones that do nothing (SpanProcessor's own); None for another kind of
    processor, which is then called as usual. The same calls the SDK makes, one layer shorter."""
    if type(processor) is not SynchronousMultiSpanProcessor:
        return None
    processors = getattr(processor, "_span_processors", None)
    known = _hooks.get(id(processor))
    if known is None or known[0] is not processors:
        if type(processors) is not tuple:
            sdk_fallbacks.missing("SynchronousMultiSpanProcessor._span_processors", "processors are called as usual")
            return None
        if len(_hooks) > 64:
            _hooks.clear()
        starts = tuple(p.on_start for p in processors if type(p).on_start is not SpanProcessor.on_start)
        ends = tuple(p.on_end for p in processors if type(p).on_end is not SpanProcessor.on_end)
        known = _hooks[id(processor)] = (processors, starts, ends)
    return known[1], known[2]


_checked: dict[int, tuple[Any, bool]] = {}


def _is_sdk_tracer(tracer: Any) -> bool:
    """Whether the tracer has what start_span uses; asked once per tracer (there are few)."""
    known = _checked.get(id(tracer))
    if known is None or known[0] is not tracer:
        if len(_checked) > 64:  # tracers made per call (get_tracer returns a new one each time)
            _checked.clear()
        known = _checked[id(tracer)] = (tracer, all(hasattr(tracer, attribute) for attribute in _NEEDED))
        if not known[1] and isinstance(tracer, SDKTracer):  # the SDK's tracer, laid out differently
            sdk_fallbacks.missing("sdk Tracer " + "/".join(_NEEDED), "model-call spans are the SDK's (slower)")
    return known[1]


class DirectSpan(trace.Span):
    """A recording span kept as plain fields until `end()`. Not for use across threads at once
    (one model call's span is touched by the thread running that call)."""

    def __init__(
        self,
        tracer: Any,
        name: str,
        kind: SpanKind,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
    ) -> None:
        self._tracer, self._name, self._kind, self._context, self._parent = tracer, name, kind, context, parent
        self._attributes = attributes
        self._clean = _plain(attributes.values())
        self._events: list[Event] = []
        self._links: list[trace.Link] = []
        self._status = _UNSET
        self._start_time = time_ns()
        self._end_time: int | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self._attributes

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._end_time is None:
            self._attributes.update(attributes)
            if self._clean and not _plain(attributes.values()):
                self._clean = False

    def set_attribute(self, key: str, value: Any) -> None:
        self.set_attributes({key: value})

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None) -> None:
        if self._end_time is None:
            limits = self._tracer._span_limits
            cleaned = BoundedAttributes(
                limits.max_event_attributes, attributes, max_value_len=limits.max_attribute_length, immutable=True
            )
            self._events.append(Event(name, cleaned, timestamp))

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self._end_time is None and context is not None and context.is_valid:
            self._links.append(trace.Link(context, attributes))

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """As the SDK: an OK status is final, UNSET is ignored."""
        if self._end_time is not None or self._status.status_code is StatusCode.OK:
            return
        if not isinstance(status, Status):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self._status = status

    record_exception = SDKSpan.record_exception  # the SDK's event layout, through add_event above

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            log.warning("Calling end() on an ended span.")
            return
        self._end_time = end_time if end_time is not None else time_ns()
        attributes: Mapping[str, Any]
        tracer, attributes = self._tracer, self._attributes
        limits = tracer._span_limits
        too_many = limits.max_span_attributes is not None and len(attributes) > limits.max_span_attributes
        if not self._clean or too_many or limits.max_attribute_length is not None:
            attributes = BoundedAttributes(
                limits.max_span_attributes, attributes, max_value_len=limits.max_attribute_length, immutable=True
            )
        readable = ReadableSpan(
            self._name,
            self._context,
            self._parent,
            tracer.resource,
            attributes,
            tuple(self._events),
            tuple(self._links),
            self._kind,
            status=self._status,
            start_time=self._start_time,
            end_time=self._end_time,
            instrumentation_scope=tracer._instrumentation_scope,
        )
        hooks = _processor_hooks(tracer.span_processor)
        if hooks is None:
            tracer.span_processor.on_end(readable)
        else:
            for on_end in hooks[1]:
                on_end(readable)
