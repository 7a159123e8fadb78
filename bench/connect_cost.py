"""What opening a connection costs on a trace store: `connect()` (views created over an empty table of
the spans' columns, then `spans_raw` pointed at the files) against every view created over the files
(what connect() did before), in the same run; and one query on each, the same answer.

    python bench/connect_cost.py DIR/traces --repeat 5

DIR/traces: any collector data directory (an example run's, say). Prints the number of Parquet files
and the median seconds of each over `--repeat` connections.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import duckdb

from lightning_otel.collector import connect
from lightning_otel.collector.query import parquet_source, view_statements
from lightning_otel.collector.store import Store

QUERY = "SELECT count(*), count(DISTINCT task_id) FROM rollouts"


def every_view_over_the_files(data_dir: Path) -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect()
    for statement in view_statements(parquet_source(Store(data_dir))):
        conn.execute(statement)
    return conn


def timed(open_connection, data_dir: Path, repeat: int) -> tuple[float, float, tuple]:
    opened, queried, answer = [], [], None
    for _ in range(repeat):
        began = time.perf_counter()
        conn = open_connection(data_dir)
        opened.append(time.perf_counter() - began)
        began = time.perf_counter()
        answer = conn.execute(QUERY).fetchone()
        queried.append(time.perf_counter() - began)
        conn.close()
    return statistics.median(opened), statistics.median(queried), answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{len(Store(args.data_dir).files())} Parquet files; medians of {args.repeat}")
    print("how | open s | query s | answer")
    for name, how in (("connect()", connect), ("every view over the files", every_view_over_the_files)):
        opened, queried, answer = timed(how, args.data_dir, args.repeat)
        print(f"{name} | {opened:.3f} | {queried:.3f} | {answer}")


if __name__ == "__main__":
    main()
