"""Pruning is real: a one-rollout lookup over compacted files reads one row group of the store's.

DuckDB's profile (each Parquet scan's row_groups_scanned and total_row_groups_to_scan) says what a
query read; the files are what compaction writes (compaction.compact_files), so these tests fail if
compaction stops sorting, stops cutting row groups or stops writing Bloom filters, or if a
rollout filter on llm_calls stops reaching the wrapper search (query.py's llm_spans).
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_otel.collector import connect
from lightning_otel.collector.compaction import compact_files
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store

SPANS_PER_ROLLOUT = 4
HOURS, FILES_PER_HOUR, ROLLOUTS_PER_FILE = 4, 3, 1500


def _spans(rollout_ids: list[str], hour: int, rng: random.Random) -> pa.Table:
    """Rollouts of a root, two LLM calls with token ids and an LLM span without ids around both (a
    framework's wrapper: llm_calls leaves it out), in shuffled row order."""
    rows = []
    for rollout in rollout_ids:
        trace, began = f"{rng.getrandbits(128):032x}", hour * 3_600_000_000 + rng.randrange(3_500_000_000)
        for position in range(SPANS_PER_ROLLOUT):
            inside = position in (1, 2)  # the calls lie inside the root's and the wrapper's window
            start, end = (began + 10 * position, began + 10 * position + 5) if inside else (began, began + 100)
            rows.append((trace, f"{rng.getrandbits(64):016x}", rollout, position, start, end))
    rng.shuffle(rows)
    position = [r[3] for r in rows]
    ids = [p in (1, 2) for p in position]
    columns = {
        "trace_id": pa.array([r[0] for r in rows]),
        "span_id": pa.array([r[1] for r in rows]),
        "rollout_id": pa.array([r[2] for r in rows]),
        "name": pa.array(["span"] * len(rows)),
        "span_kind": pa.array(["AGENT" if p == 0 else "LLM" for p in position]),
        "is_rollout_root": pa.array([p == 0 for p in position]),
        "start_time": pa.array([r[4] for r in rows], pa.timestamp("us", tz="UTC")),
        "end_time": pa.array([r[5] for r in rows], pa.timestamp("us", tz="UTC")),
        "prompt_token_ids": pa.array([[1, 2, 3] if i else None for i in ids], pa.list_(pa.int32())),
        "completion_token_ids": pa.array([[4, 5] if i else None for i in ids], pa.list_(pa.int32())),
        "completion_logprobs": pa.array([[-0.1, -0.2] if i else None for i in ids], pa.list_(pa.float64())),
        "service_name": pa.array(["agent"] * len(rows)),
    }
    return pa.table(
        {f.name: columns[f.name] if f.name in columns else pa.nulls(len(rows), f.type) for f in SPANS_SCHEMA},
        schema=SPANS_SCHEMA,
    )


def _compacted_store(tmp_path) -> tuple[Store, list[str], int]:
    """HOURS hour partitions, each one file compacted from FILES_PER_HOUR live files of rollouts
    with random ids; returns the store, every rollout id and the number of spans."""
    rng, store, every_id = random.Random(37), Store(tmp_path), []
    store.ensure_schema_file()
    first_hour = 490_000
    for hour in range(first_hour, first_hour + HOURS):
        directory, inputs = store.partition_dir("agent", hour), []
        for part in range(FILES_PER_HOUR):
            ids = [f"{rng.getrandbits(128):032x}" for _ in range(ROLLOUTS_PER_FILE)]
            every_id += ids
            path = f"{directory}/part-{part}.parquet"
            store.write(_spans(ids, hour, rng), path)
            inputs.append(path)
        compact_files(store.uri, inputs, directory)
        for path in inputs:
            store.fs.delete_file(path)
    return store, every_id, len(every_id) * SPANS_PER_ROLLOUT


def _scans(conn, sql: str, params: list, profile_path) -> tuple[list, list[dict]]:
    """The query's rows, and each Parquet scan's profile (row_groups_scanned / total_row_groups_to_scan)."""
    conn.execute("PRAGMA enable_profiling = 'json'")
    conn.execute(f"PRAGMA profiling_output = '{profile_path}'")
    rows = conn.execute(sql, params).fetchall()
    conn.execute("PRAGMA disable_profiling")
    with open(profile_path) as handle:
        profile = json.load(handle)
    scans, stack = [], list(profile["operator"])
    while stack:
        node = stack.pop()
        stack += node.get("children", [])
        if node.get("extra_info", {}).get("Function") == "READ_PARQUET":
            scans.append(node)
    return rows, scans


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    return _compacted_store(tmp_path_factory.mktemp("store"))


def test_compaction_writes_sorted_row_groups(compacted):
    store, _, spans = compacted
    files = [pq.ParquetFile(info.path) for info in store.files()]
    assert len(files) == HOURS and all(f.num_row_groups >= 2 for f in files)
    assert sum(f.metadata.num_rows for f in files) == spans
    for f in files:
        rollouts = f.read(columns=["rollout_id"]).column("rollout_id").to_pylist()
        rollouts = f.read(columns=["rollout_id"]).column("rollout_id").to_pylist()
        assert rollouts == sorted(rollouts)


def test_one_rollouts_spans_read_one_row_group(compacted, tmp_path):
    store, ids, _ = compacted
    conn = connect(store.uri)
    for wanted in (ids[0], ids[len(ids) // 2], ids[-1]):
        sql = "SELECT span_id, prompt_token_ids FROM spans WHERE rollout_id = ?"
        rows, scans = _scans(conn, sql, [wanted], tmp_path / "profile.json")
        assert len(rows) == SPANS_PER_ROLLOUT
        assert len(scans) == 1
        # Sorted by rollout, one rollout's spans sit together in one row group of one file (its
        # hour): every other row group, in its file and the others, is skipped.
        assert scans[0]["row_groups_scanned"] == 1, scans[0]
        assert scans[0]["total_row_groups_to_scan"] >= HOURS * 2


def test_one_rollouts_calls_skip_the_rest_of_the_store(compacted, tmp_path):
    """llm_calls searches each trace for wrappers; the rollout filter must reach that search too."""
    store, ids, _ = compacted
    row_groups = sum(pq.ParquetFile(info.path).num_row_groups for info in store.files())
    conn = connect(store.uri)
    for wanted in (ids[1], ids[len(ids) // 3]):
        sql = "SELECT span_id, completion_token_ids FROM llm_calls WHERE rollout_id = ?"
        rows, scans = _scans(conn, sql, [wanted], tmp_path / "profile.json")
        assert len(rows) == 2 and all(ids == [4, 5] for _, ids in rows)  # the wrapper is not a call
        by_rollout = [scan for scan in scans if "rollout_id" in str(scan["extra_info"].get("Filters"))]
        # The spans themselves and the wrapper candidates: both read the rollout's one row group.
        # (The calls a candidate may contain are found by trace_id, over the LLM rows of the row
        # groups the join's trace_id range allows: docs/sql.md.)
        assert len(by_rollout) == 2, [scan["extra_info"].get("Filters") for scan in scans]
        assert [scan["row_groups_scanned"] for scan in by_rollout] == [1, 1], row_groups
