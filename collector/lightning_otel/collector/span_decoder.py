"""OTLP request bytes -> the spans table, through the compiled decoder when it is built.

`collector/lightning_otel/collector/_spans_codec.c` walks the protobuf wire format once and copies packed token arrays
straight into Arrow buffers; span_rows.py's pure-Python path (upb message objects, a Python
loop per attribute) stays the reference. The C decoder gives back to that path any request it
does not handle exactly (see the C file), and formats the rare values (arrays, key-value lists,
events, plain or base64 token arrays) through the reference's own functions, passed in below,
so both paths give equal rows (tests/collector/test_spans_codec.py). Set LIGHTNING_OTEL_PURE_PYTHON=1 to
turn the decoder off; without a C compiler at install time it is simply absent.
"""

from __future__ import annotations

import os
import sys
from typing import TypeAlias

import pyarrow as pa
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from lightning_otel.collector import span_rows
from lightning_otel.collector.span_rows import LISTS, SCALARS, SLOTS, SPAN_KINDS, STATUS_CODES
from lightning_otel.core import schema

try:
    from lightning_otel.collector import _spans_codec
except ImportError:  # built without a compiler, or a platform without the extension
    _spans_codec = None  # type: ignore[assignment]  # None: not built, the Python decoder runs

# slot codes the C decoder understands: index * 8 + kind; a fallback: flag | rank << 8 | how << 5 |
# column index, `how` as the C file's FB_* (a string, an integer, an operation's kind, else Python)
_KIND_CODES = {str: 0, int: 1, float: 2, bool: 3}
_FALLBACK_FLAG = 1 << 20


def _fallback_how(rank: int) -> int:
    column, _, how = span_rows.FALLBACKS[rank]
    kind = next(k for name, _, _, k in SCALARS if name == column)
    if how == "kind":
        return 2
    return {str: 0, int: 1}.get(kind, 3) if how == "same" else 3


