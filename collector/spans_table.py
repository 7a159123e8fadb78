"""OTLP spans -> one Arrow table row per span, in the layout of the Parquet store.

Promoted columns hold what people filter and join on (ids, times, status, service, the
OpenInference kind, model, token counts, rollout identity, rewards, policy version) and the
token arrays as list columns. Every other attribute stays in the `attributes` map, with string
values as they are and other values JSON-encoded, so nothing sent is lost.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from lightning_otel.instrument import schema

TIMESTAMP = pa.timestamp("us", tz="UTC")

# (column, arrow type, attribute it is promoted from or None)
_PROMOTED: tuple[tuple[str, pa.DataType, str], ...] = (
    ("span_kind", pa.string(), schema.OPENINFERENCE_SPAN_KIND),
    ("model_name", pa.string(), schema.LLM_MODEL_NAME),
    ("token_count_prompt", pa.int64(), schema.LLM_TOKEN_COUNT_PROMPT),
    ("token_count_completion", pa.int64(), schema.LLM_TOKEN_COUNT_COMPLETION),
    ("token_count_total", pa.int64(), schema.LLM_TOKEN_COUNT_TOTAL),
    ("tool_name", pa.string(), schema.TOOL_NAME),
    ("rollout_id", pa.string(), schema.ROLLOUT_ID),
    ("task_id", pa.string(), schema.TASK_ID),
    ("attempt", pa.int64(), schema.ATTEMPT),
    ("is_rollout_root", pa.bool_(), schema.ROLLOUT_ROOT),
    ("reward_name", pa.string(), schema.REWARD_NAME),
    ("reward_value", pa.float64(), schema.REWARD_VALUE),
    ("policy_version", pa.string(), schema.POLICY_VERSION),
    ("finish_reason", pa.string(), schema.FINISH_REASON),
    ("prompt_token_ids", pa.list_(pa.int32()), schema.PROMPT_TOKEN_IDS),
    ("completion_token_ids", pa.list_(pa.int32()), schema.COMPLETION_TOKEN_IDS),
    ("completion_logprobs", pa.list_(pa.float64()), schema.COMPLETION_LOGPROBS),
)
PROMOTED_ATTRIBUTES = {attribute: column for column, _, attribute in _PROMOTED}

SPANS_SCHEMA = pa.schema(
    [
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("parent_span_id", pa.string()),
        ("name", pa.string()),
        ("kind", pa.string()),
        ("start_time", TIMESTAMP),
        ("end_time", TIMESTAMP),
        ("duration_ms", pa.float64()),
        ("status_code", pa.string()),
        ("status_message", pa.string()),
        ("service_name", pa.string()),
        ("scope_name", pa.string()),
        *[(column, dtype) for column, dtype, _ in _PROMOTED],
        ("attributes", pa.map_(pa.string(), pa.string())),
        ("resource_attributes", pa.map_(pa.string(), pa.string())),
        ("events", pa.string()),  # JSON list of {name, time_unix_nano, attributes}
    ]
)

_SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def any_value(value) -> Any:  # noqa: ANN001 - opentelemetry.proto AnyValue
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _coerce(value: Any, dtype: pa.DataType) -> Any:
    """Promoted values that do not fit their column stay in the map instead (returns None)."""
    if value is None:
        return None
    if pa.types.is_string(dtype):
        return value if isinstance(value, str) else _as_text(value)
    if pa.types.is_boolean(dtype):
        return value if isinstance(value, bool) else None
    if pa.types.is_integer(dtype):
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if pa.types.is_floating(dtype):
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if pa.types.is_list(dtype):
        return value if isinstance(value, list) else None
    return None


_PROMOTED_TYPES = {attribute: dtype for _, dtype, attribute in _PROMOTED}


def decode_request(body: bytes) -> ExportTraceServiceRequest:
    """Parse an OTLP/protobuf export body; raises ValueError when it is not one."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError or others
        raise ValueError(f"undecodable OTLP protobuf: {exc}") from None
    return request


def count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


def has_valid_ids(span) -> bool:  # noqa: ANN001 - opentelemetry.proto Span
    """OTLP ids: 16-byte trace id, 8-byte span id, parent empty or 8 bytes."""
    return len(span.trace_id) == 16 and len(span.span_id) == 8 and len(span.parent_span_id) in (0, 8)


def rows(requests: Iterable[ExportTraceServiceRequest]) -> dict[str, list]:
    """Columns (dict of lists) for all spans in the requests."""
    columns: dict[str, list] = {field.name: [] for field in SPANS_SCHEMA}
    for request in requests:
        for resource_spans in request.resource_spans:
            resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
            service = resource.get(schema.SERVICE_NAME)
            resource_map = [(k, _as_text(v)) for k, v in resource.items()]
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    promoted: dict[str, Any] = {}
                    rest = []
                    for kv in span.attributes:
                        value = any_value(kv.value)
                        dtype = _PROMOTED_TYPES.get(kv.key)
                        coerced = _coerce(value, dtype) if dtype is not None else None
                        if coerced is not None:
                            promoted[PROMOTED_ATTRIBUTES[kv.key]] = coerced
                        elif value is not None:
                            rest.append((kv.key, _as_text(value)))
                    columns["trace_id"].append(span.trace_id.hex())
                    columns["span_id"].append(span.span_id.hex())
                    columns["parent_span_id"].append(span.parent_span_id.hex() or None)
                    columns["name"].append(span.name)
                    columns["kind"].append(_SPAN_KINDS.get(span.kind, str(span.kind)))
                    columns["start_time"].append(span.start_time_unix_nano // 1000)
                    columns["end_time"].append(span.end_time_unix_nano // 1000)
                    columns["duration_ms"].append((span.end_time_unix_nano - span.start_time_unix_nano) / 1e6)
                    columns["status_code"].append(_STATUS.get(span.status.code, str(span.status.code)))
                    columns["status_message"].append(span.status.message or None)
                    columns["service_name"].append(service if isinstance(service, str) else None)
                    columns["scope_name"].append(scope_spans.scope.name or None)
                    for column, _, _ in _PROMOTED:
                        columns[column].append(promoted.get(column))
                    columns["attributes"].append(rest)
                    columns["resource_attributes"].append(resource_map)
                    events = [
                        {
                            "name": event.name,
                            "time_unix_nano": event.time_unix_nano,
                            "attributes": {kv.key: any_value(kv.value) for kv in event.attributes},
                        }
                        for event in span.events
                    ]
                    columns["events"].append(json.dumps(events) if events else None)
    return columns


def to_table(requests: Iterable[ExportTraceServiceRequest]) -> pa.Table:
    return pa.Table.from_pydict(rows(requests), schema=SPANS_SCHEMA)
