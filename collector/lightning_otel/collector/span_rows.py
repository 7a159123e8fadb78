"""OTLP spans -> Arrow record batches, one row per span, in the layout of the Parquet store.

Promoted columns hold what people filter and join on (ids, times, status, service, the
OpenInference kind, model, token counts, rollout identity, rewards, policy version) and the
token arrays as list columns. Every other attribute stays in the `attributes` map, string values
as they are and others JSON-encoded, so nothing sent is lost (a promoted attribute whose value does
not fit its column stays in the map too).

Speed matters here (BENCHMARKS.md): the loop touches each attribute once, token arrays sent as
packed (`lightning.llm.packed.*`) become list columns straight from their bytes, and columns are built from flat
buffers rather than per-row Python objects.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from array import array
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from lightning_otel.core import schema

TIMESTAMP = pa.timestamp("us", tz="UTC")
_BIG_ENDIAN = sys.byteorder == "big"

# promoted scalar columns: (column, arrow type, attribute, accepted python type)
SCALARS: tuple[tuple[str, pa.DataType, str, type], ...] = (
    ("span_kind", pa.string(), schema.OPENINFERENCE_SPAN_KIND, str),
    ("model_name", pa.string(), schema.LLM_MODEL_NAME, str),
    ("token_count_prompt", pa.int64(), schema.LLM_TOKEN_COUNT_PROMPT, int),
    ("token_count_completion", pa.int64(), schema.LLM_TOKEN_COUNT_COMPLETION, int),
    ("token_count_total", pa.int64(), schema.LLM_TOKEN_COUNT_TOTAL, int),
    ("tool_name", pa.string(), schema.TOOL_NAME, str),
    ("rollout_id", pa.string(), schema.ROLLOUT_ID, str),
    ("task_id", pa.string(), schema.TASK_ID, str),
    ("attempt", pa.int64(), schema.ATTEMPT, int),
    ("is_rollout_root", pa.bool_(), schema.ROLLOUT_ROOT, bool),
    ("reward_name", pa.string(), schema.REWARD_NAME, str),
    ("reward_value", pa.float64(), schema.REWARD_VALUE, float),
    ("policy_version", pa.string(), schema.POLICY_VERSION, str),
    ("finish_reason", pa.string(), schema.FINISH_REASON, str),
)
# OpenTelemetry GenAI-convention attributes that fill a promoted column when the span has no value of
# its own for it (OpenInference's or lightning's attribute wins): (column, attribute, how the value
# becomes the column's: "same" as is, "kind" the OpenInference kind of a gen_ai.operation.name, "first"
# the first string of an array). Of two for one column the earlier wins. Unlike promoted attributes they
# also stay in the attributes map, so the convention's own names stay queryable.
FALLBACKS: tuple[tuple[str, str, str], ...] = (
    ("span_kind", schema.GEN_AI_OPERATION_NAME, "kind"),
    ("model_name", schema.GEN_AI_RESPONSE_MODEL, "same"),
    ("model_name", schema.GEN_AI_REQUEST_MODEL, "same"),
    ("token_count_prompt", schema.GEN_AI_USAGE_INPUT_TOKENS, "same"),
    ("token_count_completion", schema.GEN_AI_USAGE_OUTPUT_TOKENS, "same"),
    ("tool_name", schema.GEN_AI_TOOL_NAME, "same"),
    ("finish_reason", schema.GEN_AI_RESPONSE_FINISH_REASONS, "first"),
)
# gen_ai.operation.name -> the OpenInference span kind it is (others leave span_kind empty).
OPERATION_KINDS = {
    **{operation: schema.KIND_LLM for operation in schema.GEN_AI_MODEL_CALL_OPERATIONS},
    schema.GEN_AI_OP_EXECUTE_TOOL: schema.KIND_TOOL,
    schema.GEN_AI_OP_INVOKE_AGENT: schema.KIND_AGENT,
}
# list columns: (column, element type, typecode, plain-array attribute, packed attribute)
LISTS: tuple[tuple[str, pa.DataType, str, str, str], ...] = (
    ("prompt_token_ids", pa.int32(), "i", schema.PROMPT_TOKEN_IDS, schema.PACKED_PROMPT_TOKEN_IDS),
    ("completion_token_ids", pa.int32(), "i", schema.COMPLETION_TOKEN_IDS, schema.PACKED_COMPLETION_TOKEN_IDS),
    ("completion_logprobs", pa.float64(), "d", schema.COMPLETION_LOGPROBS, schema.PACKED_COMPLETION_LOGPROBS),
)

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
        *[(column, dtype) for column, dtype, _, _ in SCALARS],
        *[(column, pa.list_(dtype)) for column, dtype, _, _, _ in LISTS],
        ("attributes", pa.map_(pa.string(), pa.string())),
        ("resource_attributes", pa.map_(pa.string(), pa.string())),
        ("events", pa.string()),  # JSON list of {name, time_unix_nano, attributes}
    ]
)

FIXED_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_time",
    "end_time",
    "duration_ms",
    "status_code",
    "status_message",
    "service_name",
    "scope_name",
    "events",
)
SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}
# attribute -> (is_list, index, accepted type for scalars / is_packed for lists);
# a fallback: (None, its index in FALLBACKS, the index of its column in SCALARS)
_SCALAR_INDEX = {column: i for i, (column, _, _, _) in enumerate(SCALARS)}
SLOTS: dict[str, tuple[bool | None, int, Any]] = {
    **{attribute: (None, rank, _SCALAR_INDEX[column]) for rank, (column, attribute, _) in enumerate(FALLBACKS)},
    **{attribute: (False, i, kind) for i, (_, _, attribute, kind) in enumerate(SCALARS)},
    **{plain: (True, i, False) for i, (_, _, _, plain, _) in enumerate(LISTS)},
    **{packed: (True, i, True) for i, (_, _, _, _, packed) in enumerate(LISTS)},
}


def any_value(value) -> Any:
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


def plain_value(value, which: str) -> Any:
    """A value as promotion sees it: bytes stay bytes (packed arrays), the rest as any_value."""
    return (
        value.bytes_value
        if which == "bytes_value"
        else (value.string_value if which == "string_value" else any_value(value))
    )


def as_text(value: Any) -> str:
    """How a value is kept in an attribute map: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def fallback_value(plain: Any, rank: int) -> Any:
    """The column value FALLBACKS[rank]'s attribute gives, or None when it gives none."""
    column, _, how = FALLBACKS[rank]
    if how == "kind":
        return OPERATION_KINDS.get(plain) if isinstance(plain, str) else None
    if how == "first":
        plain = plain[0] if isinstance(plain, list) and plain else None
    return plain if plain is not None and _fits(plain, SCALARS[_SCALAR_INDEX[column]][3]) else None


