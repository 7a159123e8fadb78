"""A lookup's connection (`connect(DATA, rollout_ids=...)` on a local store): a cursor of one
read-only DuckDB database per process that holds the views, so a lookup pays neither for a new
database nor for binding every view."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from datetime import datetime

import duckdb

from lightning_otel.collector.query import listed_source, retry_vanished_files, spans_raw_statement, view_statements
from lightning_otel.collector.rollout_lookup import rollout_files
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store

_views_database: tuple[int, duckdb.DuckDBPyConnection] | None = None  # (the process that made it, it)
_views_database_lock = threading.Lock()


def lookup_connection(store: Store, rollout_ids: list[str], since: datetime | None) -> duckdb.DuckDBPyConnection:
    """A lookup's connection: a cursor of one read-only database per process that holds the views over
    an empty spans table, with its own TEMP `spans_raw` over the rollouts' files shadowing the empty one.
    A lookup then pays neither for a new DuckDB database nor for binding every view (together about
    half of a lookup's time over a 720-file store). What the caller makes on it (TEMP tables and views,
    registered tables) stays its own; the shared views cannot be dropped or replaced (read-only)."""
    global _views_database
    with _views_database_lock:
        if _views_database is None or _views_database[0] != os.getpid():  # a forked child makes its own
            folder = tempfile.mkdtemp(prefix="lightning-otel-views-")
            with duckdb.connect(os.path.join(folder, "views.duckdb")) as writer:
                writer.register("_arrow_spans", SPANS_SCHEMA.empty_table())
                writer.execute("CREATE TABLE _empty_spans AS SELECT * FROM _arrow_spans")
                for statement in view_statements("_empty_spans"):
                    writer.execute(statement)
            views = duckdb.connect(os.path.join(folder, "views.duckdb"), read_only=True)
            atexit.register(_drop_views_database, views, folder)
            _views_database = (os.getpid(), views)
        conn = _views_database[1].cursor()

    def read_files() -> None:  # binding reads the footers: a file compaction deletes meanwhile is listed again
        source = listed_source(rollout_files(conn, store, rollout_ids, since))
        if source is not None:
            conn.execute(spans_raw_statement(source, temporary=True))

    if store.has_data():
        retry_vanished_files(read_files)
    return conn


def _drop_views_database(views: duckdb.DuckDBPyConnection, folder: str) -> None:
    views.close()
    shutil.rmtree(folder, ignore_errors=True)
