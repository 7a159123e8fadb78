"""Merge diagnostics: one record per boundary between consecutive calls of a chain, merged or not,
with the classified cause of each failure (retokenization.py). Published as spans, so they are
queryable by SQL next to the traces (the collector's `merge_diagnostics` view)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pyarrow as pa
from opentelemetry import trace

from lightning_otel.core import schema
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


def diagnose(batch, tokenizer=None) -> list[BoundaryRecord]:  # noqa: ANN001 - update.Batch
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
        attributes = {
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
