"""OTLP/protobuf encoding of finished spans, written straight to bytes.

The OTLP exporter builds a protobuf message object per span, attribute and value and then
serializes them: ~100 us per LLM span here, on the agent's own CPU (BENCHMARKS.md). This module
writes the same `ExportTraceServiceRequest` wire bytes directly, caching what repeats from span to
span (attribute keys, short values with their keys; the resource and scope are encoded once per
batch): a fraction of that. It follows opentelemetry-exporter-otlp-proto-common's `encode_spans`
field by field (grouping by resource and scope, span flags, status, dropped counts, an attribute it
cannot encode logged and left out), and tests/instrument/test_otlp_encoding.py checks that the two write the
same bytes. Standard library only.

Spans of the common shape (a plain attribute dict of scalar values, no events or links: every lean
LLM span) go through the compiled `_otlp_span` when it is built (~10x faster; same bytes, tested
through both paths); LIGHTNING_OTEL_PURE_PYTHON=1 turns it off.

Wire format: https://protobuf.dev/programming-guides/encoding/ ; the message layout is
opentelemetry/proto/trace/v1/trace.proto and common/v1/common.proto.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

try:  # the compiled encoder of the common span shape (_otlp_span.c); this module stays the reference
    from lightning_otel.instrumentation import _otlp_span as _compiled
except ImportError:  # built without a compiler: this module encodes every span
    _compiled = None  # type: ignore[assignment]  # None: not built or turned off, the Python encoder runs
if os.environ.get("LIGHTNING_OTEL_PURE_PYTHON") == "1":
    _compiled = None  # type: ignore[assignment]  # None: not built or turned off, the Python encoder runs

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # Span.flags (field 16): "is_remote is known", false
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)  # ... and the parent is remote
_MAX_CACHED_KEYS = 10_000  # flattened message keys (llm.input_messages.N...) grow with N: bound the cache


def _varint_uncached(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint_uncached(n) for n in range(1 << 14)]  # lengths of almost every field here


def _varint(n: int) -> bytes:
    return _SMALL[n] if n < 16384 else _varint_uncached(n)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: tag byte(s) already encoded by the caller's constant."""
    return bytes((tag,)) + _varint(len(payload)) + payload


