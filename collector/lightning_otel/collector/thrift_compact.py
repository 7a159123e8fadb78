"""Thrift's compact protocol, as far as a Parquet footer and page header need it.

A struct parses to a dict {field id: (wire type, value)} that keeps every field it does not know
about, so a footer can be read, edited field by field and written back with nothing else changed.
Values: ints, floats, bytes, a nested dict for a struct, (element type, [values]) for a list or
set, (key type, value type, [(key, value)]) for a map; a bool field keeps its value in its type.
"""

from __future__ import annotations

BOOL_TRUE, BOOL_FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)
Struct = dict[int, tuple[int, object]]


class ThriftError(ValueError):
    """Bytes that are not a compact-protocol struct."""


def _varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ThriftError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise ThriftError("varint too long")


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(data: bytes | memoryview, pos: int, ttype: int) -> tuple[object, int]:
    if ttype in (I16, I32, I64):
        raw, pos = _varint(data, pos)
        return _unzigzag(raw), pos
    if ttype == BYTE:
        return data[pos], pos + 1
    if ttype == DOUBLE:
        return bytes(data[pos : pos + 8]), pos + 8
    if ttype == BINARY:
        size, pos = _varint(data, pos)
        if pos + size > len(data):
            raise ThriftError("truncated binary")
        return bytes(data[pos : pos + size]), pos + size
    if ttype in (LIST, SET):
        header = data[pos]
        pos += 1
        size, etype = header >> 4, header & 0x0F
        if size == 15:
            size, pos = _varint(data, pos)
        items: list[object] = []
        for _ in range(size):
            item: object
            if etype in (BOOL_TRUE, BOOL_FALSE):  # a bool element is one byte
                item, pos = data[pos], pos + 1
            else:
                item, pos = _value(data, pos, etype)
            items.append(item)
        return (etype, items), pos
    if ttype == MAP:
        size, pos = _varint(data, pos)
        if not size:
            return (0, 0, []), pos
        ktype, vtype = data[pos] >> 4, data[pos] & 0x0F
        pos += 1
        pairs = []
        for _ in range(size):
            key, pos = _value(data, pos, ktype)
            value, pos = _value(data, pos, vtype)
            pairs.append((key, value))
        return (ktype, vtype, pairs), pos
    if ttype == STRUCT:
        return read_struct(data, pos)
    raise ThriftError(f"unknown compact type {ttype}")


def read_struct(data: bytes | memoryview, pos: int = 0) -> tuple[Struct, int]:
    """The struct at `pos` and the position after it."""
    fields: Struct = {}
    last = 0
    while True:
        if pos >= len(data):
            raise ThriftError("truncated struct")
        header = data[pos]
        pos += 1
        if header == 0:
            return fields, pos
        ttype, delta = header & 0x0F, header >> 4
        if delta:
            fid = last + delta
        else:
            raw, pos = _varint(data, pos)
            fid = _unzigzag(raw)
        if ttype in (BOOL_TRUE, BOOL_FALSE):
            fields[fid] = (ttype, ttype == BOOL_TRUE)
        else:
            fields[fid] = (ttype, None)
            value, pos = _value(data, pos, ttype)
            fields[fid] = (ttype, value)
        last = fid


def _put_varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def varint(n: int) -> bytes:
    """An unsigned LEB128 varint (compact protocol; also Parquet's RLE run headers)."""
    out = bytearray()
    _put_varint(out, n)
    return bytes(out)


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _put_value(out: bytearray, ttype: int, value) -> None:
    if ttype in (I16, I32, I64):
        _put_varint(out, _zigzag(value))
    elif ttype == BYTE:
        out.append(value & 0xFF)
    elif ttype == DOUBLE:
        out += value
    elif ttype == BINARY:
        _put_varint(out, len(value))
        out += value
    elif ttype in (LIST, SET):
        etype, items = value
        if len(items) < 15:
            out.append(len(items) << 4 | etype)
        else:
            out.append(0xF0 | etype)
            _put_varint(out, len(items))
        for item in items:
            if etype in (BOOL_TRUE, BOOL_FALSE):
                out.append(item)
            else:
                _put_value(out, etype, item)
    elif ttype == MAP:
        ktype, vtype, pairs = value
        _put_varint(out, len(pairs))
        if pairs:
            out.append(ktype << 4 | vtype)
            for key, item in pairs:
                _put_value(out, ktype, key)
                _put_value(out, vtype, item)
    elif ttype == STRUCT:
        write_struct(value, out)
    else:
        raise ThriftError(f"unknown compact type {ttype}")


def write_struct(fields: Struct, out: bytearray | None = None) -> bytearray:
    """`fields` in the compact protocol, fields in id order, appended to `out`."""
    out = bytearray() if out is None else out
    last = 0
    for fid in sorted(fields):
        ttype, value = fields[fid]
        if ttype in (BOOL_TRUE, BOOL_FALSE):
            ttype = BOOL_TRUE if value else BOOL_FALSE
        if 0 < fid - last <= 15:
            out.append((fid - last) << 4 | ttype)
        else:
            out.append(ttype)
            _put_varint(out, _zigzag(fid))
        if ttype not in (BOOL_TRUE, BOOL_FALSE):
            _put_value(out, ttype, value)
        last = fid
    out.append(0)
    return out
