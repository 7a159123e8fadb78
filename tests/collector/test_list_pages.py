"""Live Parquet files whose token/logprob columns list_pages writes: read back equal by pyarrow and
DuckDB, compacted together with files pyarrow wrote alone, and the footer codec exact."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_otel.collector import connect, list_pages, thrift_compact
from lightning_otel.collector.compaction import compact_files
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import LIST_COLUMNS, LIVE_WRITE_OPTIONS, Store

START_US = 1_700_000_000_000_000  # one hour for every row


def _token_rows(rng: random.Random, rows: int) -> dict[str, list]:
    """Per column, rows of every shape: null, empty, one value, short, long (several pages)."""
    shapes = [None, None, [], 1, 7, 3000, [], 2]
    out: dict[str, list] = {column: [] for column in LIST_COLUMNS}
    for row in range(rows):
        for column in LIST_COLUMNS:
            shape = shapes[(row + LIST_COLUMNS.index(column)) % len(shapes)]
            if isinstance(shape, int):
                make = (
                    (lambda: -rng.random() * 5) if column == "completion_logprobs" else (lambda: rng.randrange(2**31))
                )
                shape = [make() for _ in range(shape)]
            out[column].append(shape)
    return out


def _table(rows: int, seed: int, prefix: str) -> pa.Table:
    rng = random.Random(seed)
    tokens = _token_rows(rng, rows)
    columns = {
        "trace_id": pa.array([f"{prefix}{i:030d}" for i in range(rows)]),
        "span_id": pa.array([f"{i:016x}" for i in range(rows)]),
        "name": pa.array([f"span {i}" for i in range(rows)]),
        "start_time": pa.array([START_US + i for i in range(rows)], SPANS_SCHEMA.field("start_time").type),
        "service_name": pa.array(["svc"] * rows),
        **{column: pa.array(values, SPANS_SCHEMA.field(column).type) for column, values in tokens.items()},
    }
    return pa.table(
        [columns.get(f.name, pa.nulls(rows, f.type)) for f in SPANS_SCHEMA],
        schema=SPANS_SCHEMA,
    )


def _write(table: pa.Table, path) -> None:
    parts = list_pages.encode(table, LIST_COLUMNS, **LIVE_WRITE_OPTIONS)
    assert parts is not None
    with open(path, "wb") as handle:
        for part in parts:
            handle.write(part)


def _with_sliced_values(table: pa.Table) -> pa.Table:
    """The same rows, the token columns' value arrays slices of larger ones (a nonzero child offset)."""
    for column in LIST_COLUMNS:
        lists = table.column(column).combine_chunks()
        junk = pa.array([0] * 5, lists.type.value_type)
        values = pa.concat_arrays([junk, lists.values]).slice(5)
        rebuilt = pa.ListArray.from_arrays(lists.offsets, values, type=lists.type, mask=lists.is_null())
        table = table.set_column(table.schema.get_field_index(column), table.schema.field(column), rebuilt)
    return table


def _sizes_add_up(path) -> bool:
    """The row group's total sizes are its columns' sums (as pyarrow writes them)."""
    data = Path(path).read_bytes()
    footer, _ = thrift_compact.read_struct(data[-8 - int.from_bytes(data[-8:-4], "little") : -8])
    row_group = footer[4][1][1][0]
    meta = pq.ParquetFile(path).metadata.row_group(0)
    columns = [meta.column(i) for i in range(meta.num_columns)]
    return meta.total_byte_size == sum(c.total_uncompressed_size for c in columns) and row_group[6][1] == sum(
        c.total_compressed_size for c in columns
    )


