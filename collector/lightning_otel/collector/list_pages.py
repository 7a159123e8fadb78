"""Live Parquet files with their token and logprob list columns written as pages directly.

pyarrow's writer spends most of a training span's conversion on these columns (BENCHMARKS.md, issue
16): it makes a repetition and a definition level for every element and run-length encodes them one
at a time, 5,120 elements per span of payload (b). Here the levels are run-length encoded per row
from the list offsets (a row of n values is at most three runs) and the values go to the file
straight from the Arrow buffer: PLAIN, uncompressed, as the store writes these columns anyway.
pyarrow writes the file with those columns null; its footer is then edited (thrift_compact) to
point at the pages written here, after its own. Readers see an ordinary file: data page v1, PLAIN
values, RLE levels, one row group.

Pages follow PAGE_BYTES, not the table's chunking: a segment of one-span exports (SimpleSpanProcessor)
is thousands of one-row chunks, and a page per chunk per column made the file slower to write than
pyarrow's (issue 37). Whatever this writer does not handle (an element type other than int32 and
float64, null elements, a footer it cannot edit, a missing buffer) goes to pyarrow whole, and each
such fallback is counted (`fallback_counts`) and logged once per kind.
"""

from __future__ import annotations

import bisect
import logging
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lightning_otel.collector import thrift_compact as tc

PAGE_BYTES = 1 << 20  # values per data page, about; pages end at row boundaries
_PLAIN, _RLE, _DATA_PAGE, _UNCOMPRESSED = 0, 3, 0, 0
_MAGIC = b"PAR1"
# Arrow element types whose buffer is the Parquet PLAIN encoding byte for byte (little-endian): an
# int16 is stored as a Parquet INT32, so its 2-byte values would make a file no reader can read.
_PLAIN_TYPES = (pa.int32(), pa.float64())
_RUN_PAGES = 8

_log = logging.getLogger(__name__)
_fallbacks: Counter[str] = Counter()
_fallbacks_lock = threading.Lock()


def fallback_counts() -> dict[str, int]:
    """Files handed to pyarrow whole since the process started, by reason (for operators)."""
    with _fallbacks_lock:
        return dict(_fallbacks)


def _fall_back(reason: str, detail: str) -> None:
    with _fallbacks_lock:
        _fallbacks[reason] += 1
        first = _fallbacks[reason] == 1
    if first:  # once per kind: a steady stream of one shape must not flood the log
        _log.warning("list_pages: %s (%s); pyarrow writes such files whole (counted, logged once)", reason, detail)


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
        _fall_back("null elements", str(array.type))
        return None
    width = child.type.bit_width // 8
    offsets_buffer = array.buffers()[1]
    if offsets_buffer is None:
        _fall_back("missing buffer", "list offsets")
        return None
    offset_bytes = memoryview(offsets_buffer).cast("B")[array.offset * 4 : (array.offset + rows + 1) * 4]
    offsets = offset_bytes.cast("i").tolist()  # Arrow buffers are in native byte order
    lengths = [end - start for start, end in zip(offsets, offsets[1:])]
    valid = array.is_valid().to_pylist() if array.null_count else None
    if valid is not None and any(n for n, ok in zip(lengths, valid) if not ok):
        _fall_back("null row with values", str(array.type))
        return None
    data_buffer = child.buffers()[1]
    if data_buffer is None:
        if offsets[-1] > offsets[0]:
            _fall_back("missing buffer", "list values")
            return None
        data_buffer = b""  # only empty lists and nulls (`[[]]` from from_buffers has no values buffer)
    data = memoryview(data_buffer).cast("B")
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


def _value_bytes(chunk: pa.ListArray, width: int) -> int:
    if chunk.buffers()[1] is None:
        return PAGE_BYTES  # no offsets: goes alone, and _chunk_pages falls back
    offsets = chunk.offsets  # of this slice of the array: len(chunk) + 1 of them
    return (offsets[-1].as_py() - offsets[0].as_py()) * width


