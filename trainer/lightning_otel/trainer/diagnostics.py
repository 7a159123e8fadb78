"""Merge diagnostics: one record per boundary between consecutive calls of a chain, merged or not,
with the classified cause of each failure (retokenization.py). Input diagnostics: one record per call
whose tokens input hygiene masked, and per rollout left out of training for good. Both are published
as spans, so they are queryable by SQL next to the traces (the collector's `merge_diagnostics` and
`input_diagnostics` views)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pyarrow as pa
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from lightning_otel.core import schema
from lightning_otel.trainer.input_hygiene import MaskedCall
from lightning_otel.trainer.retokenization import classify


@dataclass(frozen=True)
class BoundaryRecord:
    rollout_id: str
    task_id: str
    chain: int
    prev_span_id: str
    next_span_id: str
    merged: bool
    position: int | None = None
    cause: str | None = None
    region: str | None = None
    detail: str | None = None


def diagnose(batch, tokenizer=None) -> list[BoundaryRecord]:
    """Classify every failed boundary of a batch (the tokenizer enables the text-level causes)."""
    records = []
    for boundary in batch.boundaries:
        rollout = batch.rollouts[boundary.rollout_index]
        b = boundary.boundary
        common = dict(
            rollout_id=rollout.rollout_id,
            task_id=rollout.task_id,
            chain=boundary.chain,
            prev_span_id=b.prev_span_id,
            next_span_id=b.next_span_id,
            merged=b.merged,
        )
        if b.merged:
            records.append(BoundaryRecord(**common))
            continue
        calls = {call.span_id: call for call in rollout.calls}
        diagnosis = classify(calls[b.prev_span_id], calls[b.next_span_id].prompt_ids, b.position, tokenizer)
        records.append(
            BoundaryRecord(
                **common,
                position=diagnosis.position,
                cause=diagnosis.cause,
                region=diagnosis.region,
                detail=diagnosis.detail,
            )
        )
    return records


def to_table(records: list[BoundaryRecord]) -> pa.Table:
    return pa.Table.from_pylist([asdict(r) for r in records])


def publish(records: list[BoundaryRecord], tracer: trace.Tracer | None = None) -> None:
    """One `merge_boundary` span per record, through the process's OpenTelemetry pipeline."""
    tracer = tracer or trace.get_tracer("lightning_otel.trainer")
    for record in records:
        attributes: dict[str, AttributeValue] = {
            schema.MERGE_ROLLOUT: record.rollout_id,
            schema.MERGE_CHAIN: record.chain,
            schema.MERGE_PREV_SPAN: record.prev_span_id,
            schema.MERGE_NEXT_SPAN: record.next_span_id,
            schema.MERGE_MERGED: record.merged,
        }
        for key, value in (
            (schema.MERGE_POSITION, record.position),
            (schema.MERGE_CAUSE, record.cause),
            (schema.MERGE_REGION, record.region),
            (schema.MERGE_DETAIL, record.detail),
        ):
            if value is not None:
                attributes[key] = value
        tracer.start_span(
            schema.SPAN_MERGE_BOUNDARY, context=trace.set_span_in_context(trace.INVALID_SPAN), attributes=attributes
        ).end()


@dataclass(frozen=True)
class InputRecord:
    rollout_id: str
    cause: str
    detail: str
    span_id: str | None = None  # the call whose tokens were masked
    tokens: int | None = None  # tokens masked out of the loss
    excluded: bool = False  # the whole rollout left out of training for good


def input_records(masked_calls: list[MaskedCall], exclusions: dict[str, tuple[str, str]]) -> list[InputRecord]:
    """Records for masked calls, and for excluded rollouts given as rollout id -> (cause, reason)."""
    records = [InputRecord(m.rollout_id, m.cause, m.detail, m.span_id, m.tokens) for m in masked_calls]
    return records + [InputRecord(rid, cause, reason, excluded=True) for rid, (cause, reason) in exclusions.items()]


def publish_inputs(records: list[InputRecord], tracer: trace.Tracer | None = None) -> None:
    """One `input_diagnostic` span per record, through the process's OpenTelemetry pipeline."""
    tracer = tracer or trace.get_tracer("lightning_otel.trainer")
    for record in records:
        attributes: dict[str, AttributeValue] = {
            schema.INPUT_ROLLOUT: record.rollout_id,
            schema.INPUT_CAUSE: record.cause,
            schema.INPUT_DETAIL: record.detail,
            schema.INPUT_EXCLUDED: record.excluded,
        }
        if record.span_id is not None:
            attributes[schema.INPUT_SPAN] = record.span_id
        if record.tokens is not None:
            attributes[schema.INPUT_TOKENS] = record.tokens
        context = trace.set_span_in_context(trace.INVALID_SPAN)  # a root span: not part of any trace
        tracer.start_span(schema.SPAN_INPUT_DIAGNOSTIC, context=context, attributes=attributes).end()