def _written_by_list_pages(path) -> bool:
    """list_pages puts its pages after every page pyarrow wrote."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    offsets = {
        meta.column(i).path_in_schema.split(".")[0]: meta.column(i).data_page_offset for i in range(meta.num_columns)
    }
    return min(offsets[c] for c in LIST_COLUMNS) > max(v for k, v in offsets.items() if k not in LIST_COLUMNS)


@pytest.mark.parametrize("page_bytes", [list_pages.PAGE_BYTES, 1000])
def test_file_reads_back_equal_in_pyarrow_and_duckdb(tmp_path, monkeypatch, page_bytes):
    monkeypatch.setattr(list_pages, "PAGE_BYTES", page_bytes)  # 1000: many pages per column
    whole = _table(60, seed=1, prefix="a")
    # several chunks, sliced out of larger arrays (Arrow offsets that do not start at 0)
    table = pa.concat_tables([whole.slice(0, 13), whole.slice(13, 1), _with_sliced_values(whole.slice(14))])
    path = tmp_path / "f.parquet"
    _write(table, path)
    assert _written_by_list_pages(path) and _sizes_add_up(path)
    back = pq.read_table(path, schema=SPANS_SCHEMA)
    for column in SPANS_SCHEMA.names:
        assert back.column(column).to_pylist() == whole.column(column).to_pylist(), column
    con = duckdb.connect()
    for column in LIST_COLUMNS:
        got = con.execute(f"SELECT {column} FROM read_parquet('{path}') ORDER BY span_id").fetchall()
        assert [row[0] for row in got] == whole.column(column).to_pylist(), column


def test_segment_files_compact_with_files_pyarrow_wrote(tmp_path):
    store = Store(tmp_path / "data")
    new, old = _table(40, seed=2, prefix="n"), _table(30, seed=3, prefix="o")
    [new_path] = store.write_segment("0001", new)
    assert _written_by_list_pages(new_path)
    old_path = new_path.replace("part-0001", "part-0000")
    store.write(old, old_path, LIVE_WRITE_OPTIONS)  # as every live file was written before list_pages
    assert not _written_by_list_pages(old_path)
    expected = {row["trace_id"]: {c: row[c] for c in LIST_COLUMNS} for row in pa.concat_tables([new, old]).to_pylist()}

    def rows_of(relation) -> dict:
        return {r["trace_id"]: {c: r[c] for c in LIST_COLUMNS} for r in relation.to_pylist()}

    view = connect(store.uri).execute(f"SELECT trace_id, {', '.join(LIST_COLUMNS)} FROM spans").fetchall()
    assert {r[0]: dict(zip(LIST_COLUMNS, r[1:])) for r in view} == expected
    compacted = compact_files(store.uri, [new_path, old_path], new_path.rsplit("/", 1)[0])
    # compaction writes through pyarrow (row groups and Bloom filters for lookups: test_store_pruning.py)
    assert not _written_by_list_pages(compacted)
    assert rows_of(pq.read_table(compacted, schema=SPANS_SCHEMA)) == expected
    codecs = pq.ParquetFile(compacted).metadata.row_group(0)
    codecs = {codecs.column(i).path_in_schema: codecs.column(i).compression for i in range(codecs.num_columns)}
    assert codecs["name"] == "ZSTD" and codecs["prompt_token_ids.list.element"] == "UNCOMPRESSED"


def test_object_store_path_writes_the_same_file(tmp_path):
    """A store given as a URI writes through a pyarrow output stream, not the local rename path."""
    store = Store(f"file://{tmp_path}/data")
    assert not store.is_local
    table = _table(25, seed=6, prefix="u")
    # an object store needs no directories; pyarrow's local file system under a URI does
    store.fs.create_dir(store.partition_dir("svc", START_US // 3_600_000_000))
    [path] = store.write_segment("0003", table)
    assert _written_by_list_pages(path)
    assert pq.read_table(path, schema=SPANS_SCHEMA).to_pylist() == table.to_pylist()


def test_rows_it_does_not_write_go_to_pyarrow(tmp_path):
    table = _table(10, seed=4, prefix="x")
    index = SPANS_SCHEMA.get_field_index("prompt_token_ids")
    with_null_element = pa.array([[1, None, 3]] * 10, SPANS_SCHEMA.field("prompt_token_ids").type)
    table = table.set_column(index, SPANS_SCHEMA.field("prompt_token_ids"), with_null_element)
    assert list_pages.encode(table, LIST_COLUMNS, **LIVE_WRITE_OPTIONS) is None
    store = Store(tmp_path / "data")
    [path] = store.write_segment("0002", table)
    assert pq.read_table(path, schema=SPANS_SCHEMA).column("prompt_token_ids").to_pylist() == [[1, None, 3]] * 10


def test_footer_codec_round_trips_pyarrow_footers_byte_for_byte(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(20, seed=5, prefix="f"), path, **LIVE_WRITE_OPTIONS)
    data = path.read_bytes()
    size = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - size : -8]
    fields, end = thrift_compact.read_struct(footer)
    assert end == len(footer)
    assert fields[3] == (thrift_compact.I64, 20)  # FileMetaData.num_rows
    assert bytes(thrift_compact.write_struct(fields)) == footer
    with pytest.raises(thrift_compact.ThriftError):
        thrift_compact.read_struct(footer[: len(footer) // 2])


@pytest.mark.parametrize("page_bytes", [list_pages.PAGE_BYTES, 4096])
def test_pages_follow_page_bytes_not_the_chunking(monkeypatch, page_bytes):
    """2,000 one-row chunks (one-span exports) make a few pages, not one per chunk (issue 37)."""
    monkeypatch.setattr(list_pages, "PAGE_BYTES", page_bytes)  # 4096: the runs of small chunks path
    rows = [[row, -row, 2**31 - 1] for row in range(2_000)]
    one_row_chunks = pa.chunked_array([pa.array([r], pa.list_(pa.int32())) for r in rows])
    table = pa.table({"x": one_row_chunks})
    parts = list_pages.encode(table, ["x"])
    pages = (len(parts) - 1 - 3) // 4  # pyarrow's part, then per page: header, rep, def, values; footer
    assert pages <= 2_000 * 3 * 4 // page_bytes + 2
    path = pa.BufferOutputStream()
    for part in parts:
        path.write(part)
    assert pq.read_table(pa.BufferReader(path.getvalue())).column("x").to_pylist() == rows
