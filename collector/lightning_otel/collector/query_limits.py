"""SQL from the network, bounded: a size limit, a time limit per query and a cap on queries at once.

`QueryLimiter.answer` is the whole of POST /v1/query for both servers that offer it (the
collector's and the dashboard's): it parses `{"sql": "...", "rollout_ids": [...]}` (`rollout_ids`
optional: the statement then runs over views narrowed to those rollouts, as
`connect(DATA, rollout_ids=...)` narrows them; see `rollout_ids_of`), runs the statement with
`query_sandbox.run_query` (the sandbox and its memory limit) in a query worker process
(query_worker.py: the server's GIL is never held by DuckDB), stops it when it runs past `timeout_s`
(counted from admission: parsing and planning included), and turns every outcome into
(HTTP status, JSON payload, headers): 200 the rows; 400 not one read-only query, a failing one, or
a body that is not a JSON object with a valid Unicode `sql` string (and, if present, valid
`rollout_ids`); 413 SQL text over `max_sql_bytes`; 429 + Retry-After when `max_concurrent` queries
are already running; 504 when the time limit stopped it; 500 only if a worker process died.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass

from lightning_otel.collector.config import DEFAULT_QUERY_MAX_CONCURRENT, DEFAULT_QUERY_TIMEOUT_S
from lightning_otel.collector.query_sandbox import MAX_QUERY_ROWS, QUERY_MEMORY_LIMIT
from lightning_otel.collector.query_worker import Job, QueryRefused, QueryTimedOut, QueryWorkers, WorkerLost

log = logging.getLogger(__name__)

Reply = tuple[int, dict, dict[str, str]]

# DuckDB parses ~0.5 MB of SQL per second holding a CPU: longer text is refused before any parsing.
MAX_SQL_BYTES = 1 << 20
# `rollout_ids`: a lookup of a few rollouts (the dashboard's rollout page sends one). Ingest caps no
# rollout id below an attribute's 16 MiB, so this cap is the door's own: an attribute key's
# (size_caps.MAX_KEY_BYTES), far above any id a harness makes. web/rollout.js holds the same number.
MAX_ROLLOUT_IDS = 100
MAX_ROLLOUT_ID_BYTES = 4096


def rollout_ids_of(value: object) -> tuple[str, ...]:
    """The body's `rollout_ids`, checked: a list of 1..MAX_ROLLOUT_IDS non-empty strings of valid
    Unicode, each at most MAX_ROLLOUT_ID_BYTES in UTF-8; duplicates are dropped. ValueError (the
    client's 400) for anything else, `null` included."""
    shape = f"'rollout_ids' must be a list of 1 to {MAX_ROLLOUT_IDS} rollout ids (strings)"
    if not isinstance(value, list):
        raise ValueError(f"{shape}, not {_json_type(value)}")
    if not 1 <= len(value) <= MAX_ROLLOUT_IDS:
        raise ValueError(f"{shape}, not {len(value)}")
    for position, rollout_id in enumerate(value):
        if not isinstance(rollout_id, str):
            raise ValueError(f"{shape}: item {position} is {_json_type(rollout_id)}")
        if not rollout_id:
            raise ValueError(f"'rollout_ids' item {position} is empty")
        try:
            size = len(rollout_id.encode("utf-8"))
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 for it, nor for DuckDB
            raise ValueError(
                f"'rollout_ids' item {position} is not valid Unicode: {exc.reason} at character {exc.start}"
            ) from None
        if size > MAX_ROLLOUT_ID_BYTES:
            raise ValueError(
                f"'rollout_ids' item {position} is {size} bytes; at most {MAX_ROLLOUT_ID_BYTES} are accepted"
            )
    return tuple(dict.fromkeys(value))


def _json_type(value: object) -> str:
    names = {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        dict: "an object",
    }
    return names.get(type(value), "a list" if isinstance(value, list) else type(value).__name__)


class _SqlTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class _Request:
    sql: str
    rollout_ids: tuple[str, ...] | None  # None: the whole store


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

    def run(self, sql: str, admitted: float | None = None, rollout_ids: tuple[str, ...] | None = None) -> dict:
        """`query_sandbox.run_query` in a worker, stopped once it runs past `timeout_s` since
        `admitted` (time.monotonic(); now if None): QueryTimedOut. `rollout_ids` (checked by
        `rollout_ids_of`): over the views narrowed to those rollouts."""
        deadline = (time.monotonic() if admitted is None else admitted) + self.timeout_s
        left = max(0.0, deadline - time.monotonic())
        job = Job(self.data_dir, sql, self.max_rows, self.memory_limit, left, rollout_ids=rollout_ids)
        try:
            return self._workers.run(job, deadline)
        except QueryTimedOut:
            raise QueryTimedOut(f"the query ran longer than {self.timeout_s:g} s and was stopped") from None

    def _parse(self, body: bytes) -> _Request:
        try:
            payload = json.loads(body)
            sql = payload["sql"]
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
        return _Request(sql, rollout_ids_of(payload["rollout_ids"]) if "rollout_ids" in payload else None)

    def _request_or_refusal(self, body: bytes) -> _Request | Reply:
        """The query, or the reply refusing the body."""
        try:
            return self._parse(body)
        except _SqlTooLarge as exc:
            return 413, {"error": str(exc)}, {}
        except ValueError as exc:
            return 400, {"error": str(exc)}, {}

    def _busy(self) -> Reply:
        return 429, {"error": f"{self.max_concurrent} queries are running; try again shortly"}, {"Retry-After": "1"}

    def _execute(self, request: _Request, admitted: float) -> Reply:
        """Run the query in the slot the caller took, and give the slot back."""
        sql = request.sql
        try:
            return 200, self.run(sql, admitted, request.rollout_ids), {}
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
        request = self._request_or_refusal(body)
        if not isinstance(request, _Request):
            return request
        return self._execute(request, admitted) if self._enter() else self._busy()

    async def answer_async(self, body: bytes, executor: Executor) -> Reply:
        """POST /v1/query on an event loop: the query runs on `executor`, a thread that only waits
        for the worker process (refusals never wait for it)."""
        admitted = time.monotonic()
        request = self._request_or_refusal(body)
        if not isinstance(request, _Request):
            return request
        if not self._enter():
            return self._busy()
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, self._execute, request, admitted)
        except BaseException:
            self._leave()
            raise
        return await future