_SLOT_CODES = {
    key: (
        _FALLBACK_FLAG | index << 8 | _fallback_how(index) << 5 | kind
        if is_list is None
        else index * 8 + ((5 if kind else 4) if is_list else _KIND_CODES[kind])
    )
    for key, (is_list, index, kind) in SLOTS.items()
}
_WIDTHS = tuple(dtype.bit_width // 8 for _, dtype, _, _, _ in LISTS)
_KINDS = tuple(SPAN_KINDS[i] for i in range(len(SPAN_KINDS)))
_STATUSES = tuple(STATUS_CODES[i] for i in range(len(STATUS_CODES)))


def available() -> bool:
    """Whether requests go through the compiled decoder (built, little-endian, not turned off)."""
    return (
        _spans_codec is not None and sys.byteorder == "little" and os.environ.get("LIGHTNING_OTEL_PURE_PYTHON") != "1"
    )


def keep_freed_memory() -> bool:
    """In a process that only converts (a pipeline worker): let the C library keep freed token buffers
    for the next segment instead of faulting in fresh pages each time (see the C file). True if set."""
    if _spans_codec is None or not hasattr(_spans_codec, "keep_freed_memory"):
        return False
    return _spans_codec.keep_freed_memory(32 * 1024 * 1024)  # above one request's buffers (20 MiB bodies)


def _text_of(raw: bytes) -> str:
    return span_rows.as_text(span_rows.any_value(AnyValue.FromString(raw)))


def _list_value(raw: bytes, index: int, packed: int) -> bytes | None:
    value = AnyValue.FromString(raw)
    plain = span_rows.plain_value(value, value.WhichOneof("value"))
    return span_rows.array_bytes(plain, LISTS[index][2], bool(packed))


def _fallback_of(raw: bytes, rank: int):
    value = AnyValue.FromString(raw)
    return span_rows.fallback_value(span_rows.plain_value(value, value.WhichOneof("value")), rank)


def _events_json(raws: list[bytes]) -> str:
    return span_rows.events_json([Span.Event.FromString(raw) for raw in raws])


class _Raw(tuple):
    """One body's columns as the C decoder gives them: (rows, fixed, scalars, lists, attributes, resource)."""


def _decode_raw(body: bytes | memoryview) -> _Raw:
    return _Raw(
        _spans_codec.decode(
            body,
            _SLOT_CODES,
            len(SCALARS),
            _WIDTHS,
            _KINDS,
            _STATUSES,
            schema.SERVICE_NAME,
            _text_of,
            _list_value,
            _events_json,
            _fallback_of,
            span_rows.OPERATION_KINDS,
        )
    )


def _list_arrays(raw: _Raw) -> list[pa.Array]:
    rows, lists = raw[0], raw[3]
    arrays = []
    for (_, dtype, _, _, _), width, (data, offsets, validity, nulls) in zip(LISTS, _WIDTHS, lists):
        values = pa.Array.from_buffers(dtype, len(data) // width, [None, pa.py_buffer(data)])
        arrays.append(
            pa.Array.from_buffers(
                pa.list_(dtype),
                rows,
                [pa.py_buffer(validity) if nulls else None, pa.py_buffer(offsets)],
                null_count=nulls,
                children=[values],
            )
        )
    return arrays


def _merged_map(parts: list[tuple]) -> tuple:
    """(offsets, keys, values) of several bodies' attribute maps as one: offsets shifted."""
    offsets, keys, values = list(parts[0][0]), list(parts[0][1]), list(parts[0][2])
    for part_offsets, part_keys, part_values in parts[1:]:
        base = offsets[-1]
        offsets += [base + offset for offset in part_offsets[1:]]
        keys += part_keys
        values += part_values
    return offsets, keys, values


def _assemble_raws(raws: list[_Raw]) -> pa.RecordBatch:
    """One record batch of several bodies' spans: building each Arrow column costs about the same
    for one span as for thousands, so a segment of one-span exports (SimpleSpanProcessor) is built
    once, not once per body (~0.7 ms of CPU each)."""
    if len(raws) == 1:
        raw = raws[0]
        return span_rows.assemble(list(raw[1]), list(raw[2]), _list_arrays(raw), raw[4], raw[5])
    fixed = [[value for raw in raws for value in raw[1][i]] for i in range(len(raws[0][1]))]
    scalars = [[value for raw in raws for value in raw[2][i]] for i in range(len(raws[0][2]))]
    per_body = [_list_arrays(raw) for raw in raws]
    lists = [pa.concat_arrays([arrays[i] for arrays in per_body]) for i in range(len(LISTS))]
    attributes = _merged_map([raw[4] for raw in raws])
    resource = _merged_map([raw[5] for raw in raws])
    return span_rows.assemble(fixed, scalars, lists, attributes, resource)


def _fast_batch(body: bytes | memoryview) -> pa.RecordBatch:
    """The compiled decoder's batch of one body (raises _spans_codec.Fallback where it gives up)."""
    return _assemble_raws([_decode_raw(body)])


Decoded: TypeAlias = _Raw | pa.RecordBatch


def decode_body(body: bytes | memoryview) -> Decoded:
    """One export request's spans, not yet in Arrow columns where the compiled decoder took it (see
    `assemble_bodies`); ValueError when it is not OTLP protobuf."""
    if available():
        try:
            return _decode_raw(body)
        except _spans_codec.Fallback:
            pass  # an unusual request: the reference path below decides
    return span_rows.to_batch([span_rows.decode_request(body)])


def assemble_bodies(decoded: list[Decoded]) -> list[pa.RecordBatch]:
    """Record batches of `decode_body` results, in order: runs of compiled-decoder results become
    one batch each. Raises what building a column raises; then assemble bodies one by one to find
    the one at fault."""
    batches: list[pa.RecordBatch] = []
    run: list[_Raw] = []
    for item in decoded:
        if isinstance(item, _Raw):
            run.append(item)
            continue
        if run:
            batches.append(_assemble_raws(run))
            run = []
        batches.append(item)
    if run:
        batches.append(_assemble_raws(run))
    return batches


def batch_from_body(body: bytes | memoryview) -> pa.RecordBatch:
    """One export request's spans as a record batch; ValueError when it is not OTLP protobuf."""
    return assemble_bodies([decode_body(body)])[0]
