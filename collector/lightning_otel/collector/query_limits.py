"""SQL from the network, bounded: a size limit, a time limit per query and a cap on queries at once.

`QueryLimiter.answer` is the whole of POST /v1/query for both servers that offer it (the
collector's and the dashboard's): it parses `{"sql": "..."}`, runs the statement with
`query_sandbox.run_query` (the sandbox and its memory limit) in a query worker process
(query_worker.py: the server's GIL is never held by DuckDB), stops it when it runs past `timeout_s`
(counted from admission: parsing and planning included), and turns every outcome into
(HTTP status, JSON payload, headers): 200 the rows; 400 not one read-only query, a failing one, or
a body that is not JSON with a valid Unicode `sql` string; 413 SQL text over `max_sql_bytes`;
429 + Retry-After when `max_concurrent` queries are already running; 504 when the time limit
stopped it; 500 only if a worker process died.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from concurrent.futures import Executor

from lightning_otel.collector.config import DEFAULT_QUERY_MAX_CONCURRENT, DEFAULT_QUERY_TIMEOUT_S
from lightning_otel.collector.query_sandbox import MAX_QUERY_ROWS, QUERY_MEMORY_LIMIT
from lightning_otel.collector.query_worker import Job, QueryRefused, QueryTimedOut, QueryWorkers, WorkerLost

log = logging.getLogger(__name__)

Reply = tuple[int, dict, dict[str, str]]

# DuckDB parses ~0.5 MB of SQL per second holding a CPU: longer text is refused before any parsing.
MAX_SQL_BYTES = 1 << 20


class _SqlTooLarge(ValueError):
    pass


class QueryLimiter:
    def __init__(
        self,
        data_dir: str | os.PathLike,
        timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        max_concurrent: int = DEFAULT_QUERY_MAX_CONCURRENT,
        memory_limit: str = QUERY_MEMORY_LIMIT,
        max_rows: int = MAX_QUERY_ROWS,
        max_sql_bytes: int | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"query timeout must be positive, not {timeout_s}")
        self.data_dir = str(data_dir)
        self.timeout_s = timeout_s
        self.max_concurrent = max_concurrent
        self.memory_limit = memory_limit
        self.max_rows = max_rows
        self.max_sql_bytes = MAX_SQL_BYTES if max_sql_bytes is None else max_sql_bytes
        self._running = 0
        self._lock = threading.Lock()
        self._workers = QueryWorkers(max_concurrent)  # started now, in the background

    def close(self) -> None:
        """Stop the worker processes (a query still running gets a 500)."""
        self._workers.close()

    def _enter(self) -> bool:
        with self._lock:
            if self._running >= self.max_concurrent:
                return False
            self._running += 1
            return True

    def _leave(self) -> None:
        with self._lock:
            self._running -= 1

    def run(self, sql: str, admitted: float | None = None) -> dict:
        """`query_sandbox.run_query` in a worker, stopped once it runs past `timeout_s` since
        `admitted` (time.monotonic(); now if None): QueryTimedOut."""
        deadline = (time.monotonic() if admitted is None else admitted) + self.timeout_s
        job = Job(self.data_dir, sql, self.max_rows, self.memory_limit, max(0.0, deadline - time.monotonic()))
        try:
            return self._workers.run(job, deadline)
        except QueryTimedOut:
            raise QueryTimedOut(f"the query ran longer than {self.timeout_s:g} s and was stopped") from None

    def _parse(self, body: bytes) -> str:
        try:
            sql = json.loads(body)["sql"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ValueError(f'send {{"sql": "SELECT ..."}}: {exc!r}') from None
        if not isinstance(sql, str):
            raise ValueError("'sql' must be a string")
        try:
            size = len(sql.encode("utf-8"))
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in the JSON): no UTF-8 for it
            raise ValueError(f"'sql' is not valid Unicode: {exc.reason} at character {exc.start}") from None
        if size > self.max_sql_bytes:
            raise _SqlTooLarge(f"'sql' is {size} bytes; at most {self.max_sql_bytes} are accepted")
        return sql

    def _sql_or_refusal(self, body: bytes) -> str | Reply:
        """The query's SQL, or the reply refusing the body."""
        try:
            return self._parse(body)
        except _SqlTooLarge as exc:
            return 413, {"error": str(exc)}, {}
        except ValueError as exc:
            return 400, {"error": str(exc)}, {}

    def _busy(self) -> Reply:
        return 429, {"error": f"{self.max_concurrent} queries are running; try again shortly"}, {"Retry-After": "1"}

    def _execute(self, sql: str, admitted: float) -> Reply:
        """Run `sql` in the slot the caller took, and give the slot back."""
        try:
            return 200, self.run(sql, admitted), {}
        except QueryTimedOut as exc:
            log.info("query stopped after %.1f s: %.200r", time.monotonic() - admitted, sql)
            return 504, {"error": str(exc), "timeout_s": self.timeout_s}, {}
        except QueryRefused as exc:
            return 400, {"error": str(exc)}, {}
        except WorkerLost as exc:
            log.warning("query failed: %s: %.200r", exc, sql)
            return 500, {"error": str(exc)}, {}
        finally:
            self._leave()

    def answer(self, body: bytes) -> Reply:
        """POST /v1/query on a threaded server: (status, JSON payload, extra headers)."""
        admitted = time.monotonic()
        sql = self._sql_or_refusal(body)
        if not isinstance(sql, str):
            return sql
        return self._execute(sql, admitted) if self._enter() else self._busy()

    async def answer_async(self, body: bytes, executor: Executor) -> Reply:
        """POST /v1/query on an event loop: the query runs on `executor`, a thread that only waits
        for the worker process (refusals never wait for it)."""
        admitted = time.monotonic()
        sql = self._sql_or_refusal(body)
        if not isinstance(sql, str):
            return sql
        if not self._enter():
            return self._busy()
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, self._execute, sql, admitted)
        except BaseException:
            self._leave()
            raise
        return await future
