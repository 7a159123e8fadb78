"""Compaction's file: many files of one partition merged into one, deduplicated, and laid out for
lookups. Runs in the pipeline's worker processes (pipeline.Pipeline.compact)."""

from __future__ import annotations

import secrets

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import WRITE_OPTIONS, Store


def dedupe(table: pa.Table) -> pa.Table:
    """Keep the first row of each (trace_id, span_id)."""
    keys = pc.binary_join_element_wise(table.column("trace_id"), table.column("span_id"), "")
    indexed = pa.table({"key": keys, "row": pa.array(range(table.num_rows), pa.int64())})
    first = indexed.group_by("key", use_threads=False).aggregate([("row", "min")]).column("row_min")
    return table.take(pc.sort_indices(first))


# Compacted files are sorted by these, in row groups of COMPACT_ROW_GROUP_ROWS rows with min/max
# statistics and Bloom filters on the ids, so that DuckDB skips every row group (and so every file)
# that cannot hold a looked-up rollout or trace: one rollout's spans cost a few row groups, not the
# store (tests/collector/test_store_pruning.py reads the scan's row count).
COMPACT_SORT_KEYS = ("rollout_id", "trace_id", "start_time")
COMPACT_ROW_GROUP_ROWS = 8192


def compact_write_options(rows: int) -> dict:
    """pyarrow settings for a compacted file of `rows` rows: the store's, plus row groups and Bloom
    filters (sized to the rows, 1% false positives) on rollout_id and trace_id."""
    bloom = {"ndv": max(rows, 1), "fpp": 0.01}
    return dict(
        WRITE_OPTIONS,
        row_group_size=COMPACT_ROW_GROUP_ROWS,
        bloom_filter_options={"rollout_id": bloom, "trace_id": bloom},
    )


def compact_files(store_uri: str, paths: list[str], target_dir: str) -> str:
    """Merge `paths` into one deduplicated file in target_dir, sorted for pruning; returns its path.
    Worker process. Written by pyarrow, not list_pages: list_pages writes one row group per file."""
    store = Store(store_uri)
    tables = [pq.read_table(p, filesystem=store.fs, schema=SPANS_SCHEMA) for p in paths]
    out = f"{target_dir}/compact-{secrets.token_hex(8)}.parquet"
    write_compacted(store, dedupe(pa.concat_tables(tables)), out)
    return out


def write_compacted(store: Store, table: pa.Table, path: str) -> None:
    """Write `table` to `path` as compaction does: sorted by COMPACT_SORT_KEYS, in row groups with
    Bloom filters (compact_write_options), with its rollout index (rollout_index.py)."""
    ordered = table.sort_by([(key, "ascending") for key in COMPACT_SORT_KEYS])
    store.write(ordered, path, options=compact_write_options(ordered.num_rows), indexed=True)