def _page_sized_chunks(column: pa.ChunkedArray, width: int) -> Iterator[pa.ListArray]:
    """The column's chunks, runs of small ones concatenated into about _RUN_PAGES pages of values
    each (one copy of those alone), so that pages follow PAGE_BYTES and not the exporter's batching
    (a run's last page is partial: runs of one page would make twice the pages). A chunk of
    PAGE_BYTES or more goes as it is: it fills its own pages."""
    if column.num_chunks > 1:
        values = pc.sum(pc.list_value_length(column)).as_py() or 0
        if values * width < PAGE_BYTES * column.num_chunks // 4:
            # mostly small chunks (one-span exports: thousands): one copy in C++ beats a Python
            # step per chunk, and pages then follow PAGE_BYTES over the whole column
            yield column.combine_chunks()
            return
    run: list[pa.ListArray] = []
    run_bytes = 0
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        size = _value_bytes(chunk, width)
        if size >= PAGE_BYTES:
            if run:
                yield run[0] if len(run) == 1 else pa.concat_arrays(run)
                run, run_bytes = [], 0
            yield chunk
            continue
        run.append(chunk)
        run_bytes += size
        if run_bytes >= PAGE_BYTES * _RUN_PAGES:
            yield run[0] if len(run) == 1 else pa.concat_arrays(run)
            run, run_bytes = [], 0
    if run:
        yield run[0] if len(run) == 1 else pa.concat_arrays(run)


def _column_pages(column: pa.ChunkedArray, field: pa.Field) -> list[_Page] | None:
    dtype = field.type
    if not pa.types.is_list(dtype) or dtype.value_type not in _PLAIN_TYPES:
        _fall_back("element type", str(dtype))
        return None
    if sys.byteorder != "little":
        _fall_back("byte order", sys.byteorder)  # Parquet PLAIN is little-endian; Arrow is native
        return None
    empty = int(field.nullable)
    full = empty + 1 + int(dtype.value_field.nullable)
    width = dtype.value_type.bit_width // 8
    cache: dict[int, bytes] = {}
    pages: list[_Page] = []
    for chunk in _page_sized_chunks(column, width):
        chunk_pages = _chunk_pages(chunk, full, empty, cache)
        if chunk_pages is None:
            return None
        pages += chunk_pages
    return pages


def encode(table: pa.Table, columns: Sequence[str], **write_options) -> list | None:
    """The bytes of a Parquet file of `table`, as a list of buffers to write in order, with
    `columns` (flat-list columns) written here and the rest by pyarrow with `write_options`.
    None when a column holds what this writer does not, or pyarrow's footer is not one it can edit
    (not one row group, truncated, laid out otherwise): then write the table with pyarrow alone."""
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
    if placeholders.num_rows and placeholders.column(0).num_chunks > 1:
        # pyarrow writes thousands of one-row chunks far slower than one (0.76 s against 0.06 s
        # for 20,000 one-span batches), and copying the columns it writes costs ~0.14 s
        placeholders = placeholders.combine_chunks()
    sink = pa.BufferOutputStream()
    pq.write_table(placeholders, sink, row_group_size=max(1, len(table)), **write_options)
    try:
        return _with_pages(sink.getvalue(), pages)
    except (tc.ThriftError, IndexError, KeyError, TypeError, ValueError, StopIteration) as exc:
        # a footer not laid out as this module expects (another pyarrow, other options): pyarrow
        # writes the whole file instead, as for every other case this writer does not handle
        _fall_back("footer not editable", f"{type(exc).__name__}: {exc}")
        return None


def _with_pages(written: pa.Buffer, pages: dict[str, list[_Page]]) -> list | None:
    """pyarrow's file `written` with `pages` appended after its pages and its footer pointing at them.
    Raises (IndexError, KeyError, ThriftError, ...) on a footer laid out otherwise."""
    if len(written) < 12 or written[-4:].to_pybytes() != _MAGIC:
        raise ValueError("no Parquet trailer")
    footer_size = int.from_bytes(written[-8:-4].to_pybytes(), "little")
    data_end = len(written) - 8 - footer_size
    if not 4 <= data_end < len(written) - 8:
        raise ValueError(f"footer size {footer_size} out of range")
    footer, _ = tc.read_struct(written[data_end:-8].to_pybytes())
    row_groups_field = footer[4][1]  # a list: (element type, items)
    if not isinstance(row_groups_field, tuple):
        raise ValueError("row_groups is not a list")
    row_groups = row_groups_field[1]
    if len(row_groups) != 1:
        _fall_back("footer not editable", f"{len(row_groups)} row groups")
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