# AnyValue fields: string 1, bool 2, int 3, double 4, array 5, kvlist 6, bytes 7.
def _any_value(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        data = value.encode()
        return b"\x0a" + _varint(len(data)) + data
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        return b"\x18" + _int64(value)
    if kind is float:
        return b"\x21" + _pack_double(value)
    if kind is bytes:
        return b"\x3a" + _varint(len(value)) + value
    return _any_value_other(value)


def _any_value_other(value: Any) -> bytes:
    """Subclasses and containers, in encode_spans' order of checks."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _any_value(str(value))
    if isinstance(value, int):
        return b"\x18" + _int64(int(value))
    if isinstance(value, float):
        return b"\x21" + _pack_double(float(value))
    if isinstance(value, bytes):
        return _any_value(bytes(value))
    if isinstance(value, Sequence):
        return _field(0x2A, b"".join(_field(0x0A, _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(0x32, b"".join(_field(0x0A, _key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _int64(value: int) -> bytes:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"Value out of range: {value}")
    return _varint(value) if value >= 0 else _varint_uncached(value + (1 << 64))


_key_prefixes: dict[str, bytes] = {}
_COPY_LIMIT = 1024  # longer encoded values stay a part of their own until their span is joined (one copy fewer)
_SHORT = 64  # string values up to this many characters are remembered encoded, with their key
_repeated_fields: dict[tuple[int, str, str], bytes] = {}


def _key_prefix(key: str) -> bytes:
    """KeyValue field 1 (the key), encoded once per distinct key."""
    data = key.encode()
    prefix = b"\x0a" + _varint(len(data)) + data if data else b""
    if len(_key_prefixes) >= _MAX_CACHED_KEYS:
        _key_prefixes.clear()
    _key_prefixes[key] = prefix
    return prefix


def _key_value(key: str, value: Any) -> bytes:
    """A KeyValue message's body: key (field 1), value (field 2, always present)."""
    prefix = _key_prefixes.get(key)
    if prefix is None:
        prefix = _key_prefix(key)
    value_bytes = _any_value(value)
    return prefix + b"\x12" + _varint(len(value_bytes)) + value_bytes


def _attributes(tag: int, attributes: Mapping[str, Any] | None) -> list[bytes]:
    """Repeated KeyValue fields, as parts to join (a long value is a part of its own, not copied
    into its field); an attribute that cannot be encoded is logged and left out. The common value
    types are inlined: this loop is most of the encoding time."""
    fields: list[bytes] = []
    if not attributes:
        return fields
    head, small, append, repeated = bytes((tag,)), _SMALL, fields.append, _repeated_fields
    for key, value in attributes.items():
        kind = type(value)
        short = kind is str and len(value) <= _SHORT
        if short:  # model names, roles, ids, parameters: the same (key, value) span after span
            known = repeated.get((tag, key, value))
            if known is not None:
                append(known)
                continue
        try:
            prefix = _key_prefixes.get(key)
            if prefix is None:
                prefix = _key_prefix(key)
            if kind is str:
                data = value.encode()
                n = len(data)
                value_bytes = b"\x0a" + (small[n] if n < 16384 else _varint_uncached(n)) + data
            elif kind is int and 0 <= value < 16384:
                value_bytes = b"\x18" + small[value]
            elif kind is bytes:
                n = len(value)
                value_bytes = b"\x3a" + (small[n] if n < 16384 else _varint_uncached(n)) + value
            else:
                value_bytes = _any_value(value)
        except Exception as error:
            log.exception("Failed to encode key %s: %s", key, error)
            continue
        n = len(value_bytes)
        if n > _COPY_LIMIT:  # a prompt or packed token ids: not copied into its field
            body_head = prefix + b"\x12" + _varint(n)
            append(head + _varint(len(body_head) + n) + body_head)
            append(value_bytes)
            continue
        body = prefix + b"\x12" + small[n] + value_bytes
        n = len(body)
        field = head + (small[n] if n < 16384 else _varint_uncached(n)) + body
        append(field)
        if short:
            if len(repeated) >= _MAX_CACHED_KEYS:
                repeated.clear()
            repeated[(tag, key, value)] = field
    return fields


def _count(tag: int, n: int) -> bytes:
    return bytes((tag,)) + _varint(n) if n else b""


def _string(tag: int, text: str | None) -> bytes:
    return _field(tag, text.encode()) if text else b""


def _trace_state(state: Any) -> str | None:
    return ",".join(f"{key}={value}" for key, value in state.items()) if state is not None else None


def _flags(parent: Any) -> bytes:
    return _FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL


def _event(event: Any) -> bytes:
    parts = [b"\x09" + _pack_fixed64(event.timestamp)] if event.timestamp else []
    parts.append(_string(0x12, event.name))
    parts.extend(_attributes(0x1A, event.attributes))
    parts.append(_count(0x20, event.dropped_attributes))
    return _field(0x5A, b"".join(parts))


def _link(link: Any) -> bytes:
    context = link.context
    parts = [_field(0x0A, context.trace_id.to_bytes(16, "big")), _field(0x12, context.span_id.to_bytes(8, "big"))]
    parts.extend(_attributes(0x22, link.attributes))
    parts.append(_count(0x28, link.dropped_attributes))
    parts.append(b"\x35" + struct.pack("<I", 0x300 if context.is_remote else 0x100))
    return _field(0x6A, b"".join(parts))


def _status(status: Any) -> bytes:
    if status is None:
        return b""
    return _field(0x7A, _string(0x12, status.description) + _count(0x18, status.status_code.value))


_KINDS: dict[Any, bytes] = {}


def _kind(kind: Any) -> bytes:
    encoded = _KINDS.get(kind)
    if encoded is None:
        encoded = _KINDS[kind] = b"\x30" + _varint(kind.value + 1)  # SDK INTERNAL=0 -> proto 1, ...
    return encoded


def encode_span(span: Any) -> bytes:
    """One `Span` message: field 2 of ScopeSpans, tag and length included."""
    if _compiled is not None:
        encoded = _compiled.span_bytes(span)  # None: a shape it leaves to the code below
        if encoded is not None:
            return encoded
    context = span.get_span_context()
    parent = span.parent
    parts = [
        b"",
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
        _string(0x1A, _trace_state(context.trace_state)),
    ]
    if parent:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts.append(_string(0x2A, span.name))
    parts.append(_kind(span.kind))
    if span.start_time:
        parts.append(b"\x39" + _pack_fixed64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _pack_fixed64(span.end_time))
    parts.extend(_attributes(0x4A, span.attributes))
    parts.append(_count(0x50, span.dropped_attributes))
    parts.extend(_event(event) for event in span.events or ())
    parts.append(_count(0x60, span.dropped_events))
    parts.extend(_link(link) for link in span.links or ())
    parts.append(_count(0x70, span.dropped_links))
    parts.append(_status(span.status))
    parts.append(_flags(parent))
    parts[0] = b"\x12" + _varint(sum(map(len, parts)))
    return b"".join(parts)  # while its parts are in the cache


def _resource(resource: Any) -> bytes:
    return _field(0x0A, b"".join(_attributes(0x0A, resource.attributes)))


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b"\x0a\x00"
    body = _string(0x0A, scope.name) + _string(0x12, scope.version) + b"".join(_attributes(0x1A, scope.attributes))
    return _field(0x0A, body)


class _Group:
    """Encoded spans of one (resource, scope) pair, by object identity: a batch holds few."""

    __slots__ = ("resource", "scope", "parts", "size")

    def __init__(self, resource: Any, scope: Any) -> None:
        self.resource, self.scope, self.size = resource, scope, 0
        self.parts: list[bytes] = []


def encode_request(spans: Sequence[Any]) -> bytes:
    """The serialized `ExportTraceServiceRequest` for these SDK `ReadableSpan`s. Encoded spans are
    joined once, at the end: a batch of LLM spans is megabytes, and every extra copy shows."""
    groups: dict[tuple[int, int], _Group] = {}
    for span in spans:
        scope = span.instrumentation_scope or None
        key = (id(span.resource), id(scope))
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(span.resource, scope)
        encoded = encode_span(span)
        group.parts.append(encoded)
        group.size += len(encoded)
    # Equal resources (and scopes) held as different objects share one entry, as in encode_spans.
    by_resource: dict[Any, dict[Any, list[_Group]]] = {}
    for group in groups.values():
        by_resource.setdefault(group.resource, {}).setdefault(group.scope, []).append(group)
    out: list[bytes] = []
    for resource, scopes in by_resource.items():
        resource_parts = [_resource(resource)]
        for scope, scope_groups in scopes.items():
            scope_head, schema = _scope(scope), _string(0x1A, scope.schema_url if scope else None)
            size = len(scope_head) + sum(group.size for group in scope_groups) + len(schema)
            resource_parts += (b"\x12" + _varint(size), scope_head)
            for group in scope_groups:
                resource_parts += group.parts
            resource_parts.append(schema)
        resource_parts.append(_string(0x1A, resource.schema_url))
        out.append(b"\x0a" + _varint(sum(map(len, resource_parts))))
        out += resource_parts
    return b"".join(out)
