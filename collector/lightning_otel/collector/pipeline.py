"""Background work between the write-ahead log and queryable Parquet.

- Conversion: closed WAL segments -> Parquet, in worker processes (spawned, so the receiver's
  threads and the GIL are not shared), each deleting its segment only after the files are durable.
  An export body that does not decode is quarantined (quarantine.py) and the rest of its segment
  converted; a segment whose conversion fails is retried with a growing delay, and quarantined
  whole after MAX_ATTEMPTS failures (a full disk excepted: that is retried until it clears).
- Compaction: many small files in a partition -> one file (deduplicated by trace and span id).
  The inputs are deleted only after a grace period, so a query that listed them a moment ago still
  finds them; meanwhile the `spans` view's deduplication hides the overlap.
- Retention: hour partitions older than the retention window are deleted.
- Day indexes: each day that ended compact_grace_s ago gets one (day_index.py), a few per pass.
Each Parquet file has a rollout index beside it (rollout_index.py), written with it and deleted after it.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ParamSpec, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from lightning_otel.collector import day_index, list_pages, rollout_index
from lightning_otel.collector.compaction import compact_files
from lightning_otel.collector.quarantine import describe, quarantine_records, quarantine_segment
from lightning_otel.collector.span_decoder import assemble_bodies, decode_body, keep_freed_memory
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store
from lightning_otel.collector.wal import GZIP, WriteAheadLog, read_records

log = logging.getLogger(__name__)
_P = ParamSpec("_P")
_T = TypeVar("_T")
IDLE_ROTATE_BYTES = 1024 * 1024
IDLE_ROTATE_S = 0.05
MAX_ATTEMPTS = 3  # failed conversions of one segment before it is quarantined
RETRY_DELAY_S = 1.0  # after a failed conversion; doubled after each, up to MAX_RETRY_DELAY_S
MAX_RETRY_DELAY_S = 60.0
DAY_INDEXES_PER_PASS = 4  # a store with months of days without one catches up over passes
# Failures that say nothing about the segment's data: retried (with the delay) until they clear.
_RESOURCE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.ENOMEM}


def convert_segment(
    store_uri: str, wal_path: str, segment: str, verify: bool = True
) -> tuple[int, int, dict[str, int]]:
    """WAL segment -> Parquet files, then delete the segment. Runs in a worker process.

    Each export body is decoded on its own: one that fails is quarantined (durably, before the
    segment goes) and the others are converted. Returns (rows written, bodies quarantined, files
    list_pages handed to pyarrow whole, by reason): the counts live in the worker, the receiver
    reports them."""
    store = Store(store_uri)
    fallbacks_before = list_pages.fallback_counts()
    decoded, failed = [], []
    for index, (payload, flags) in enumerate(read_records(Path(wal_path), verify)):
        try:
            decoded.append((index, payload, flags, decode_body(gzip.decompress(payload) if flags & GZIP else payload)))
        except MemoryError:
            raise  # the machine's state, not the body's: the segment is tried again (Pipeline._failed)
        except Exception as exc:  # any failure of one body is that body's: the rest still converts
            failed.append((index, payload, flags, describe(exc)))
    try:
        batches = assemble_bodies([body for *_, body in decoded])  # the segment's bodies together
    except MemoryError:
        raise
    except Exception:  # a body whose columns do not build: body by body, to quarantine that one alone
        batches = []
        for index, payload, flags, body in decoded:
            try:
                batches += assemble_bodies([body])
            except MemoryError:
                raise
            except Exception as exc:
                failed.append((index, payload, flags, describe(exc)))
        failed.sort(key=lambda record: record[0])
    if failed:
        quarantine_records(store, Path(wal_path).parent, segment, failed)
    rows = sum(b.num_rows for b in batches)
    if rows:
        store.write_segment(segment, pa.Table.from_batches(batches, SPANS_SCHEMA))
    os.unlink(wal_path)
    fallbacks = {
        reason: count - fallbacks_before.get(reason, 0)
        for reason, count in list_pages.fallback_counts().items()
        if count > fallbacks_before.get(reason, 0)
    }
    return rows, len(failed), fallbacks


@contextlib.contextmanager
def _stop_signals_blocked():
    """Workers are spawned in here: SIGINT and SIGTERM blocked in the calling thread, a mask the
    new process inherits. Those signals reach the whole process group (Ctrl-C, stop_process), and
    a worker killed mid-segment breaks the pool just as the collector drains the log into Parquet;
    the collector stops its workers itself (Pipeline.stop). Blocked, not ignored: a signal for the
    collector meanwhile is delivered once the block ends."""
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _init_worker(nice: int) -> None:
    """Runs first in each worker: a lower priority than the receiver, and freed token buffers kept."""
    os.nice(nice)
    keep_freed_memory()


def _warm_up(seconds: float) -> None:
    """Runs in each new worker: the imports above are done; hold the worker so the pool spawns all."""
    time.sleep(seconds)


class _InlineExecutor(Executor):
    """Runs work in the calling thread (workers=0): for tests and tiny deployments."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        future: Future[_T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class Pipeline:
    """Drives conversion, compaction and retention from one background thread."""

    def __init__(
        self,
        store: Store,
        wal: WriteAheadLog,
        flush_interval_s: float = 1.0,
        workers: int = 1,
        compact_min_files: int = 8,
        compact_interval_s: float = 30.0,
        compact_grace_s: float = 600.0,
        retention_hours: float | None = None,
        worker_nice: int = 0,
    ) -> None:
        self.store, self.wal = store, wal
        self.flush_interval_s = flush_interval_s
        self.compact_min_files = compact_min_files
        self.compact_interval_s = compact_interval_s
        self.compact_grace_s = compact_grace_s
        self.retention_hours = retention_hours
        self._workers, self._worker_nice = workers, worker_nice
        self.executor: Executor = self._new_executor()
        # Segments from an earlier run may end in a torn record: only their CRCs are checked.
        self._inherited = set(wal.segments())
        self._inflight: dict[str, Future] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # segment -> (failed attempts, retry after)
        self._doomed: list[tuple[float, list[str]]] = []  # (delete after, paths)
        self._unindexable: set[str] = set()  # days whose index failed to build: not retried by this run
        self._last_maintenance = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lightning-otel-pipeline", daemon=True)
        self.spans_written = 0
        self.quarantined_records = 0  # export bodies quarantined by this run
        self.quarantined_segments = 0  # whole segments quarantined by this run
        # Parquet files of this run's conversions whose list columns pyarrow wrote instead of
        # list_pages, by reason (slower, still correct); a kind is logged when first seen.
        self.list_page_fallbacks: Counter[str] = Counter()

    def _new_executor(self) -> Executor:
        if self._workers <= 0:
            return _InlineExecutor()
        return ProcessPoolExecutor(
            self._workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self._worker_nice,),
        )

    # -- conversion ------------------------------------------------------------------------------
    def _submit_closed(self, retry_now: bool = False) -> None:
        now = time.monotonic()
        for segment in self.wal.closed_segments():
            if segment in self._inflight:
                continue
            if not retry_now and self._failures.get(segment, (0, 0.0))[1] > now:
                continue  # failed a moment ago: wait for its retry time
            path = str(self.wal.path(segment))
            verify = segment in self._inherited
            with _stop_signals_blocked():  # a submit may spawn a worker
                self._inflight[segment] = self.executor.submit(convert_segment, self.store.uri, path, segment, verify)

    def _collect(self, wait: bool) -> None:
        broken = self.executor
        for segment, future in list(self._inflight.items()):
            if not wait and not future.done():
                continue
            del self._inflight[segment]
            try:
                rows, quarantined, fallbacks = future.result()
            except Exception as exc:
                if isinstance(exc, BrokenProcessPool) and self.executor is broken:
                    # a worker died (killed, out of memory): a new pool; the segment counts an attempt
                    self.executor.shutdown(wait=False)
                    self.executor = self._new_executor()
                self._failed(segment, exc)
                continue
            self._failures.pop(segment, None)
            self.spans_written += rows
            for reason, count in fallbacks.items():
                if not self.list_page_fallbacks[reason]:
                    log.warning(
                        "WAL segment %s: list columns written by pyarrow, not list_pages (%s); such"
                        " files convert slower (Pipeline.list_page_fallbacks counts them, this is logged once)",
                        segment,
                        reason,
                    )
                self.list_page_fallbacks[reason] += count
            if quarantined:
                self.quarantined_records += quarantined
                log.warning(
                    "WAL segment %s: %d export(s) could not be decoded and are quarantined (reasons in %s)",
                    segment,
                    quarantined,
                    f"{self.store.root}/quarantine/{segment}.json",
                )

    def _failed(self, segment: str, error: BaseException) -> None:
        """A conversion failed: retry later, or quarantine the segment after MAX_ATTEMPTS; log once."""
        attempts = self._failures.get(segment, (0, 0.0))[0] + 1
        resource = isinstance(error, OSError) and error.errno in _RESOURCE_ERRNOS
        if attempts >= MAX_ATTEMPTS and not resource:
            self._failures.pop(segment, None)
            try:
                target = quarantine_segment(self.store, self.wal.path(segment), segment, describe(error))
            except OSError as exc:
                log.warning("could not quarantine WAL segment %s (%s); retrying it later", segment, describe(exc))
                self._failures[segment] = (attempts, time.monotonic() + MAX_RETRY_DELAY_S)
                return
            self.quarantined_segments += 1
            log.warning(
                "WAL segment %s failed to convert %d times (%s): quarantined in %s",
                segment,
                attempts,
                describe(error),
                target,
            )
            return
        delay = min(RETRY_DELAY_S * 2 ** (attempts - 1), MAX_RETRY_DELAY_S)
        self._failures[segment] = (attempts, time.monotonic() + delay)
        if attempts == 1:
            log.warning("could not convert WAL segment %s (%s); retrying it", segment, describe(error))

    def flush(self) -> None:
        """Everything acknowledged so far becomes queryable before this returns, but for what is
        quarantined or failed to convert just now (then retried later, see `_failed`)."""
        with self._lock:
            self.wal.rotate()
            self._submit_closed(retry_now=True)
            self._collect(wait=True)

    # -- maintenance -------------------------------------------------------------------------------
    def compact(self, now: float | None = None) -> int:
        """Compact partitions with enough small files; returns the number of new files."""
        by_dir: dict[str, list[pafs.FileInfo]] = defaultdict(list)
        for info in self.store.files():
            by_dir[info.path.rsplit("/", 1)[0]].append(info)
        current_hour = datetime.now(UTC).strftime("date=%Y-%m-%d/hour=%H")
        doomed = {p for _, paths in self._doomed for p in paths}
        jobs = []
        for directory, infos in by_dir.items():
            live = [i for i in infos if i.path not in doomed]
            closed = not directory.endswith(current_hour)
            # Live partitions: merge new part files only. Closed ones: everything into one file.
            inputs = live if closed else [i for i in live if i.base_name.startswith("part-")]
            if len(inputs) >= (2 if closed else self.compact_min_files):
                paths = sorted(i.path for i in inputs)
                with _stop_signals_blocked():
                    jobs.append((paths, self.executor.submit(compact_files, self.store.uri, paths, directory)))
        made = 0
        for paths, future in jobs:
            try:
                future.result()
                self._doomed.append(((now or time.monotonic()) + self.compact_grace_s, paths))
                made += 1
            except Exception:
                log.exception("compaction of %d files failed", len(paths))
        return made

    def delete_doomed(self, now: float | None = None) -> None:
        now = now or time.monotonic()
        due = [paths for when, paths in self._doomed if when <= now]
        self._doomed = [(when, paths) for when, paths in self._doomed if when > now]
        for paths in due:
            for path in paths:
                # The file, then its rollout index: a sidecar left by a crash between is ignored.
                for doomed in (path, rollout_index.sidecar_path(path)):
                    try:
                        self.store.fs.delete_file(doomed)
                    except FileNotFoundError:
                        pass

    def apply_retention(self) -> int:
        """Delete hour partitions that ended before now - retention; returns how many."""
        if self.retention_hours is None:
            return 0
        cutoff = datetime.now(UTC) - timedelta(hours=self.retention_hours)
        removed, emptied = 0, set()
        selector = pafs.FileSelector(self.store.spans_root, recursive=True, allow_not_found=True)
        for info in self.store.fs.get_file_info(selector):
            if info.type != pafs.FileType.Directory or not info.base_name.startswith("hour="):
                continue
            date = info.path.rsplit("/", 2)[-2]
            try:
                start = datetime.strptime(f"{date[5:]} {info.base_name[5:]}", "%Y-%m-%d %H").replace(tzinfo=UTC)
            except ValueError:
                continue
            if start + timedelta(hours=1) <= cutoff:
                self.store.fs.delete_dir(info.path)
                removed += 1
                emptied.add(info.path.rsplit("/", 1)[0])
        for day_dir in emptied:  # a day with no hour left: its day index (day_index.py) goes with it
            children = self.store.fs.get_file_info(pafs.FileSelector(day_dir, allow_not_found=True))
            if not any(child.type == pafs.FileType.Directory for child in children):
                self.store.fs.delete_dir(day_dir)
        return removed

    def index_days(self, now: datetime | None = None) -> int:
        """Build the day indexes (day_index.py) missing for days that ended compact_grace_s before `now`
        (their hours compacted), newest first, at most DAY_INDEXES_PER_PASS; returns how many."""
        ended_before = (now or datetime.now(UTC)) - timedelta(seconds=self.compact_grace_s)
        days = day_index.unindexed_days(self.store, ended_before, DAY_INDEXES_PER_PASS, self._unindexable)
        with _stop_signals_blocked():
            jobs = [(day, self.executor.submit(day_index.build_day_index_at, self.store.uri, day)) for day in days]
        built = 0
        for day, future in jobs:
            try:
                built += future.result()  # False: a file arrived meanwhile; the next pass tries again
            except Exception as exc:  # a file no reader accepts, say: lookups list the day, as without one
                log.warning("could not build the day index of %s (%s)", day, describe(exc))
                if not isinstance(exc, BrokenProcessPool):
                    self._unindexable.add(day)
        return built

    def maintain(self) -> None:
        with self._lock:
            self.compact()
            self.delete_doomed()
            self.apply_retention()
            self.index_days()

    # -- lifecycle -------------------------------------------------------------------------------
    def _run(self) -> None:
        # Segments closed by size are handed to a worker within ~0.05 s; the active segment is
        # closed by time every flush_interval_s, which bounds how stale queries can be, or as soon
        # as exports pause once it holds IDLE_ROTATE_BYTES: the end of a burst is queryable at
        # once, while a trickle of small exports still shares one segment (and file) per interval.
        last_rotation = time.monotonic()
        while not self._stop.wait(min(0.05, self.flush_interval_s)):
            try:
                with self._lock:
                    active = self.wal.active_idle()
                    idle = active is not None and active[0] >= IDLE_ROTATE_BYTES and active[1] >= IDLE_ROTATE_S
                    if idle or time.monotonic() - last_rotation >= self.flush_interval_s:
                        self.wal.rotate()
                        last_rotation = time.monotonic()
                    self._submit_closed()
                    self._collect(wait=False)
                if time.monotonic() - self._last_maintenance >= self.compact_interval_s:
                    self._last_maintenance = time.monotonic()
                    self.maintain()
            except Exception:
                log.exception("pipeline round failed")

    def start(self) -> Pipeline:
        if isinstance(self.executor, ProcessPoolExecutor):
            # Workers spawn lazily and take seconds to import pyarrow: start them all now, not
            # when the first burst of exports is already waiting.
            with _stop_signals_blocked():
                for _ in range(self.executor._max_workers):  # type: ignore[attr-defined]  # typeshed omits the pool size
                    self.executor.submit(_warm_up, 0.5)
        self.flush()  # replay what a previous run left in the log
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()
        self.executor.shutdown(wait=True)
