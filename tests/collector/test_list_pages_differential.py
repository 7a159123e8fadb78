"""list_pages against pyarrow over random tables: whatever the chunking (sliced, many one-row chunks,
empty), nulls, empty lists and extreme values, a file Store.write makes reads back, in pyarrow and in
DuckDB, as exactly the table given; tables it does not handle go to pyarrow whole and are counted."""

from __future__ import annotations

import math
import os
import random
import struct
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_otel.collector import list_pages, thrift_compact
from lightning_otel.collector.store import Store

INT32_EXTREMES = [-(2**31), 2**31 - 1, 0, -1, 1]
FLOAT_EXTREMES = [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, -1.7976931348623157e308, 2.2250738585072014e-308]
# (name, field): nullable lists, a required list, a list of required floats
FIELDS = [
    pa.field("ids", pa.list_(pa.int32())),
    pa.field("logprobs", pa.list_(pa.float64())),
    pa.field("ids_required", pa.list_(pa.int32()), nullable=False),
    pa.field("floats_items_required", pa.list_(pa.field("item", pa.float64(), nullable=False))),
]
OPTIONS = [
    {},
    {"compression": "zstd"},
    {"use_dictionary": False, "write_statistics": False},
    {"data_page_version": "2.0"},
]


def _canonical(value):
    """Python values comparable with ==, NaN equal to itself and -0.0 apart from 0.0."""
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float):
        return "nan" if math.isnan(value) else struct.pack("<d", value)
    return value


def _row(rng: random.Random, field: pa.Field):
    if field.nullable and rng.random() < 0.15:
        return None
    length = rng.choice([0, 0, 1, 2, 3, 7, rng.randrange(50), rng.randrange(600)])
    if pa.types.is_integer(field.type.value_type):
        return [
            rng.choice(INT32_EXTREMES) if rng.random() < 0.3 else rng.randrange(-(2**31), 2**31) for _ in range(length)
        ]
    return [rng.choice(FLOAT_EXTREMES) if rng.random() < 0.3 else rng.uniform(-1e6, 1e6) for _ in range(length)]


def _chunk(rng: random.Random, values: list, field: pa.Field) -> pa.Array:
    """One chunk of these rows: built plainly, sliced out of a larger array, or with its child
    values sliced out of a larger one (Arrow offsets that do not start at 0)."""
    how = rng.choice(["plain", "sliced", "child offset"])
    if how == "plain" or not values:
        return pa.array(values, field.type)
    if how == "sliced":
        padded = pa.array([[]] * 3 + values + [[1, 2]], field.type)
        return padded.slice(3, len(values))
    lists = pa.array(values, field.type)
    junk = pa.array([0] * 5, field.type.value_type)
    child = pa.concat_arrays([junk, lists.values.cast(field.type.value_type)]).slice(5)
    mask = lists.is_null() if lists.null_count else None
    return pa.ListArray.from_arrays(lists.offsets, child, type=field.type, mask=mask)


def _random_table(seed: int) -> pa.Table:
    rng = random.Random(seed)
    rows = (
        0 if seed == 0 else rng.choice([1, 2, rng.randrange(3, 40), rng.randrange(40, 300), rng.randrange(300, 1500)])
    )
    columns = {"k": pa.chunked_array([pa.array(range(rows), pa.int64())])}
    for field in FIELDS:
        values = [_row(rng, field) for _ in range(rows)]
        chunks, start = [], 0
        while start < rows:
            # many one-row chunks (one-span exports), some empty ones, some long
            size = rng.choice([0, 1, 1, 1, 2, rng.randrange(1, 80)])
            chunks.append(_chunk(rng, values[start : start + size], field))
            start += size
        columns[field.name] = pa.chunked_array(chunks, field.type)
    schema = pa.schema([pa.field("k", pa.int64()), *FIELDS])
    return pa.table(list(columns.values()), schema=schema)


def _read_back_both(path) -> tuple[dict, dict]:
    names = [field.name for field in FIELDS]
    by_pyarrow = pq.read_table(path).sort_by("k")
    from_arrow = {name: _canonical(by_pyarrow.column(name).to_pylist()) for name in names}
    got = duckdb.connect().execute(f"SELECT {', '.join(names)} FROM read_parquet('{path}') ORDER BY k").fetchall()
    from_duckdb = {name: _canonical([row[i] for row in got]) for i, name in enumerate(names)}
    return from_arrow, from_duckdb


