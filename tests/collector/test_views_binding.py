"""connect() binds its views over an empty table of the spans' shape, then points `spans_raw` at the
files (binding read_parquet reads every file's footer, once per view otherwise). The views must answer
as if bound over the files, and a store whose files carry other columns must still show them."""

from __future__ import annotations

import pyarrow as pa

from lightning_otel.collector import connect
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store


def _span(span_id: str, name: str, rollout: str) -> dict:
    return {"trace_id": "t1", "span_id": span_id, "name": name, "rollout_id": rollout, "duration_ms": 1.0}


def _write(store: Store, table: pa.Table, name: str) -> None:
    store.write(table, f"{store.partition_dir('svc', 490000)}/{name}.parquet")


def test_views_read_the_files_written_after_nothing_was_there(tmp_path):
    store = Store(tmp_path)
    rows = [_span("a", "rollout", "r1"), _span("b", "turn", "r1"), _span("b", "turn", "r1")]  # b twice
    _write(store, pa.Table.from_pylist(rows, schema=SPANS_SCHEMA), "part-1")
    conn = connect(tmp_path)
    assert conn.execute("SELECT count(*) FROM spans_raw").fetchone()[0] == 3
    assert sorted(conn.execute("SELECT span_id, name FROM spans").fetchall()) == [("a", "rollout"), ("b", "turn")]
    _write(store, pa.Table.from_pylist([_span("c", "turn", "r1")], schema=SPANS_SCHEMA), "part-2")
    assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 3  # re-listed per query


def test_a_column_the_empty_shape_lacks_reaches_every_view(tmp_path):
    store = Store(tmp_path)
    table = pa.Table.from_pylist([_span("a", "rollout", "r1")], schema=SPANS_SCHEMA)
    _write(store, table.append_column("written_by_a_newer_collector", pa.array(["yes"])), "part-1")
    conn = connect(tmp_path)
    assert conn.execute("SELECT written_by_a_newer_collector FROM spans").fetchall() == [("yes",)]
