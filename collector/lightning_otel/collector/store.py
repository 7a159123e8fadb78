"""The Parquet trace store, on a local directory or object storage (s3://bucket/prefix).

Layout (Hive partitioning, readable as is by DuckDB, Spark, Trino, ClickHouse):
    ROOT/spans/_schema.parquet                                  zero rows, the full schema
    ROOT/spans/service=<svc>/date=YYYY-MM-DD/hour=HH/part-<WAL segment>.parquet
    ROOT/spans/service=<svc>/date=YYYY-MM-DD/hour=HH/compact-<id>.parquet
    ROOT/spans/.../<name>.rollouts      beside each <name>.parquet: a filter of its rollout and trace ids (rollout_index.py)
    ROOT/spans/service=<svc>/date=YYYY-MM-DD/day.rollouts, day.confirmed   the day's filter (day_index.py)

<svc> is the service name itself when it is short and made of letters, digits, `-` and `_` only;
any other name becomes those of its characters (at most _PREFIX_CHARS), `~` and a hash of the whole
name (see `partition_value`): service.name comes from the exporter, and no value of it may make a
path that a file system, or a reader that decodes percent-escapes (DuckDB does), takes for
something else. The rows' `service_name` column always holds the name as sent; the partition value
only places the file.
A WAL segment's files are named after it, so converting the same segment twice (a crash between
writing Parquet and deleting the segment) rewrites the same files instead of adding rows.
Locally, files are written under a temporary name that does not end in .parquet and renamed into
place, so a reader's glob never sees half a file; object stores make a PUT visible only whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lightning_otel.collector import day_index, list_pages, rollout_index
from lightning_otel.collector.span_rows import LISTS, SPANS_SCHEMA
from lightning_otel.collector.wal import fsync_path

SPANS_DIR = "spans"
SCHEMA_FILE = "_schema.parquet"
_HOUR_US = 3_600 * 1_000_000
# A path component is at most 255 bytes on common file systems (and object-store keys have limits
# of their own): a partition value is kept well below that, whatever the service name.
PARTITION_VALUE_MAX = 96
_PREFIX_CHARS = 64
# Parquet settings chosen by bench/collector_ingest.py (BENCHMARKS.md): dictionaries only where
# values repeat, statistics only where queries filter, zstd for text, none for token/logprob
# arrays (near-incompressible; compressing them halved throughput for little space).
_DICTIONARY_COLUMNS = [
    "name",
    "kind",
    "status_code",
    "service_name",
    "scope_name",
    "span_kind",
    "model_name",
    "tool_name",
    "task_id",
    "reward_name",
    "policy_version",
    "finish_reason",
    "attributes.key_value.key",
    "resource_attributes.key_value.key",
    "resource_attributes.key_value.value",
]
_STATISTICS_COLUMNS = [
    "trace_id",
    "span_id",
    "start_time",
    "end_time",
    "service_name",
    "span_kind",
    "rollout_id",
    "task_id",
    "policy_version",
]
LIST_COLUMNS = [column for column, *_ in LISTS]
_UNCOMPRESSED = {
    "prompt_token_ids.list.element",
    "completion_token_ids.list.element",
    "completion_logprobs.list.element",
}


def _leaf_columns() -> list[str]:
    sink = pa.BufferOutputStream()
    pq.write_table(SPANS_SCHEMA.empty_table(), sink)
    parquet_schema = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    return [parquet_schema.column(i).path for i in range(len(parquet_schema))]


_LEAVES = _leaf_columns()


def _write_options(codec: str, **extra) -> dict:
    """Parquet settings with `codec` for every column but the token/logprob arrays."""
    return dict(
        use_dictionary=_DICTIONARY_COLUMNS,
        write_statistics=_STATISTICS_COLUMNS,
        compression={c: ("none" if c in _UNCOMPRESSED else codec) for c in _LEAVES},
        **extra,
    )


# Compacted files (where data lives for good): zstd, about half the size of snappy here.
WRITE_OPTIONS = _write_options("zstd", compression_level={c: 1 for c in _LEAVES if c not in _UNCOMPRESSED})
# Files written straight from the write-ahead log are on the ingest path and are compacted soon:
# snappy encodes the text columns in ~60% of zstd-1's time (8.4 vs 13.8 us per observability span).
LIVE_WRITE_OPTIONS = _write_options("snappy")


_PARTITION_HOUR = re.compile(r"/date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})/[^/]+$")


class Store:
    """Where the Parquet files live: a local directory or an object-store URI (pyarrow.fs)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.uri = str(root)
        self.is_local = "://" not in self.uri
        if self.is_local:
            self.fs: pafs.FileSystem = pafs.LocalFileSystem()
            self.root = os.path.abspath(self.uri)
        else:
            self.fs, self.root = pafs.FileSystem.from_uri(self.uri)
        self.spans_root = f"{self.root.rstrip('/')}/{SPANS_DIR}"

    def glob(self) -> str:
        """The pattern readers give to read_parquet."""
        return f"{self._reader_prefix()}/**/*.parquet"

    def _reader_prefix(self) -> str:
        return self.spans_root if self.is_local else f"{self.uri.split('://')[0]}://{self.spans_root}"

    def _reader_name(self, path: str) -> str:
        return self._reader_prefix() + path[len(self.spans_root) :]

    def files_since(self, since: datetime) -> list[str]:
        """The files (as readers name them) of the hour partitions that end after `since`: every span
        that started at or after it is in one of them. A file outside the date/hour layout is kept."""
        return sorted(
            self._reader_name(info.path)
            for info in self._listing(since)
            if _is_span_file(info) and _from_hour(info.path, since)
        )

    def indexed_files(
        self, since: datetime | None = None, listed: list[pafs.FileInfo] | None = None
    ) -> tuple[list[str], list[tuple[str, int, bytes | None]]]:
        """Listed once (or of `listed`), no span file opened: the schema file (if any), and each span file
        (with `since`, of files_since's partitions) as readers name it, with its size and its rollout
        index's bytes (rollout_index.py; None: it has none)."""
        listed = self._listing(since) if listed is None else listed
        sidecars = {info.path for info in listed if info.base_name.endswith(rollout_index.SUFFIX)}
        schema_files, span_files = [], []
        for info in sorted(listed, key=lambda info: info.path):
            if info.base_name == SCHEMA_FILE:
                schema_files.append(self._reader_name(info.path))
            elif _is_span_file(info) and (since is None or _from_hour(info.path, since)):
                sidecar = rollout_index.sidecar_path(info.path)
                index = self._read(sidecar) if sidecar in sidecars else None
                span_files.append((self._reader_name(info.path), info.size, index))
        return schema_files, span_files

    def _read(self, path: str) -> bytes | None:
        """A small file's bytes; None if it is gone (deleted since the listing)."""
        try:
            if self.is_local:
                with open(path, "rb") as handle:
                    return handle.read()
            with self.fs.open_input_stream(path) as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def _write_rollout_index(self, path: str, table: pa.Table, size: int) -> None:
        """The sidecar of the Parquet file at `path` (of `size` bytes, holding `table`): a filter of its
        rollout and trace ids (rollout_index.table_keys). Not fsynced: a sidecar torn by a crash fails
        may_hold's checks, and its file is then read."""
        keys = rollout_index.table_keys(table)
        sidecar = rollout_index.sidecar_path(path)
        if self.is_local:
            tmp = _tmp_path(sidecar)
            with open(tmp, "wb") as handle:
                handle.write(rollout_index.encode(keys, size))
            os.replace(tmp, sidecar)
        else:
            with self.fs.open_output_stream(sidecar) as stream:
                stream.write(rollout_index.encode(keys, size))

    def write(
        self,
        table: pa.Table,
        path: str,
        options: dict | None = None,
        list_columns: Sequence[str] = (),
        indexed: bool = False,
    ) -> None:
        """Write `table` to `path` whole; `list_columns` (flat lists) go through list_pages when it can.
        `indexed`: a span file, with its rollout index (rollout_index.py) beside it; locally the index
        is in place before the file, so no reader lists the file without it. The day's index (day_index.py)
        is deleted before the file is written and again once it is in place."""
        options = options or WRITE_OPTIONS
        day_index.invalidate(self, path)  # before and after the file is in place (day_index.py)
        parts = list_pages.encode(table, list_columns, **options) if list_columns else None
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = _tmp_path(path)
            if parts is None:
                pq.write_table(table, tmp, **options)
                with open(tmp, "rb") as handle:
                    os.fsync(handle.fileno())
            else:
                _write_parts(tmp, parts)
            if indexed:
                self._write_rollout_index(path, table, os.path.getsize(tmp))
            os.replace(tmp, path)
            fsync_path(os.path.dirname(path))  # the rename must be durable before the WAL segment goes
            day_index.invalidate(self, path)
            return
        if parts is None:
            pq.write_table(table, path, filesystem=self.fs, **options)
        else:
            with self.fs.open_output_stream(path) as stream:
                for part in parts:
                    stream.write(part)
        if indexed:  # an object store has no rename: the index follows the file
            self._write_rollout_index(path, table, self.fs.get_file_info(path).size)
        day_index.invalidate(self, path)

    def ensure_schema_file(self) -> None:
        path = f"{self.spans_root}/{SCHEMA_FILE}"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            self.write(SPANS_SCHEMA.empty_table(), path)

    def partition_dir(self, service: str | None, hour: int) -> str:
        when = datetime.fromtimestamp(hour * 3600, tz=UTC)
        return f"{self.spans_root}/service={partition_value(service)}/date={when:%Y-%m-%d}/hour={when:%H}"

    def files(self) -> list[pafs.FileInfo]:
        return [info for info in self._listing() if _is_span_file(info)]

    def _listing(self, since: datetime | None = None) -> list[pafs.FileInfo]:
        """Every file under spans/ (span files, the schema file, rollout indexes, temporary files).
        With `since`, the `date=` directories of days before `since`'s (UTC) are skipped whole, so
        the cost follows the window, not the store's age; everything else is listed."""
        if since is None:
            return self.files_under(self.spans_root)
        listed, days = self.day_dirs(since)
        return listed + [info for day in days for info in self.files_under(day)]

    def day_dirs(self, since: datetime | None = None) -> tuple[list[pafs.FileInfo], list[str]]:
        """Every file under spans/ outside the `date=` directories (listed), and those directories
        (with `since`, of its UTC day and later), not listed."""
        first_day = None if since is None else f"date={since.astimezone(UTC):%Y-%m-%d}"
        listed, days = [], []
        for top in self._entries(self.spans_root):
            if top.type == pafs.FileType.File:
                listed.append(top)
            if top.type != pafs.FileType.Directory:
                continue
            for entry in self._entries(top.path):
                if entry.type == pafs.FileType.File:
                    listed.append(entry)
                elif not day_index.DATE_DIR.fullmatch(entry.base_name):
                    listed += self.files_under(entry.path)
                elif first_day is None or entry.base_name >= first_day:
                    days.append(entry.path)
        return listed, days

    def _entries(self, path: str) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))

    def files_under(self, path: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        return [info for info in self.fs.get_file_info(selector) if info.type == pafs.FileType.File]

    def has_data(self) -> bool:
        return self.fs.get_file_info(f"{self.spans_root}/{SCHEMA_FILE}").type == pafs.FileType.File or bool(
            self.files()
        )

    def write_segment(self, segment: str, table: pa.Table) -> list[str]:
        """Write one converted WAL segment, split by service and hour of span start."""
        if len(table) == 0:
            return []
        hours_array = pc.divide(table.column("start_time").cast(pa.int64()).fill_null(0), _HOUR_US)
        services_array = table.column("service_name")
        hour_range = pc.min_max(hours_array)
        # Rows go to their partition directory, not to their service name: names that share a
        # directory (no service and "unknown") must not overwrite each other's file.
        by_directory: Mapping[str, list[int] | None]
        if hour_range["min"] == hour_range["max"] and pc.count_distinct(services_array, mode="all").as_py() == 1:
            # The usual segment: one service, one hour. No per-row Python to find that out.
            by_directory = {self.partition_dir(services_array[0].as_py(), hour_range["min"].as_py()): None}
        else:
            directories: dict[tuple, str] = {}  # (service, hour) -> directory, worked out once each
            rows_of: defaultdict[str, list[int]] = defaultdict(list)
            for row, key in enumerate(zip(services_array.to_pylist(), hours_array.to_pylist())):
                if key not in directories:
                    directories[key] = self.partition_dir(*key)
                rows_of[directories[key]].append(row)
            by_directory = rows_of
        written = []
        for directory, rows in sorted(by_directory.items()):
            path = f"{directory}/part-{segment}.parquet"
            part = table if rows is None else table.take(pa.array(rows))
            self.write(part, path, LIVE_WRITE_OPTIONS, lists_with_values(part), indexed=True)
            written.append(path)
        return written


def _is_span_file(info: pafs.FileInfo) -> bool:
    return info.base_name.endswith(".parquet") and info.base_name != SCHEMA_FILE


def _tmp_path(path: str) -> str:
    """Where a local file is written before its rename to `path` (hidden; this process and thread's)."""
    return f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}-{threading.get_ident()}.tmp"


