"""instrument/lightning_otel/instrumentation/direct_span.py: the lean OpenAI span's cheap span goes through the SDK's pipeline as an SDK
span would (sampler, ids, every processor's on_start and on_end, resource, scope, limits, status,
exception events), so exporters and the collector cannot tell them apart."""

from __future__ import annotations

import logging

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanKind, StatusCode

from lightning_otel.instrumentation import rollouts
from lightning_otel.instrumentation.direct_span import DirectSpan, start_span


class _Starts(SpanProcessor):
    def __init__(self) -> None:
        self.started = []

    def on_start(self, span, parent_context=None) -> None:
        self.started.append(span.name)
        span.set_attribute("seen.by", "on_start")


def _pipeline(sampler=None, limits=None):
    provider = TracerProvider(resource=Resource.create({"service.name": "direct"}), sampler=sampler, span_limits=limits)
    memory, starts = InMemorySpanExporter(), _Starts()
    provider.add_span_processor(rollouts.LightningSpanProcessor())
    provider.add_span_processor(starts)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider.get_tracer("scope.name", "1.0"), memory, starts


def _fields(span) -> dict:
    context = span.get_span_context()
    return {
        "kind": span.kind,
        "resource": span.resource,
        "scope": span.instrumentation_scope,
        "status": span.status.status_code,
        "attributes": dict(span.attributes),
        "flags": context.trace_flags,
        "remote": context.is_remote,
    }


def test_a_direct_span_is_exported_as_the_sdks_own_span_would_be():
    tracer, memory, starts = _pipeline()
    with rollouts.rollout(task_id="t") as current, tracer.start_as_current_span("parent") as parent:
        sdk = tracer.start_span("call", kind=SpanKind.CLIENT, attributes={"a": 1, "b": "x"})
        sdk.set_attributes({"c": b"\x01", "d": 2.5})
        sdk.end()
        direct = start_span(tracer, "call", SpanKind.CLIENT, {"a": 1, "b": "x"})
        assert isinstance(direct, DirectSpan) and direct.is_recording()
        direct.set_attributes({"c": b"\x01", "d": 2.5})
        direct.end()
        assert not direct.is_recording()
    ours, theirs = [s for s in memory.get_finished_spans() if s.name == "call"]
    assert _fields(ours) == _fields(theirs)
    assert ours.attributes["lightning.rollout.id"] == current.rollout_id  # stamped by on_start
    assert ours.attributes["seen.by"] == "on_start" and starts.started.count("call") == 2
    assert ours.parent.span_id == parent.get_span_context().span_id
    assert ours.context.trace_id == parent.get_span_context().trace_id != 0
    assert ours.context.span_id not in (0, theirs.context.span_id)
    assert ours.start_time <= ours.end_time


def test_a_root_direct_span_starts_its_own_trace():
    tracer, memory, _ = _pipeline()
    start_span(tracer, "root", SpanKind.CLIENT, {}).end()
    (span,) = memory.get_finished_spans()
    assert span.parent is None and span.context.trace_id != 0 and span.context.trace_flags.sampled


def test_the_sampler_decides():
    tracer, memory, starts = _pipeline(sampler=ALWAYS_OFF)
    span = start_span(tracer, "dropped", SpanKind.CLIENT, {})
    assert isinstance(span, NonRecordingSpan) and not span.is_recording()
    span.end()
    tracer, memory, starts = _pipeline(sampler=ParentBased(TraceIdRatioBased(0.5)))
    for _ in range(200):
        start_span(tracer, "half", SpanKind.CLIENT, {}).end()
    assert 50 < len(memory.get_finished_spans()) < 150  # the ratio sampler ran (200 draws)
    assert starts.started.count("half") == len(memory.get_finished_spans())