def _promote(slot: tuple, which: str | None, value, row_scalars: list, row_lists: list, fallbacks: dict) -> bool:
    """Put a promoted attribute's value in its column; False if it does not fit (it stays in the map).
    A fallback attribute's value goes to `fallbacks` (column index -> (rank, value)) and stays in the map."""
    is_list, index, kind = slot
    if which is None:
        return True  # an empty value: nothing to keep
    plain = plain_value(value, which)
    if is_list is None:
        held = fallbacks.get(kind)
        if held is None or held[0] > index:
            filled = fallback_value(plain, index)
            if filled is not None:
                fallbacks[kind] = (index, filled)
        return False
    if not is_list:
        if not _fits(plain, kind):
            return False
        row_scalars[index] = float(plain) if kind is float else plain
        return True
    data = array_bytes(plain, LISTS[index][2], kind)
    if data is None:
        return False
    if kind or row_lists[index] is None:  # a packed value wins over a plain array
        row_lists[index] = data
    return True


def _fits(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def array_bytes(value: Any, typecode: str, is_packed: bool) -> bytes | None:
    """Native-order bytes of a token/logprob array, or None if the value is not one.
    Packed values are little-endian bytes, or those bytes in base64."""
    try:
        if is_packed:
            data = base64.b64decode(value, validate=True) if isinstance(value, str) else value
            if not isinstance(data, bytes) or len(data) % array(typecode).itemsize:
                return None
            if not _BIG_ENDIAN:
                return data
            packed = array(typecode)
            packed.frombytes(data)
            packed.byteswap()  # the wire format is little-endian; Arrow buffers are native
            return packed.tobytes()
        if not isinstance(value, list):
            return None
        packed = array(typecode, value)
    except (binascii.Error, TypeError, ValueError, OverflowError):
        return None
    return packed.tobytes()


def decode_request(body: bytes | memoryview) -> ExportTraceServiceRequest:
    """Parse an OTLP/protobuf export body; raises ValueError when it is not one."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except Exception as exc:
        raise ValueError(f"undecodable OTLP protobuf: {exc}") from None
    return request


def count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


def has_valid_ids(span) -> bool:
    """OTLP ids: 16-byte trace id, 8-byte span id, parent empty or 8 bytes."""
    return len(span.trace_id) == 16 and len(span.span_id) == 8 and len(span.parent_span_id) in (0, 8)


class _Builder:
    """Accumulates one record batch's columns as flat Python lists and byte chunks."""

    def __init__(self) -> None:
        self.fixed: dict[str, list] = {name: [] for name in FIXED_COLUMNS}
        self.scalars: list[list] = [[] for _ in SCALARS]
        self.lists: list[list[bytes | None]] = [[] for _ in LISTS]
        self.attr_keys: list[str] = []
        self.attr_values: list[str] = []
        self.attr_offsets: list[int] = [0]
        self.res_keys: list[str] = []
        self.res_values: list[str] = []
        self.res_offsets: list[int] = [0]

    def add_request(self, request: ExportTraceServiceRequest) -> None:
        # Hot loop (BENCHMARKS.md): locals instead of attribute and dict lookups, one slot lookup
        # per attribute, and a fast path for the common case, an unpromoted string attribute.
        fixed = self.fixed
        trace_ids, span_ids, parents, names = (
            fixed["trace_id"],
            fixed["span_id"],
            fixed["parent_span_id"],
            fixed["name"],
        )
        kinds, starts, ends, durations = fixed["kind"], fixed["start_time"], fixed["end_time"], fixed["duration_ms"]
        codes, messages, services, scopes, events = (
            fixed["status_code"],
            fixed["status_message"],
            fixed["service_name"],
            fixed["scope_name"],
            fixed["events"],
        )
        scalars, lists = self.scalars, self.lists
        keys, values, offsets = self.attr_keys, self.attr_values, self.attr_offsets
        keys_append, values_append, slot_of = keys.append, values.append, SLOTS.get
        n_scalars, n_lists = len(SCALARS), len(LISTS)
        fallbacks: dict[int, tuple[int, Any]] = {}
        for resource_spans in request.resource_spans:
            resource = [(kv.key, any_value(kv.value)) for kv in resource_spans.resource.attributes]
            service = next((v for k, v in resource if k == schema.SERVICE_NAME and isinstance(v, str)), None)
            resource_keys = [k for k, _ in resource]
            resource_values = [as_text(v) for _, v in resource]
            for scope_spans in resource_spans.scope_spans:
                scope_name = scope_spans.scope.name or None
                for span in scope_spans.spans:
                    row_scalars: list = [None] * n_scalars
                    row_lists: list = [None] * n_lists
                    for kv in span.attributes:
                        key, value = kv.key, kv.value
                        which = value.WhichOneof("value")
                        slot = slot_of(key)
                        if slot is None or not _promote(slot, which, value, row_scalars, row_lists, fallbacks):
                            if which == "string_value":
                                keys_append(key)
                                values_append(value.string_value)
                            elif which is not None:
                                keys_append(key)
                                values_append(
                                    value.bytes_value.hex() if which == "bytes_value" else as_text(any_value(value))
                                )
                    if fallbacks:
                        for index, (_, filled) in fallbacks.items():
                            if row_scalars[index] is None:
                                row_scalars[index] = filled
                        fallbacks.clear()
                    offsets.append(len(keys))
                    for column, cell in zip(scalars, row_scalars):
                        column.append(cell)
                    for column, cell in zip(lists, row_lists):
                        column.append(cell)
                    start, end = span.start_time_unix_nano, span.end_time_unix_nano
                    trace_ids.append(span.trace_id.hex())
                    span_ids.append(span.span_id.hex())
                    parents.append(span.parent_span_id.hex() or None)
                    names.append(span.name)
                    kinds.append(SPAN_KINDS.get(span.kind) or str(span.kind))
                    starts.append(start // 1000)
                    ends.append(end // 1000)
                    durations.append((end - start) / 1e6)
                    status = span.status
                    codes.append(STATUS_CODES.get(status.code) or str(status.code))
                    messages.append(status.message or None)
                    services.append(service)
                    scopes.append(scope_name)
                    events.append(events_json(span.events) if span.events else None)
                    self.res_keys.extend(resource_keys)
                    self.res_values.extend(resource_values)
                    self.res_offsets.append(len(self.res_keys))

    def batch(self) -> pa.RecordBatch:
        lists = [_list_array(chunks, dtype) for (_, dtype, _, _, _), chunks in zip(LISTS, self.lists)]
        return assemble(
            list(self.fixed.values()),
            self.scalars,
            lists,
            (self.attr_offsets, self.attr_keys, self.attr_values),
            (self.res_offsets, self.res_keys, self.res_values),
        )


def assemble(
    fixed: list[list], scalars: list[list], lists: list[pa.Array], attributes: tuple, resource: tuple
) -> pa.RecordBatch:
    """A record batch from per-column Python lists (FIXED_COLUMNS, then SCALARS' columns), built
    list columns, and the two attribute maps as (offsets, keys, values)."""
    columns: dict[str, pa.Array] = {}
    for name, values in zip(FIXED_COLUMNS, fixed):
        columns[name] = pa.array(values, SPANS_SCHEMA.field(name).type)
    for (column, dtype, _, _), values in zip(SCALARS, scalars):
        columns[column] = pa.array(values, dtype)
    for (column, _, _, _, _), values in zip(LISTS, lists):
        columns[column] = values
    for column, (offsets, keys, values) in (("attributes", attributes), ("resource_attributes", resource)):
        columns[column] = pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.string())
        )
    return pa.RecordBatch.from_arrays([columns[f.name] for f in SPANS_SCHEMA], schema=SPANS_SCHEMA)


def events_json(events) -> str:
    return json.dumps(
        [
            {
                "name": e.name,
                "time_unix_nano": e.time_unix_nano,
                "attributes": {kv.key: any_value(kv.value) for kv in e.attributes},
            }
            for e in events
        ]
    )


def _list_array(chunks: list[bytes | None], dtype: pa.DataType) -> pa.Array:
    """A list column from per-row little-endian byte chunks (None = null row), no per-element Python."""
    width = dtype.bit_width // 8
    offsets, total = [0], 0
    for chunk in chunks:
        total += len(chunk) // width if chunk else 0
        offsets.append(total)
    data = b"".join(chunk for chunk in chunks if chunk)
    values = pa.Array.from_buffers(dtype, total, [None, pa.py_buffer(data)])
    mask = pa.array([chunk is None for chunk in chunks], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=mask)


def to_batch(requests: Iterable[ExportTraceServiceRequest]) -> pa.RecordBatch:
    builder = _Builder()
    for request in requests:
        builder.add_request(request)
    return builder.batch()


def to_table(requests: Iterable[ExportTraceServiceRequest]) -> pa.Table:
    return pa.Table.from_batches([to_batch(requests)], schema=SPANS_SCHEMA)
