"""POST /v1/query statements run in worker processes, so their CPU and GIL time never blocks the
server that received them.

DuckDB holds the GIL while it parses (`duckdb.extract_statements` on a 4 MB `SELECT ((((...))))`
held it for 10-27 s, and the collector acknowledged no export meanwhile) and an in-process time
limit cannot stop it there. Here the whole statement (parse, plan, run, fetch:
query_sandbox.run_query) runs in a worker process, forked from a forkserver that has DuckDB imported.
Its time limit is enforced twice: inside the worker, DuckDB's interrupt() when it passes (the worker
stays and serves the next query); from the server, a worker that has not answered `KILL_GRACE_S`
after the limit is killed and replaced. `size` workers are kept (the server's cap on queries at
once); they are started in the background as soon as the pool exists and again after a kill.

Only this module's `_serve` (and what it imports) runs in a worker; the server side imports no
DuckDB from here.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)
KILL_GRACE_S = 0.5
_SANDBOX_MODULE = "lightning_otel.collector.query_sandbox"


class QueryTimedOut(Exception):
    """The query ran past the time limit and was stopped."""


class QueryRefused(ValueError):
    """Not one read-only query, or a failing one: the client's 400."""


class WorkerLost(RuntimeError):
    """The worker process died while running the query, or could not be started."""


@dataclass(frozen=True)
class Job:
    data_dir: str
    sql: str
    max_rows: int
    memory_limit: str
    timeout_s: float  # what is left of the time limit when the worker receives it
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))  # the server's, as it is now
    rollout_ids: tuple[str, ...] | None = None  # checked (query_limits.rollout_ids_of); None: the whole store


# Worker process ---------------------------------------------------------------------------------


class _Deadline:
    """Interrupts the connection it holds once `timeout_s` have passed since it was made."""

    def __init__(self, timeout_s: float) -> None:
        self.fired = False
        self._conn = None
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
    def hold(self, conn) -> Iterator[None]:
        import duckdb

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


def _answer(job: Job) -> tuple[str, object]:
    """("rows", reply) | ("refused", message) | ("timeout", None) | ("failed", message)."""
    import duckdb

    from lightning_otel.collector.query_sandbox import run_query, scrub_error

    # Object-store credentials and endpoints come from the environment: the server's at this query,
    # not the forkserver's when it started.
    if os.environ != job.environ:
        os.environ.clear()
        os.environ.update(job.environ)
    deadline = _Deadline(job.timeout_s)
    try:
        rows = run_query(
            job.data_dir, job.sql, job.max_rows, job.memory_limit, watch=deadline.hold, rollout_ids=job.rollout_ids
        )
        return "rows", rows
    except (ValueError, duckdb.Error) as exc:
        return ("timeout", None) if deadline.fired else ("refused", scrub_error(str(exc), job.data_dir))
    except Exception as exc:  # a bug here, not the client's: the server answers 500
        return "failed", scrub_error(f"{type(exc).__name__}: {exc}", job.data_dir)
    finally:
        deadline.cancel()


def _serve(pipe: Connection) -> None:
    """A worker's life: answer jobs until the server closes the pipe or sends None."""
    importlib.import_module(_SANDBOX_MODULE)  # before "ready": not on a query's clock
    pipe.send("ready")
    while True:
        try:
            job = pipe.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        outcome = _answer(job)
        try:
            pipe.send(outcome)
        except Exception as exc:  # a value that does not pickle
            pipe.send(("failed", f"cannot send the rows back: {exc!r}"))


# Server side ------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, context) -> None:
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), name="lightning-otel-query", daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.pipe.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.pipe.send(None)
        self.process.join(1)
        if self.process.is_alive():
            self.kill()
        self.pipe.close()


def _stop_all(workers: set[_Worker]) -> None:
    for worker in list(workers):
        worker.kill()


