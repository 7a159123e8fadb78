"""SQL from the network, bounded: a time limit per query and a cap on queries at once.

`QueryLimiter.answer` is the whole of POST /v1/query for both servers that offer it (the
collector's and the dashboard's): it parses `{"sql": "..."}`, runs the statement with
`query.run_query` (the sandbox and its memory limit), stops it with DuckDB's `interrupt()` when it
runs past `timeout_s`, and turns every outcome into (HTTP status, JSON payload, headers):
200 the rows; 400 not one read-only query, or a failing one; 429 + Retry-After when
`max_concurrent` queries are already running; 504 when the time limit stopped it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor

import duckdb

from lightning_otel.collector.config import DEFAULT_QUERY_MAX_CONCURRENT, DEFAULT_QUERY_TIMEOUT_S
from lightning_otel.collector.query import MAX_QUERY_ROWS, QUERY_MEMORY_LIMIT, run_query

log = logging.getLogger(__name__)

Reply = tuple[int, dict, dict[str, str]]


class QueryTimedOut(Exception):
    """The query ran past the time limit and was interrupted."""


class _Deadline:
    """Interrupts the connection it holds once `timeout_s` have passed since it was made."""

    def __init__(self, timeout_s: float) -> None:
        self.fired = False
        self._conn: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()  # interrupt() only while the connection is open
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._conn is not None:
                self._conn.interrupt()

    @contextlib.contextmanager
    def hold(self, conn: duckdb.DuckDBPyConnection) -> Iterator[None]:
        with self._lock:
            if self.fired:  # opening the store took the whole time
                raise duckdb.InterruptException("interrupted before the query started")
            self._conn = conn
        try:
            yield
        finally:
            with self._lock:
                self._conn = None

    def cancel(self) -> None:
        self._timer.cancel()


class QueryLimiter:
    def __init__(
        self,
        data_dir: str | os.PathLike,
        timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        max_concurrent: int = DEFAULT_QUERY_MAX_CONCURRENT,
        memory_limit: str = QUERY_MEMORY_LIMIT,
        max_rows: int = MAX_QUERY_ROWS,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"query timeout must be positive, not {timeout_s}")
        self.data_dir = data_dir
        self.timeout_s = timeout_s
        self.max_concurrent = max_concurrent
        self.memory_limit = memory_limit
        self.max_rows = max_rows
        self._running = 0
        self._lock = threading.Lock()

    def _enter(self) -> bool:
        with self._lock:
            if self._running >= self.max_concurrent:
                return False
            self._running += 1
            return True

    def _leave(self) -> None:
        with self._lock:
            self._running -= 1

    def run(self, sql: str) -> dict:
        """`query.run_query`, interrupted once it runs past `timeout_s` (QueryTimedOut)."""
        watch = _Deadline(self.timeout_s)
        try:
            return run_query(self.data_dir, sql, self.max_rows, self.memory_limit, watch=watch.hold)
        except duckdb.Error:
            if watch.fired:
                raise QueryTimedOut(f"the query ran longer than {self.timeout_s:g} s and was stopped") from None
            raise
        finally:
            watch.cancel()

    def _parse(self, body: bytes) -> str:
        try:
            sql = json.loads(body)["sql"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f'send {{"sql": "SELECT ..."}}: {exc!r}') from None
        if not isinstance(sql, str):
            raise ValueError("'sql' must be a string")
        return sql

    def _busy(self) -> Reply:
        return 429, {"error": f"{self.max_concurrent} queries are running; try again shortly"}, {"Retry-After": "1"}

    def _execute(self, sql: str) -> Reply:
        """Run `sql` in the slot the caller took, and give the slot back."""
        started = time.monotonic()
        try:
            return 200, self.run(sql), {}
        except QueryTimedOut as exc:
            log.info("query stopped after %.1f s: %.200s", time.monotonic() - started, sql)
            return 504, {"error": str(exc), "timeout_s": self.timeout_s}, {}
        except (ValueError, duckdb.Error) as exc:
            return 400, {"error": str(exc)}, {}
        finally:
            self._leave()

    def answer(self, body: bytes) -> Reply:
        """POST /v1/query on a threaded server: (status, JSON payload, extra headers)."""
        try:
            sql = self._parse(body)
        except ValueError as exc:
            return 400, {"error": str(exc)}, {}
        return self._execute(sql) if self._enter() else self._busy()

    async def answer_async(self, body: bytes, executor: Executor) -> Reply:
        """POST /v1/query on an event loop: the query runs on `executor` (refusals never wait for it)."""
        try:
            sql = self._parse(body)
        except ValueError as exc:
            return 400, {"error": str(exc)}, {}
        if not self._enter():
            return self._busy()
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, self._execute, sql)
        except BaseException:
            self._leave()
            raise
        return await future
