"""The files a lookup by rollout reads (`connect(DATA, rollout_ids=...)`), chosen before DuckDB opens
any: each day's index (day_index.py) decides whether the day is listed at all, then each listed span
file's rollout index (rollout_index.py) whether it is read.

Two rounds, so that the views answer for the rollouts exactly as over the whole store:
1. the files whose index may hold one of the rollout ids: every span of the rollouts is in them;
2. their traces (read from those files alone), and the files whose index may hold one of those
   traces: llm_calls decides whether an LLM span is a wrapper by the other LLM spans of its trace,
   whatever their rollout id (a span another process recorded without the rollout's id, in another
   service's partition or another day, still counts). The days the first round skipped are
   consulted again for the traces.
A file without a trustworthy index is in both rounds, and so is every file of a day without one.
"""

from __future__ import annotations

from datetime import datetime

import duckdb

from lightning_otel.collector import rollout_index
from lightning_otel.collector.day_index import DayListing
from lightning_otel.collector.store import Store


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def rollout_files(
    conn: duckdb.DuckDBPyConnection, store: Store, rollout_ids: list[str], since: datetime | None = None
) -> list[str]:
    """The files (as readers name them, the schema file first) that the views need for `rollout_ids`
    (with `since`: within files_since's partitions). `conn` reads the first round's traces (it has
    the store's file system registered)."""
    days = DayListing(store, since)
    wanted = rollout_index.keys(rollout_ids)
    schema_files, span_files = store.indexed_files(since, days.more(wanted))

    def holding(keys: list[tuple[int, int]]) -> list[str]:
        return [name for name, size, index in span_files if index is None or rollout_index.may_hold(index, size, keys)]

    first = holding(wanted)
    if not first or not rollout_ids:
        return schema_files + first
    traces = conn.execute(  # the ids as parameters: constants to DuckDB (row groups pruned), any text
        f"""SELECT DISTINCT trace_id FROM read_parquet([{", ".join(map(_literal, first))}], union_by_name = true)
            WHERE rollout_id IN ({", ".join("?" * len(rollout_ids))}) AND trace_id IS NOT NULL""",
        rollout_ids,
    ).fetchall()
    both = wanted + rollout_index.keys(trace_ids=[trace for (trace,) in traces])
    span_files = sorted(span_files + store.indexed_files(since, days.more(both))[1])
    return schema_files + holding(both)
