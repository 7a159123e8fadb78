"""The receiver's quick check of an OTLP/protobuf export body, without parsing it into messages.

`span_count(body)` is the number of spans when the compiled walk (`_request_check.c`) is sure
the body is one that upb parses, that every span in it has valid ids and that nothing in it is
near a size cap (size_caps.py); otherwise None, and the caller parses the body with upb
(`span_rows.decode_request`) to get its error or drop the bad spans, as before. The walk's schema is built here from the installed protobuf descriptors,
so a field the installed OTLP version does not know sends the body to upb too.
Without the extension (no C compiler at install time) or with LIGHTNING_OTEL_PURE_PYTHON=1,
`span_count` is always None. tests/collector/test_request_check.py holds it to upb's answers.
"""

from __future__ import annotations

import os

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

from lightning_otel.collector import size_caps

try:
    from lightning_otel.collector import _request_check
except ImportError:  # built without a compiler
    _request_check = None  # type: ignore[assignment]  # None: not built, upb parses every body

# field kinds, as _request_check.c numbers them; 16 + i is a message of schema i
_UNKNOWN, _VARINT, _FIXED64, _FIXED32, _BYTES, _STRING, _MESSAGE = 0, 1, 2, 3, 4, 5, 16
_VARINTS = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_BOOL,
    FieldDescriptor.TYPE_ENUM,
}
_FIXED64S = {FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_DOUBLE}
_FIXED32S = {FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32, FieldDescriptor.TYPE_FLOAT}


def schema_table(root: Descriptor) -> tuple[tuple[bytes, ...], dict[str, int]]:
    """One row of field kinds per message reachable from `root` (row 0), and each message's row.

    A repeated scalar (packed or not, upb takes both) and a group are left unknown: the walk then
    hands the body to upb rather than guess."""
    order: list[Descriptor] = []
    index: dict[str, int] = {}

    def visit(message: Descriptor) -> None:
        if message.full_name in index:
            return
        index[message.full_name] = len(order)
        order.append(message)
        for field in message.fields:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                visit(field.message_type)

    visit(root)
    rows = []
    for message in order:
        kinds = bytearray(max((f.number for f in message.fields), default=0) + 1)
        for field in message.fields:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                kinds[field.number] = _MESSAGE + index[field.message_type.full_name]
            elif field.type == FieldDescriptor.TYPE_STRING:
                kinds[field.number] = _STRING
            elif field.type == FieldDescriptor.TYPE_BYTES:
                kinds[field.number] = _BYTES
            elif field.is_repeated:
                kinds[field.number] = _UNKNOWN
            elif field.type in _VARINTS:
                kinds[field.number] = _VARINT
            elif field.type in _FIXED64S:
                kinds[field.number] = _FIXED64
            elif field.type in _FIXED32S:
                kinds[field.number] = _FIXED32
        rows.append(bytes(kinds))
    return tuple(rows), index


def _configure() -> bool:
    if _request_check is None:
        return False
    rows, index = schema_table(ExportTraceServiceRequest.DESCRIPTOR)
    fields = Span.DESCRIPTOR.fields_by_name
    _request_check.configure(
        rows,
        index[Span.DESCRIPTOR.full_name],
        fields["trace_id"].number,
        fields["span_id"].number,
        fields["parent_span_id"].number,
        index[KeyValue.DESCRIPTOR.full_name],
        KeyValue.DESCRIPTOR.fields_by_name["key"].number,
        index[ResourceSpans.DESCRIPTOR.full_name],
        ResourceSpans.DESCRIPTOR.fields_by_name["resource"].number,
        size_caps.MAX_KEY_BYTES,
        size_caps.MAX_ATTRIBUTE_BYTES,
        size_caps.MAX_RESOURCE_BYTES,
        size_caps.MAX_RESOURCE_COPY_BYTES,
    )
    return True


_CONFIGURED = _configure()


def available() -> bool:
    """Whether bodies go through the compiled check (built, not turned off)."""
    return _CONFIGURED and os.environ.get("LIGHTNING_OTEL_PURE_PYTHON") != "1"


def span_count(body: bytes | memoryview) -> int | None:
    """Spans in a well-formed export body whose spans all have valid ids; None: parse it with upb."""
    return _request_check.span_count(body) if available() else None
