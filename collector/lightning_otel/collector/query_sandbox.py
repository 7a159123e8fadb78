"""The read-only SQL door: what SQL from the network runs on (both servers' POST /v1/query).

`run_query` parses the text with DuckDB, accepts exactly one plain query (DuckDB's statement type
SELECT; EXPLAIN is refused: EXPLAIN ANALYZE runs the statement it explains), and runs that parsed
statement on a `sandboxed_connect` connection, which has no write path at all even for a statement
that got past the check:

- DuckDB's local file system is off (`disabled_filesystems = 'LocalFileSystem'`): no local file can
  be read, listed or written, the store included. DuckDB's `allowed_directories` alone would not do:
  it opens a directory for reading and writing alike.
- The store is read through `ReadOnlyStore`, an fsspec file system registered as
  `tracestore://spans/...`: it opens files for reading only, has no method that creates, changes or
  removes anything, and refuses any path that leaves spans/.
- No temp directory (nothing spills: a query past the memory limit fails instead), no persistent
  secrets, no extension install or autoload, external access off, settings locked.
- No host path shows: views, settings (`allowed_directories`, `temp_directory`, `secret_directory`)
  and errors name `tracestore://spans/...`, never the store's directory.

With `rollout_ids` the views are narrowed as `connect(DATA, rollout_ids=...)` narrows them: `spans_raw`
reads only the files rollout_lookup.rollout_files chooses (named under tracestore://spans/), on the
same sandboxed connection with the same settings. The choice itself reads the files' trace ids on a
connection of its own, made and closed before the client's statement runs; no client SQL runs on it.

query_worker.py runs `run_query` in worker processes, query_limits.py bounds it in time and count.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import duckdb
from fsspec import AbstractFileSystem
from fsspec.implementations.dirfs import DirFileSystem

from lightning_otel.collector.query import (
    listed_source,
    parquet_source,
    retry_vanished_files,
    spans_raw_statement,
    view_statements,
)
from lightning_otel.collector.rollout_lookup import rollout_files
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import SPANS_DIR, Store

QUERY_MEMORY_LIMIT = "1GB"
MAX_QUERY_ROWS = 100_000
PROTOCOL = "tracestore"
SPANS_URL = f"{PROTOCOL}://{SPANS_DIR}/"


class ReadOnlyStore(AbstractFileSystem):
    """`tracestore://spans/<p>` is `<root>/spans/<p>` on `base` (a local or object-store fsspec file
    system), for reading only. fsspec's defaults for the writing methods raise NotImplementedError,
    do nothing (mkdir) or open a file for writing, which `_open` refuses."""

    protocol = PROTOCOL

    def __init__(self, root: str, base: AbstractFileSystem) -> None:
        super().__init__(skip_instance_cache=True)  # one per connection, never shared through fsspec's cache
        self._files = DirFileSystem(path=root, fs=base)

    def _inside(self, path: str) -> str:
        """`path` relative to the root, refused unless it stays under spans/."""
        relative = posixpath.normpath(self._strip_protocol(path).lstrip("/"))
        if relative != SPANS_DIR and not relative.startswith(SPANS_DIR + "/"):
            raise PermissionError(errno.EACCES, "outside the trace store", path)
        return relative

    def _call(self, method: str, path: str, *args, **kwargs):
        relative = self._inside(path)
        try:
            return getattr(self._files, method)(relative, *args, **kwargs)
        except OSError as exc:  # name the store's path, not the host's
            code = exc.errno or errno.EIO
            raise type(exc)(code, exc.strerror or os.strerror(code), path) from None

    def ls(self, path: str, detail: bool = True, **kwargs):
        return self._call("ls", path, detail=detail, **kwargs)

    def glob(self, path: str, maxdepth: int | None = None, **kwargs):
        """Files only: a directory whose name matches the pattern (a partition `service=x.parquet` of
        an older store) is not a file to read."""
        detail = kwargs.pop("detail", False)
        found = super().glob(path, maxdepth=maxdepth, detail=True, **kwargs)
        files = {name: info for name, info in found.items() if info.get("type") == "file"}
        return files if detail else list(files)

    def info(self, path: str, **kwargs):
        return self._call("info", path, **kwargs)

    def modified(self, path: str):
        return self._call("modified", path)

    def _open(self, path: str, mode: str = "rb", **kwargs):
        if mode != "rb":
            raise PermissionError(errno.EROFS, "the trace store is read-only here", path)
        return self._call("_open", path, mode, **kwargs)


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Set in this order: allowed_directories before external access is turned off (it cannot change
# after), LocalFileSystem after (turning external access off still looks the local one up).
_CONFIG: dict[str, str | bool] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "temp_directory": "",  # no spill files: none to write, none for another query to list
    "allow_persistent_secrets": False,
    "secret_directory": "none",  # the default names the host's home directory
}
_SETTINGS = (
    f"SET allowed_directories = [{_sql_string(SPANS_URL)}]",
    "SET enable_external_access = false",
    "SET disabled_filesystems = 'LocalFileSystem'",
    "SET lock_configuration = true",
)


def _store_files(store: Store) -> AbstractFileSystem:
    import fsspec

    if store.is_local:
        return fsspec.filesystem("file")
    protocol = store.uri.split("://", 1)[0]
    # Views re-list files at every query; a cached listing would miss new files or name deleted ones.
    options: dict = {"skip_instance_cache": True, "use_listings_cache": False}
    if protocol in ("s3", "s3a") and os.environ.get("AWS_ENDPOINT_URL"):
        options["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
    return fsspec.filesystem(protocol, **options)


Watch = Callable[[duckdb.DuckDBPyConnection], AbstractContextManager]


def _rollout_files(store: Store, rollout_ids: Sequence[str], memory_limit: str, watch: Watch | None) -> list[str]:
    """rollout_lookup's files for `rollout_ids`, as the store's readers name them. Chosen on a connection
    of its own: the choice reads files by their host names, which the sandboxed connection cannot."""
    lister = duckdb.connect(config={"memory_limit": memory_limit, **_CONFIG})
    try:
        if not store.is_local:
            lister.register_filesystem(_store_files(store))
        with watch(lister) if watch is not None else contextlib.nullcontext():
            return retry_vanished_files(lambda: rollout_files(lister, store, list(rollout_ids)))
    finally:
        lister.close()


def _create_views(
    conn: duckdb.DuckDBPyConnection,
    store: Store,
    memory_limit: str,
    rollout_ids: Sequence[str] | None = None,
    watch: Watch | None = None,
) -> None:
    """query.connect()'s views, `spans_raw` reading the same source expression with the store's
    files named under tracestore://spans/: the store's glob, or with `rollout_ids` the files a lookup
    of those rollouts reads (query.connect(rollout_ids=...)'s choice)."""
    conn.register_filesystem(ReadOnlyStore(store.root, _store_files(store)))
    conn.register("_empty_spans", SPANS_SCHEMA.empty_table())
    for statement in view_statements("_empty_spans"):
        conn.execute(statement)
    if not store.has_data():
        return
    host_glob = store.glob()
    host_root = host_glob[: host_glob.rindex(store.spans_root) + len(store.spans_root)]

    def sandboxed(name: str) -> str:
        if not name.startswith(host_root + "/"):
            raise AssertionError(f"{name} is not under the store's {host_root}")
        return SPANS_URL.rstrip("/") + name[len(host_root) :]

    if rollout_ids is None:
        source = parquet_source(store)
        if _sql_string(host_glob) not in source:
            raise AssertionError(f"query.parquet_source no longer reads {host_glob}")
        conn.execute(spans_raw_statement(source.replace(_sql_string(host_glob), _sql_string(sandboxed(host_glob)))))
        return
    files = [sandboxed(name) for name in _rollout_files(store, rollout_ids, memory_limit, watch)]
    listed = listed_source(files)
    if listed is not None:  # none: spans_raw stays the empty table
        conn.execute(spans_raw_statement(listed))


def sandboxed_connect(
    data_dir: str | os.PathLike,
    memory_limit: str = QUERY_MEMORY_LIMIT,
    rollout_ids: Sequence[str] | None = None,
    watch: Watch | None = None,
) -> duckdb.DuckDBPyConnection:
    """query.connect()'s views on a connection that can write no file and read only the store;
    with `rollout_ids`, narrowed to those rollouts as query.connect(rollout_ids=...) narrows them
    (`watch` holds the connection that chooses their files, as run_query's holds the statement's)."""
    conn = duckdb.connect(config={"memory_limit": memory_limit, **_CONFIG})
    try:
        _create_views(conn, Store(data_dir), memory_limit, rollout_ids, watch)
        for setting in _SETTINGS:
            conn.execute(setting)
    except BaseException:
        conn.close()
        raise
    return conn


def parse_read_only(sql: str) -> duckdb.Statement:
    """The one query in `sql` as DuckDB parsed it; ValueError unless it is exactly one statement of
    DuckDB's type SELECT (SELECT, WITH, VALUES, FROM, DESCRIBE, SUMMARIZE, SHOW; not PIVOT). EXPLAIN is
    refused: EXPLAIN ANALYZE runs the statement it explains, COPY included."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ValueError(f"cannot parse SQL: {exc}") from None
    if len(statements) != 1:
        raise ValueError("exactly one statement is allowed")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise ValueError(f"only queries (SELECT) are allowed, not {statements[0].type.name}")
    return statements[0]


def run_query(
    data_dir: str | os.PathLike,
    sql: str,
    max_rows: int = MAX_QUERY_ROWS,
    memory_limit: str = QUERY_MEMORY_LIMIT,
    watch: Watch | None = None,
    rollout_ids: Sequence[str] | None = None,
) -> dict:
    """One read-only statement from the network, on a sandboxed connection opened for it alone:
    `{"columns": [...], "rows": [[...]], "truncated": bool}` (at most `max_rows` rows). With
    `rollout_ids` (checked by query_limits.rollout_ids_of) the views are narrowed to those rollouts.

    Raises ValueError for anything but one query and duckdb.Error for a failing one (both are the
    caller's 400). `watch(conn)`, a context manager, holds the connection while the statement runs
    and its rows are fetched (query_worker interrupts it from there). What runs is the statement that
    was checked, not the text parsed a second time."""
    if not isinstance(sql, str):
        raise ValueError("'sql' must be a string")
    statement = parse_read_only(sql)
    conn = sandboxed_connect(data_dir, memory_limit, rollout_ids, watch)
    try:
        with watch(conn) if watch is not None else contextlib.nullcontext():
            result = conn.execute(statement)
            columns = [d[0] for d in result.description] if result.description else []
            rows = result.fetchmany(max_rows + 1) if columns else []
    finally:
        conn.close()
    return {"columns": columns, "rows": [list(row) for row in rows[:max_rows]], "truncated": len(rows) > max_rows}


_TRACEBACK = "Traceback (most recent call last):"


def scrub_error(message: str, data_dir: str) -> str:
    """An error for the client without a Python traceback (it names install paths) and with the
    store's host path written as the client sees the store (`tracestore://spans/...`)."""
    if _TRACEBACK in message:
        kept, skip_code = [], False
        for line in message.splitlines():
            if line.strip() == _TRACEBACK or line.startswith("  File "):
                skip_code = line.startswith("  File ")
                continue
            if skip_code and line.startswith("    "):  # the source line under a "File" line
                continue
            skip_code = False
            kept.append(line)
        message = "\n".join(kept)
    store = Store(data_dir)
    root = store.spans_root if store.is_local else f"{store.uri.split('://')[0]}://{store.spans_root}"
    message = message.replace(root, SPANS_URL.rstrip("/"))
    return message.replace(store.root, "<store>") if store.root not in ("", "/") else message
