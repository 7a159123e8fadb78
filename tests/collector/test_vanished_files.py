"""A query that listed a Parquet file the collector then deleted (compaction's inputs, once their grace
period ends) is run again (`query.retry_vanished_files`), since the compacted file holds the same rows.
The deletion is real: a query deletes a file its glob listed before DuckDB opens it, and DuckDB raises
its own error."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_otel.collector.query import retry_vanished_files, vanished_file

ROWS = 50_000


def _store(tmp_path):
    """Two part files and the compacted file that holds the rows of both (what compaction leaves)."""
    ids = list(range(2 * ROWS))
    for name, rows in (("compact-1", ids), ("part-1", ids[:ROWS]), ("part-2", ids[ROWS:])):
        pq.write_table(pa.table({"span_id": rows}), tmp_path / f"{name}.parquet", row_group_size=5_000)


def _query_losing(tmp_path, name: str):
    """A query over the directory's glob that deletes `name` while it reads the first file: DuckDB has
    listed it and opens it only when it gets there (one thread: the files in order)."""
    conn = duckdb.connect()
    conn.execute("SET threads = 1")

    def lose(_):
        (tmp_path / name).unlink(missing_ok=True)
        return True

    conn.create_function("lose", lose, ["BIGINT"], "BOOLEAN", side_effects=True)
    sql = f"SELECT count(DISTINCT span_id) FROM read_parquet('{tmp_path}/*.parquet') WHERE lose(span_id)"
    runs = []

    def run():
        runs.append(1)
        return conn.execute(sql).fetchone()[0]

    return run, runs


def test_a_listed_file_deleted_before_it_is_read_is_read_again(tmp_path):
    _store(tmp_path)
    run, runs = _query_losing(tmp_path, "part-2.parquet")
    assert retry_vanished_files(run) == 2 * ROWS  # every span: the second run listed the files anew
    assert len(runs) == 2


def test_the_error_is_duckdbs_and_other_errors_are_not_retried(tmp_path):
    _store(tmp_path)
    run, _ = _query_losing(tmp_path, "part-2.parquet")
    with pytest.raises(duckdb.IOException) as raised:
        run()
    assert vanished_file(raised.value)
    calls = []

    def broken():
        calls.append(1)
        raise duckdb.IOException("IO Error: No magic bytes found at end of file 'x.parquet'")

    with pytest.raises(duckdb.IOException, match="magic bytes"):
        retry_vanished_files(broken)
    assert len(calls) == 1  # a damaged file is not a vanished one


def test_it_gives_up_after_its_attempts(tmp_path):
    calls = []

    def always_gone():
        calls.append(1)
        raise duckdb.IOException('IO Error: Cannot open file "x.parquet": No such file or directory')

    with pytest.raises(duckdb.IOException):
        retry_vanished_files(always_gone, attempts=3)
    assert len(calls) == 3
