"""Live Parquet files with their token and logprob list columns written as pages directly.

pyarrow's writer spends most of a training span's conversion on these columns (BENCHMARKS.md, issue
16): it makes a repetition and a definition level for every element and run-length encodes them one
at a time, 5,120 elements per span of payload (b). Here the levels are run-length encoded per row
from the list offsets (a row of n values is at most three runs) and the values go to the file
straight from the Arrow buffer: PLAIN, uncompressed, as the store writes these columns anyway.
pyarrow writes the file with those columns null; its footer is then edited (thrift_compact) to
point at the pages written here, after its own. Readers see an ordinary file: data page v1, PLAIN
values, RLE levels, one row group.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from lightning_otel.collector import thrift_compact as tc

PAGE_BYTES = 1 << 20  # values per data page, about; pages end at row boundaries
_PLAIN, _RLE, _DATA_PAGE, _UNCOMPRESSED = 0, 3, 0, 0
_MAGIC = b"PAR1"


def _run(value: int, count: int) -> bytes:
    """One RLE run of the hybrid encoding, for levels of at most 8 bits."""
    return tc.varint(count << 1) + bytes((value,))


class _Page:
    __slots__ = ("levels", "parts")

    def __init__(self, levels: int, parts: list) -> None:
        self.levels, self.parts = levels, parts


def _levels_section(runs: bytes) -> bytes:
    return len(runs).to_bytes(4, "little") + runs


def _rep_runs(lengths: list[int], cache: dict[int, bytes]) -> bytes:
    """Repetition levels: each row starts with 0, then n - 1 ones."""
    out = []
    for n in lengths:
        piece = cache.get(n)
        if piece is None:
            piece = cache[n] = _run(0, 1) + (_run(1, n - 1) if n > 1 else b"")
        out.append(piece)
    return b"".join(out)


def _def_runs(lengths: list[int], valid: list[bool] | None, full: int, empty: int) -> bytes:
    """Definition levels: `full` per value, `empty` for an empty list, 0 for a null one (valid None: no nulls)."""
    if valid is None and all(lengths):
        return _run(full, sum(lengths))
    runs: list[list[int]] = []
    for n, ok in zip(lengths, valid or [True] * len(lengths)):
        value, count = (full, n) if ok and n else ((empty if ok else 0), 1)
        if runs and runs[-1][0] == value:
            runs[-1][1] += count
        else:
            runs.append([value, count])
    return b"".join(_run(value, count) for value, count in runs)


def _chunk_pages(array: pa.ListArray, full: int, empty: int, cache: dict[int, bytes]) -> list[_Page] | None:
    """Data pages for one Arrow chunk, or None if it holds what this writer does not (null elements,
    a null row that still spans values)."""
    rows = len(array)
    if rows == 0:
        return []
    child = array.values
    if child.null_count:
        return None
    width = child.type.bit_width // 8
    offsets = memoryview(array.buffers()[1]).cast("B")[array.offset * 4 : (array.offset + rows + 1) * 4]
    offsets = offsets.cast("i").tolist()  # Arrow buffers are in native byte order
    lengths = [end - start for start, end in zip(offsets, offsets[1:])]
    valid = array.is_valid().to_pylist() if array.null_count else None
    if valid is not None and any(n for n, ok in zip(lengths, valid) if not ok):
        return None
    data = memoryview(child.buffers()[1]).cast("B")
    base = child.offset
    per_page = max(1, PAGE_BYTES // width)
    pages, start = [], 0
    while start < rows:
        end = min(max(bisect.bisect_right(offsets, offsets[start] + per_page) - 1, start + 1), rows)
        page_lengths = lengths[start:end]
        page_valid = None if valid is None else valid[start:end]
        values = data[(base + offsets[start]) * width : (base + offsets[end]) * width]
        rep = _levels_section(_rep_runs(page_lengths, cache))
        dfn = _levels_section(_def_runs(page_lengths, page_valid, full, empty))
        levels = sum(page_lengths) + page_lengths.count(0)
        pages.append(_Page(levels, [rep, dfn, values]))
        start = end
    return pages


def _page_header(page: _Page) -> bytes:
    size = sum(len(part) for part in page.parts)
    data_header = {1: (tc.I32, page.levels), 2: (tc.I32, _PLAIN), 3: (tc.I32, _RLE), 4: (tc.I32, _RLE)}
    header = {1: (tc.I32, _DATA_PAGE), 2: (tc.I32, size), 3: (tc.I32, size), 5: (tc.STRUCT, data_header)}
    return bytes(tc.write_struct(header))


def _column_pages(column: pa.ChunkedArray, field: pa.Field) -> list[_Page] | None:
    dtype = field.type
    if not pa.types.is_list(dtype) or not (
        pa.types.is_integer(dtype.value_type) or pa.types.is_floating(dtype.value_type)
    ):
        return None
    empty = int(field.nullable)
    full = empty + 1 + int(dtype.value_field.nullable)
    cache: dict[int, bytes] = {}
    pages: list[_Page] = []
    for chunk in column.chunks:
        chunk_pages = _chunk_pages(chunk, full, empty, cache)
        if chunk_pages is None:
            return None
        pages += chunk_pages
    return pages


def encode(table: pa.Table, columns: Sequence[str], **write_options) -> list | None:
    """The bytes of a Parquet file of `table`, as a list of buffers to write in order, with
    `columns` (flat-list columns) written here and the rest by pyarrow with `write_options`.
    None when a column holds what this writer does not, or pyarrow's footer is not one it can edit
    (not one row group): then write the table with pyarrow alone."""
    pages = {}
    for name in columns:
        column_pages = _column_pages(table.column(name), table.schema.field(name))
        if column_pages is None:
            return None
        pages[name] = column_pages
    placeholders = table
    for name in columns:
        index = placeholders.schema.get_field_index(name)
        placeholders = placeholders.set_column(
            index, table.schema.field(name), pa.nulls(len(table), table.schema.field(name).type)
        )
    sink = pa.BufferOutputStream()
    pq.write_table(placeholders, sink, row_group_size=max(1, len(table)), **write_options)
    written = sink.getvalue()
    footer_size = int.from_bytes(written[-8:-4].to_pybytes(), "little")
    data_end = len(written) - 8 - footer_size
    try:
        footer, _ = tc.read_struct(written[data_end:-8].to_pybytes())
    except tc.ThriftError:
        return None  # not a footer this module can edit: pyarrow writes the whole file instead
    row_groups = footer[4][1][1]
    if len(row_groups) != 1:
        return None
    row_group = row_groups[0]
    chunks = row_group[1][1][1]
    paths = [".".join(p.decode() for p in chunk[3][1][3][1][1]) for chunk in chunks]
    parts: list = [memoryview(written)[:data_end]]
    offset = data_end
    for name, column_pages in pages.items():
        index = next(i for i, path in enumerate(paths) if path.split(".")[0] == name)
        chunk = chunks[index]
        old = chunk[3][1]
        start = offset
        for page in column_pages:
            header = _page_header(page)
            parts.append(header)
            parts += page.parts
            offset += len(header) + sum(len(part) for part in page.parts)
        size = offset - start
        new = {
            1: old[1],
            2: (tc.LIST, (tc.I32, [_PLAIN, _RLE])),
            3: old[3],
            4: (tc.I32, _UNCOMPRESSED),
            5: (tc.I64, sum(page.levels for page in column_pages)),
            6: (tc.I64, size),
            7: (tc.I64, size),
            9: (tc.I64, start),
        }
        row_group[2] = (tc.I64, row_group[2][1] + size - old[6][1])
        if 6 in row_group:
            row_group[6] = (tc.I64, row_group[6][1] + size - old[7][1])
        if index == 0 and 5 in row_group:
            row_group[5] = (tc.I64, start)
        chunks[index] = {k: v for k, v in chunk.items() if k in (1, 2)} | {3: (tc.STRUCT, new)}
    new_footer = bytes(tc.write_struct(footer))
    parts += [new_footer, len(new_footer).to_bytes(4, "little"), _MAGIC]
    return parts