def test_limits_and_values_set_from_outside_are_cleaned_as_the_sdk_cleans_them(caplog):
    limits = SpanLimits(max_span_attributes=4, max_attribute_length=3)
    tracer, memory, _ = _pipeline(limits=limits)
    with caplog.at_level(logging.WARNING):
        for make in (
            lambda: tracer.start_span("s", attributes={"long": "abcdef"}),
            lambda: start_span(tracer, "s", SpanKind.INTERNAL, {"long": "abcdef"}),
        ):
            span = make()
            span.set_attributes({"list": [1, 2], "bad": {"not": "allowed"}, "n": 1, "m": 2})
            span.end()
    ours, theirs = memory.get_finished_spans()[1], memory.get_finished_spans()[0]
    assert dict(ours.attributes) == dict(theirs.attributes)
    assert ours.dropped_attributes == theirs.dropped_attributes > 0
    tracer, memory, _ = _pipeline()
    span = start_span(tracer, "s", SpanKind.INTERNAL, {})
    span.set_attribute("list", [1, 2])  # not a plain value: cleaned to a tuple, as the SDK stores it
    span.end()
    assert memory.get_finished_spans()[0].attributes["list"] == (1, 2)


def test_failures_status_and_events_match_the_sdk(caplog):
    tracer, memory, _ = _pipeline()
    error = ValueError("bad request")
    for span in (tracer.start_span("f"), start_span(tracer, "f", SpanKind.INTERNAL, {})):
        span.add_event("note", {"k": "v"})
        span.record_exception(error)
        span.set_status(trace.Status(StatusCode.ERROR, "ValueError: bad request"))
        span.set_status(StatusCode.UNSET)  # ignored, as by the SDK
        span.update_name("failed")
        span.end()
    theirs, ours = memory.get_finished_spans()
    assert ours.name == theirs.name == "failed"
    assert (ours.status.status_code, ours.status.description) == (theirs.status.status_code, theirs.status.description)
    assert [(e.name, dict(e.attributes)) for e in ours.events] == [(e.name, dict(e.attributes)) for e in theirs.events]
    with caplog.at_level(logging.WARNING):
        span = start_span(tracer, "twice", SpanKind.INTERNAL, {})
        span.end()
        span.end()
    assert [s.name for s in memory.get_finished_spans()].count("twice") == 1
    assert "ended span" in caplog.text


def test_a_tracer_that_is_not_the_sdks_gets_its_own_span():
    tracer = trace.NoOpTracer()
    span = start_span(tracer, "x", SpanKind.CLIENT, {"a": 1})
    assert not isinstance(span, DirectSpan)
    span.end()


def test_the_default_samplers_answer_is_the_one_it_would_give():
    """start_span decides for the SDK's default sampler (ParentBased(ALWAYS_ON)) without calling it:
    under every kind of parent, the same decision and trace state as the SDK's own span."""
    from opentelemetry.context import attach, detach
    from opentelemetry.sdk.trace.sampling import DEFAULT_ON
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState, set_span_in_context

    tracer, _, _ = _pipeline()
    assert tracer.sampler is DEFAULT_ON
    state = TraceState([("vendor", "v")])
    parents = [None] + [
        SpanContext(7, 8, is_remote=remote, trace_flags=TraceFlags(flags), trace_state=state)
        for remote in (False, True)
        for flags in (TraceFlags.SAMPLED, TraceFlags.DEFAULT)
    ]
    for parent in parents:
        context = set_span_in_context(NonRecordingSpan(parent)) if parent else None
        sdk = tracer.start_span("x", context=context)
        token = attach(context) if context else None
        try:
            ours = start_span(tracer, "x", SpanKind.CLIENT, {})
        finally:
            if token:
                detach(token)
        mine, theirs = ours.get_span_context(), sdk.get_span_context()
        assert (ours.is_recording(), mine.trace_flags, mine.trace_state) == (
            sdk.is_recording(),
            theirs.trace_flags,
            theirs.trace_state,
        )
        assert mine.trace_id == theirs.trace_id if parent else mine.trace_id != theirs.trace_id
        ours.end()
        sdk.end()
