"""Which Parquet files can hold a rollout, known without opening them: a sidecar per span file.

Next to each span file `<name>.parquet` the collector writes `<name>.rollouts` (Store.write_segment,
compaction.write_compacted): a Bloom filter of the file's rollout ids and trace ids. A lookup by
rollout (rollout_lookup.py) lists the store, reads the sidecars (a few KiB each) and gives DuckDB
only the files whose filter may hold the rollout, or its traces, plus every file it cannot rule
out. The index only ever narrows safely, so nothing in it is kept in step by locks or rewrites:

- a file without a sidecar (written before the index existed; on an object store, which has no
  rename, a crash between the file and its sidecar: locally the sidecar is in place first) is read;
- a sidecar is trusted only whole (its length is the one its header implies and it ends in `end`)
  and only for the file size it names, so a torn write, or a file replaced under the same name,
  makes its file read;
- compaction's new file gets its own sidecar; an input's sidecar is deleted after it
  (Pipeline.delete_doomed; retention deletes whole partitions); a sidecar whose file is gone is
  never looked at.

Before any of this a lookup skips the days whose own index rules its ids out (day_index.py): their
directories are not even listed.

A Bloom filter errs only one way: a file may be read for nothing (with FALSE_POSITIVES' odds per
file and id), never left out. Ids are hashed, never parsed, so a hostile id cannot forge an entry.
The suffix is not `.parquet`: the store's `**/*.parquet` glob (the query door's too) never reads a
sidecar as spans.

Format: a header line; `<Parquet file size> <hashes> <bits>`; the filter's bits (bit p is byte p // 8's
bit p % 8); `\\nend\\n`. A key is two 64-bit hashes (first, step) of the id (BLAKE2b); its bits are
(first + i * step) mod bits for i < hashes (double hashing; step is odd and bits a multiple of 8, so
step is never 0 mod bits).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from lightning_otel.core import schema

SUFFIX = ".rollouts"
FALSE_POSITIVES = 0.001  # per file and id: with 1,000 hour files, about one file read for nothing
_MIN_BITS = 1024  # a small (live) file's filter is roomy: next to no false positives
_HEADER = b"lightning-otel rollout index 1\n"
_END = b"\nend\n"
_MASK64 = (1 << 64) - 1


def sidecar_path(parquet_path: str) -> str:
    """`dir/name.parquet` -> `dir/name.rollouts`."""
    return parquet_path.removesuffix(".parquet") + SUFFIX


def keys(rollout_ids: Iterable[str] = (), trace_ids: Iterable[str] = ()) -> list[tuple[int, int]]:
    """The filter's keys for these ids (two 64-bit hashes each; rollout and trace ids never collide)."""
    found = []
    for prefix, ids in ((b"r", rollout_ids), (b"t", trace_ids)):
        for value in ids:
            if not isinstance(value, str):
                raise TypeError(f"a rollout or trace id is a string, not {type(value).__name__}: {value!r}")
            digest = hashlib.blake2b(prefix + value.encode("utf-8", "surrogatepass"), digest_size=16).digest()
            both = int.from_bytes(digest, "little")
            found.append((both & _MASK64, both >> 64 | 1))
    return found


# The trainer's diagnostic spans (merge_diagnostics, input_diagnostics) are not spans of the rollout they
# describe: they name it in an attribute, which a lookup by rollout must find too.
DIAGNOSTIC_ROLLOUT_ATTRIBUTES = {
    schema.SPAN_MERGE_BOUNDARY: schema.MERGE_ROLLOUT,
    schema.SPAN_INPUT_DIAGNOSTIC: schema.INPUT_ROLLOUT,
}


def named_diagnostics(names: pa.ChunkedArray | pa.Array) -> bool:
    """Whether a file's span names include a diagnostic span's (then its attributes name rollouts)."""
    return bool(pc.any(pc.is_in(names, pa.array(list(DIAGNOSTIC_ROLLOUT_ATTRIBUTES)))).as_py())


def table_keys(table: pa.Table) -> list[tuple[int, int]]:
    """The filter's keys for a table of spans: its rollout ids (the column, and those the trainer's
    diagnostic spans name in an attribute) and its trace ids. Missing columns hold nothing."""
    columns = set(table.column_names)

    def unique(column: pa.ChunkedArray | pa.Array) -> list[str]:
        return pc.unique(column).drop_null().to_pylist()

    rollouts = unique(table.column("rollout_id")) if "rollout_id" in columns else []
    if {"name", "attributes"} <= columns and named_diagnostics(table.column("name")):
        for name, attribute in DIAGNOSTIC_ROLLOUT_ATTRIBUTES.items():
            spans = table.filter(pc.equal(table.column("name"), name))
            if spans.num_rows:
                rollouts += unique(pc.map_lookup(spans.column("attributes"), attribute, "first"))
    return keys(rollouts, unique(table.column("trace_id")) if "trace_id" in columns else [])


def encode(keys_: list[tuple[int, int]], parquet_size: int) -> bytes:
    """A sidecar's bytes for a file of `parquet_size` bytes holding rows with `keys_`."""
    wanted = max(_MIN_BITS, math.ceil(-len(keys_) * math.log(FALSE_POSITIVES) / math.log(2) ** 2))
    bits = (wanted + 7) // 8 * 8
    hashes = min(16, max(1, round(bits / max(len(keys_), 1) * math.log(2))))  # the optimum, bounded
    filter_ = bytearray(bits // 8)
    for first, step in keys_:
        position, step = first % bits, step % bits
        for _ in range(hashes):
            filter_[position >> 3] |= 1 << (position & 7)
            position = (position + step) % bits
    return _HEADER + f"{parquet_size} {hashes} {bits}\n".encode("ascii") + bytes(filter_) + _END


def may_hold(sidecar: bytes, parquet_size: int, wanted: list[tuple[int, int]]) -> bool:
    """False only when `sidecar` is a whole index of a file of `parquet_size` bytes whose filter
    rules out every key of `wanted`; anything it cannot vouch for: True."""
    if not sidecar.startswith(_HEADER) or not sidecar.endswith(_END):
        return True
    line_end = sidecar.find(b"\n", len(_HEADER))
    try:
        size, hashes, bits = (int(field) for field in sidecar[len(_HEADER) : line_end].split(b" "))
    except ValueError:
        return True
    start = line_end + 1
    if (
        size != parquet_size
        or bits <= 0
        or bits % 8
        or not 0 < hashes <= 16
        or len(sidecar) != start + bits // 8 + len(_END)
    ):
        return True
    for first, step in wanted:  # plain loops: this runs for every file of the store, per lookup
        position, step = first % bits, step % bits
        for _ in range(hashes):
            if not sidecar[start + (position >> 3)] >> (position & 7) & 1:
                break
            position = (position + step) % bits
        else:
            return True
    return False