def _from_hour(path: str, since: datetime) -> bool:
    """Whether the file at `path` is in an hour partition that ends after `since` (or in none)."""
    match = _PARTITION_HOUR.search(path)
    floor = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None)
    return match is None or datetime.fromisoformat(f"{match[1]}T{match[2]}:00") >= floor


def partition_value(service: str | None) -> str:
    """The `service=` directory name for a service name (no name: `unknown`). A name of at most
    PARTITION_VALUE_MAX letters, digits, `-` and `_` is itself; any other is its first _PREFIX_CHARS
    such characters, `~` and 16 hex digits of the whole name's SHA-256. `~` is in no plain value, so
    a hashed name never shares a directory with a plain one; no value holds `.`, `/`, `%` or `=`."""
    name = "unknown" if service is None else service
    if name and len(name) <= PARTITION_VALUE_MAX and _PLAIN.fullmatch(name):
        return name
    prefix = "".join(_PLAIN_CHAR.findall(name))[:_PREFIX_CHARS]
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{prefix}~{digest}"


_PLAIN_CHAR = re.compile(r"[A-Za-z0-9_-]")
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")


def lists_with_values(table: pa.Table) -> list[str]:
    """The token/logprob columns for list_pages: those with values. All-null ones (observability
    spans) cost pyarrow next to nothing, so they stay with it."""
    return [column for column in LIST_COLUMNS if table.column(column).null_count < len(table)]


def _write_parts(path: str, parts: list) -> None:
    """Write buffers to a new file in order, then fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        views = [view for view in (memoryview(part).cast("B") for part in parts) if len(view)]
        first = 0  # the first view not yet written whole (an index: popping the list's front is quadratic)
        while first < len(views):
            done = os.writev(fd, views[first : first + 1024])  # IOV_MAX
            while first < len(views) and done >= len(views[first]):
                done -= len(views[first])
                first += 1
            if done:  # a short write ended inside this view
                views[first] = views[first][done:]
        os.fsync(fd)
    finally:
        os.close(fd)