@pytest.mark.parametrize("seed", range(16))
def test_random_tables_read_back_exactly(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(list_pages, "PAGE_BYTES", random.Random(seed).choice([64, 1000, list_pages.PAGE_BYTES]))
    table = _random_table(seed)
    options = OPTIONS[seed % len(OPTIONS)]
    names = [field.name for field in FIELDS]
    before = list_pages.fallback_counts()
    assert list_pages.encode(table, names, **options) is not None  # the list-page writer, not a fallback
    path = f"{tmp_path}/spans/f.parquet"
    Store(tmp_path).write(table, path, options, names)
    assert list_pages.fallback_counts() == before
    expected = {name: _canonical(table.column(name).to_pylist()) for name in names}
    from_arrow, from_duckdb = _read_back_both(path)
    assert from_arrow == expected
    assert from_duckdb == expected
    assert pq.read_table(path).schema.field("ids_required").nullable is False


def _one_column(array: pa.Array, nullable: bool = True) -> pa.Table:
    return pa.table({"k": pa.array(range(len(array)), pa.int64()), "x": array}).cast(
        pa.schema([pa.field("k", pa.int64()), pa.field("x", array.type, nullable=nullable)])
    )


def _null_row_with_values() -> pa.Array:
    # row 0 null yet spanning two values: valid Arrow, not something list_pages writes
    return pa.ListArray.from_buffers(
        pa.list_(pa.int32()),
        2,
        [pa.py_buffer(bytes([0b10])), pa.array([0, 2, 3], pa.int32()).buffers()[1]],
        1,
        0,
        [pa.array([7, 8, 9], pa.int32())],
    )


ODD = {
    "int16 elements": (lambda: pa.array([[1, -(2**15)], None, [], [2**15 - 1]], pa.list_(pa.int16())), "element type"),
    "int64 elements": (lambda: pa.array([[2**40], [], None], pa.list_(pa.int64())), "element type"),
    "float32 elements": (lambda: pa.array([[1.5, -0.0], None], pa.list_(pa.float32())), "element type"),
    "large list": (lambda: pa.array([[1, 2], [], None], pa.large_list(pa.int32())), "element type"),
    "null elements": (lambda: pa.array([[1, None, 3], []], pa.list_(pa.int32())), "null elements"),
    "null row with values": (_null_row_with_values, "null row with values"),
}


@pytest.mark.parametrize("case", ODD)
def test_what_it_does_not_write_goes_to_pyarrow_counted(tmp_path, case):
    make, reason = ODD[case]
    table = _one_column(make())
    before = list_pages.fallback_counts().get(reason, 0)
    path = f"{tmp_path}/spans/f.parquet"
    Store(tmp_path).write(table, path, {}, ["x"])
    assert list_pages.fallback_counts()[reason] == before + 1
    expected = table.column("x").to_pylist()
    assert pq.read_table(path).column("x").to_pylist() == expected
    got = duckdb.connect().execute(f"SELECT x FROM read_parquet('{path}') ORDER BY k").fetchall()
    assert [row[0] for row in got] == expected


@pytest.mark.parametrize(("validity", "expected"), [(None, [[]]), (0b101, [[], None, []])])
def test_empty_lists_without_a_values_buffer(tmp_path, validity, expected):
    """`[[]]` from buffers: the child has no data buffer at all (nothing to point at)."""
    child = pa.Array.from_buffers(pa.int32(), 0, [None, None])
    offsets = pa.array([0] * (len(expected) + 1), pa.int32()).buffers()[1]
    bitmap = None if validity is None else pa.py_buffer(bytes([validity]))
    lists = pa.ListArray.from_buffers(pa.list_(pa.int32()), len(expected), [bitmap, offsets], children=[child])
    assert lists.values.buffers()[1] is None and lists.to_pylist() == expected
    table = _one_column(lists)  # one chunk, as a segment of one export: no concatenation makes buffers
    assert list_pages.encode(table, ["x"]) is not None
    path = f"{tmp_path}/spans/f.parquet"
    Store(tmp_path).write(table, path, {}, ["x"])
    assert pq.read_table(path).column("x").to_pylist() == expected
    got = duckdb.connect().execute(f"SELECT x FROM read_parquet('{path}') ORDER BY k").fetchall()
    assert [row[0] for row in got] == expected


def _truncated(footer: bytes) -> bytes:
    return footer[: len(footer) // 2]


def _without_row_groups(footer: bytes) -> bytes:
    fields, _ = thrift_compact.read_struct(footer)
    del fields[4]  # FileMetaData.row_groups: a footer laid out otherwise
    return bytes(thrift_compact.write_struct(fields))


@pytest.mark.parametrize("edit", [_truncated, _without_row_groups])
def test_footer_it_cannot_edit_goes_to_pyarrow_counted(tmp_path, monkeypatch, edit):
    real_write_table = pq.write_table

    def write_with_odd_footer(table, sink, **options):
        scratch = pa.BufferOutputStream()
        real_write_table(table, scratch, **options)
        data = scratch.getvalue().to_pybytes()
        size = int.from_bytes(data[-8:-4], "little")
        footer = edit(data[-8 - size : -8])
        sink.write(data[: -8 - size] + footer + len(footer).to_bytes(4, "little") + b"PAR1")

    monkeypatch.setattr(list_pages, "pq", SimpleNamespace(write_table=write_with_odd_footer))
    table = _random_table(3)
    names = [field.name for field in FIELDS]
    before = list_pages.fallback_counts().get("footer not editable", 0)
    assert list_pages.encode(table, names) is None
    path = f"{tmp_path}/spans/f.parquet"
    Store(tmp_path).write(table, path, {}, names)  # the store's own pyarrow writes it whole
    assert list_pages.fallback_counts()["footer not editable"] == before + 2
    expected = {name: _canonical(table.column(name).to_pylist()) for name in names}
    assert _read_back_both(path) == (expected, expected)


def test_short_writes_resume_mid_buffer(tmp_path, monkeypatch):
    """os.writev may write less than asked: the file is still every buffer in order."""
    real_writev = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, views: real_writev(fd, [bytes(views[0])[:7]]))
    table = _random_table(5)
    names = [field.name for field in FIELDS]
    path = f"{tmp_path}/spans/f.parquet"
    Store(tmp_path).write(table, path, {}, names)
    expected = {name: _canonical(table.column(name).to_pylist()) for name in names}
    assert _read_back_both(path) == (expected, expected)
