"""The Parquet trace store: DATA/spans/date=YYYY-MM-DD/hour=HH/part-<WAL segment>.parquet (zstd).

Files are written under a temporary name and renamed into place, so a reader's glob never
sees half a file. A segment's file names are fixed by its id, so converting the same WAL
segment twice (a crash between writing Parquet and deleting the segment) rewrites the same
files instead of adding duplicates.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lightning_otel.collector.spans_table import SPANS_SCHEMA, decode_request, to_table
from lightning_otel.collector.wal import WriteAheadLog

log = logging.getLogger(__name__)
SPANS_DIR = "spans"
SCHEMA_FILE = "_schema.parquet"  # zero rows, full schema: views always have a file to bind to
_HOUR_US = 3_600 * 1_000_000


def spans_dir(data_dir: str | Path) -> Path:
    return Path(data_dir) / SPANS_DIR


def _write_atomic(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The temporary name must not end in .parquet, or a reader's glob could pick it up.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def ensure_schema_file(data_dir: str | Path) -> Path:
    path = spans_dir(data_dir) / SCHEMA_FILE
    if not path.exists():
        _write_atomic(SPANS_SCHEMA.empty_table(), path)
    return path


def write_segment(data_dir: str | Path, segment: str, table: pa.Table) -> list[Path]:
    """Write one converted WAL segment, split into hourly partitions by span start time."""
    starts = table.column("start_time").cast(pa.int64()).to_pylist()
    by_hour: dict[int, list[int]] = defaultdict(list)
    for row, start in enumerate(starts):
        by_hour[(start or 0) // _HOUR_US].append(row)
    written = []
    for hour, indices in sorted(by_hour.items()):
        when = datetime.fromtimestamp(hour * 3600, tz=timezone.utc)
        path = spans_dir(data_dir) / f"date={when:%Y-%m-%d}" / f"hour={when:%H}" / f"part-{segment}.parquet"
        _write_atomic(table.take(pa.array(indices)), path)
        written.append(path)
    return written


class SegmentConverter:
    """Background thread: every `interval_s`, rotate the WAL and turn closed segments into Parquet."""

    def __init__(self, data_dir: str | Path, wal: WriteAheadLog, interval_s: float = 1.0) -> None:
        self.data_dir = Path(data_dir)
        self.wal = wal
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lightning-otel-parquet", daemon=True)
        self._convert_lock = threading.Lock()

    def convert_closed(self) -> int:
        """Convert every closed segment; returns spans written. Failed segments stay for a retry."""
        written = 0
        with self._convert_lock:
            for segment in self.wal.closed_segments():
                try:
                    table = to_table(decode_request(body) for body in self.wal.read(segment))
                    if table.num_rows:
                        write_segment(self.data_dir, segment, table)
                    self.wal.remove(segment)
                    written += table.num_rows
                except Exception:  # noqa: BLE001 - keep the segment, keep serving, say why
                    log.exception("could not convert WAL segment %s; keeping it for a retry", segment)
        return written

    def flush(self) -> int:
        self.wal.rotate()
        return self.convert_closed()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def start(self) -> "SegmentConverter":
        self.convert_closed()  # replay what a previous run left in the log
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()