class QueryWorkers:
    """`size` worker processes; `run(job, deadline)` runs one job on an idle one. Callers keep to at
    most `size` jobs at once (query_limits.QueryLimiter's cap)."""

    START_TIMEOUT_S = 60.0

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        # Forked from a server process that has DuckDB imported already: a replacement for a killed
        # worker is ready in milliseconds, not the second a fresh interpreter takes to import it.
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload([_SANDBOX_MODULE])
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._starting = 0
        self._closed = False
        self._start_failure: str | None = None
        self._ready = threading.Condition()
        weakref.finalize(self, _stop_all, self._all)
        self._replenish()

    def _replenish(self) -> None:
        """Start workers in the background until there are `size`."""
        with self._ready:
            missing = 0 if self._closed else self.size - len(self._all) - self._starting
            self._starting += missing
        for _ in range(missing):
            threading.Thread(target=self._start_one, name="lightning-otel-query-start", daemon=True).start()

    def _start_one(self) -> None:
        worker, failure = None, None
        try:
            worker = _Worker(self._context)
            if not worker.pipe.poll(self.START_TIMEOUT_S) or worker.pipe.recv() != "ready":
                raise WorkerLost(f"no word from it in {self.START_TIMEOUT_S:g} s")
        except Exception as exc:
            log.warning("cannot start a query worker: %r", exc)
            failure = f"cannot start a query worker: {exc!r}"
            if worker is not None:
                worker.kill()
            worker = None
        with self._ready:
            self._starting -= 1
            self._start_failure = failure
            if worker is not None and not self._closed:
                self._all.add(worker)
                self._idle.append(worker)
            elif worker is not None:
                worker.stop()
            self._ready.notify_all()

    def _take(self, deadline: float) -> _Worker:
        with self._ready:  # reentrant: _replenish and _discard take it again
            while True:
                while not self._idle:
                    if self._closed:
                        raise WorkerLost("the query workers are stopped")
                    if self._starting == 0 and self._start_failure:
                        failure, self._start_failure = self._start_failure, None  # the next query tries again
                        raise WorkerLost(failure)
                    if self._starting == 0:
                        self._replenish()
                    if not self._ready.wait(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                        raise QueryTimedOut("no query worker was ready in time")
                worker = self._idle.pop()
                if worker.process.is_alive():
                    return worker
                self._discard(worker)  # died while idle (the kernel's OOM killer, a signal)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._ready:
            self._all.discard(worker)
        self._replenish()

    def run(self, job: Job, deadline: float) -> dict:
        """The rows of `job`, which must be answered by `deadline` (time.monotonic()). Raises
        QueryRefused (400), QueryTimedOut (504), WorkerLost (500)."""
        worker = self._take(deadline)
        try:
            worker.pipe.send(job)
            if not worker.pipe.poll(max(0.0, deadline - time.monotonic()) + KILL_GRACE_S):
                self._discard(worker)  # stuck where DuckDB's interrupt does not reach (parsing, planning)
                raise QueryTimedOut("killed past the deadline")
            kind, value = worker.pipe.recv()
        except (EOFError, OSError) as exc:
            code = worker.process.exitcode
            self._discard(worker)
            raise WorkerLost(f"the query worker exited (code {code})") from exc
        except BaseException:
            if worker in self._all and worker.process.is_alive() and not worker.pipe.closed:
                self._discard(worker)  # its state is unknown
            raise
        with self._ready:
            self._idle.append(worker)
            self._ready.notify_all()
        if kind == "rows":
            return value
        if kind == "refused":
            raise QueryRefused(value)
        if kind == "timeout":
            raise QueryTimedOut("interrupted at the deadline")
        raise WorkerLost(f"the query failed in its worker: {value}")

    def close(self) -> None:
        with self._ready:
            self._closed = True
            workers, self._idle = list(self._all), []
            self._all.clear()
            self._ready.notify_all()
        for worker in workers:
            worker.stop()
