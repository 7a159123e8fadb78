"""Which days can hold a rollout, known without listing them: an index per `date=` directory.

Beside a day's hour directories, `ROOT/spans/service=<svc>/date=<day>/`:
    day.rollouts    a Bloom filter of every rollout id and trace id in the day's span files
    day.confirmed   the filter's token, written once the builder saw the day's files unchanged
A lookup by rollout (rollout_lookup.py, DayListing) reads both by their known paths and skips the
day whole (no listing below it) when the filter rules out every id it looks for. A day without
both, whole and with the same token, is listed as before and its files' own indexes
(rollout_index.py) consulted. Neither name ends in `.parquet`: the store's glob never reads them.

Kept true without locks:
- a writer of a file into a day (Store.write) deletes the filter before writing it and again once
  it is in place;
- the builder (build_day_index) lists the day, reads its files' ids, writes the filter, lists the
  day again and writes the confirmation only if no file was added or replaced meanwhile.
A writer's second delete removes any filter written before it; a filter written after it comes
from a builder whose second listing holds the writer's file, so it is confirmed only if the first
listing (and so the filter) held it too. A builder that dies before confirming leaves a filter that
is never trusted. Deleting files (compaction's inputs, retention) adds no id: a filter that says
"maybe" for a deleted hour only costs a listing. A process that writes into a day without Store
must delete `day.rollouts` after its file is in place.

Format: a header line; `<token> <hashes> <blocks>`; `blocks` blocks of 64 bytes; `\\nend\\n`. A key is
rollout_index.keys' (first, step); its block is (first >> 9) % blocks, and within that block it
sets bits (first + i * step) mod 512 for i < hashes (step is odd: distinct bits), bit p being byte
p // 8's bit p % 8. One key costs one block read, so a lookup reads a few bytes of a day's filter
whatever the day's size. A filter is trusted only whole (header, length, end marker) and confirmed.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import threading
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lightning_otel.collector import rollout_index

if TYPE_CHECKING:
    from lightning_otel.collector.store import Store

INDEX_NAME = "day.rollouts"
CONFIRMED_NAME = "day.confirmed"
DATE_DIR = re.compile(r"date=(\d{4}-\d{2}-\d{2})")
BITS_PER_KEY = 16  # about 0.2% of days wrongly kept per id (tests/collector/test_day_index.py)
HASHES = 8
_BLOCK = 64
_HEADER = b"lightning-otel day index 1\n"
_CONFIRMED = b"lightning-otel day index confirmed "
_END = b"\nend\n"
_HEAD_READ = 4096  # the first read; a filter this small is read whole in it


def day_of(store: Store, path: str) -> str | None:
    """The `date=` directory that a lookup lists for the file at `path` (None: it is in none)."""
    if not path.startswith(store.spans_root + "/"):
        return None
    parts = path[len(store.spans_root) + 1 :].split("/")
    if len(parts) < 3 or not DATE_DIR.fullmatch(parts[1]):
        return None
    return f"{store.spans_root}/{parts[0]}/{parts[1]}"


def invalidate(store: Store, path: str) -> None:
    """Before and after a file is written to `path`: its day's filter goes (a confirmation left behind
    names that filter's token, which no later filter has)."""
    day = day_of(store, path)
    if day is not None:
        _delete(store, f"{day}/{INDEX_NAME}")


def _mask(first: int, step: int, hashes: int) -> int:
    position, step = first & 511, step & 511
    mask = 0
    for _ in range(hashes):
        mask |= 1 << position
        position = (position + step) & 511
    return mask


def encode(keys: list[tuple[int, int]], token: str) -> bytes:
    """A day index's bytes for `keys` (rollout_index.keys), named by `token`."""
    blocks = max(1, math.ceil(len(keys) * BITS_PER_KEY / (8 * _BLOCK)))
    filter_ = [0] * blocks
    for first, step in keys:
        filter_[(first >> 9) % blocks] |= _mask(first, step, HASHES)
    body = b"".join(value.to_bytes(_BLOCK, "little") for value in filter_)
    return _HEADER + f"{token} {HASHES} {blocks}\n".encode("ascii") + body + _END


class DayIndex:
    """One day's index as a lookup uses it: read (and checked) once, its blocks as keys need them."""

    def __init__(self, store: Store, day_dir: str) -> None:
        self.store, self.day_dir = store, day_dir
        self._head: bytes | None = None  # the trusted header line (None: not read yet)
        self._untrusted = False
        self._hashes = self._blocks = self._start = self._size = 0
        self._cached: dict[int, bytes] = {}

    def trusted(self) -> bool:
        """Whether the day's index is whole and confirmed."""
        return not self.may_hold([])

    def may_hold(self, keys: list[tuple[int, int]]) -> bool:
        """False only when the day's index is whole, confirmed and rules out every key."""
        if self._untrusted:
            return True
        if self._head is None or {(first >> 9) % self._blocks for first, _ in keys} - self._cached.keys():
            try:
                with _reading(self.store, f"{self.day_dir}/{INDEX_NAME}") as opened:
                    if opened is None or not self._check(*opened):
                        self._untrusted = True
                        return True
                    for block in {(first >> 9) % self._blocks for first, _ in keys} - self._cached.keys():
                        self._cached[block] = opened[1](self._start + block * _BLOCK, _BLOCK)
                        if len(self._cached[block]) != _BLOCK:
                            self._untrusted = True
                            return True
            except OSError:  # unreadable (a directory in its place, permissions): not trusted
                self._untrusted = True
                return True
        for first, step in keys:
            mask = _mask(first, step, self._hashes)
            if int.from_bytes(self._cached[(first >> 9) % self._blocks], "little") & mask == mask:
                return True
        return False

    def _check(self, size: int, read_at: Callable[[int, int], bytes]) -> bool:
        """Whether the open filter is whole and confirmed (or, on a later read, still the same one)."""
        head = read_at(0, min(size, _HEAD_READ))
        line_end = head.find(b"\n", len(_HEADER))
        if self._head is not None:  # read before: the same filter, or none to trust
            return size == self._size and head[: line_end + 1] == self._head
        if not head.startswith(_HEADER) or line_end < 0:
            return False
        try:
            token, hashes, blocks = head[len(_HEADER) : line_end].decode("ascii").split(" ")
            self._hashes, self._blocks = int(hashes), int(blocks)
        except ValueError:
            return False
        self._start = line_end + 1
        if (
            not re.fullmatch(r"[0-9a-f]{16}", token)
            or not 0 < self._hashes <= 16
            or self._blocks <= 0
            or size != self._start + self._blocks * _BLOCK + len(_END)
            or (head[-len(_END) :] if len(head) == size else read_at(size - len(_END), len(_END))) != _END
        ):
            return False
        with _reading(self.store, f"{self.day_dir}/{CONFIRMED_NAME}") as confirmed:
            expected = _CONFIRMED + token.encode("ascii") + b"\n"
            if confirmed is None or confirmed[0] != len(expected) or confirmed[1](0, len(expected)) != expected:
                return False
        if len(head) == size:  # read whole already: every block is at hand
            for block in range(self._blocks):
                self._cached[block] = head[self._start + block * _BLOCK : self._start + (block + 1) * _BLOCK]
        self._head, self._size = head[: line_end + 1], size
        return True


class DayListing:
    """The files a lookup lists: those outside any `date=` directory at once, and a day's only when its
    index (if any) may hold one of the keys asked for; each day listed at most once."""

    def __init__(self, store: Store, since: datetime | None = None) -> None:
        self.store = store
        self._outside, days = store.day_dirs(since)
        self._days = {day: DayIndex(store, day) for day in days}
        self._listed: set[str] = set()

    def more(self, keys: list[tuple[int, int]]) -> list[pafs.FileInfo]:
        """The files not returned before: on the first call those outside the days, then those of the
        days not yet listed whose index may hold one of `keys` (no keys: every day)."""
        found, self._outside = self._outside, []
        for day, index in self._days.items():
            if day not in self._listed and (not keys or index.may_hold(keys)):
                self._listed.add(day)
                found += self.store.files_under(day)
        return found


def build_day_index(store: Store, day_dir: str) -> bool:
    """Index the day at `day_dir` (its files' rollout and trace ids); True once the index is in place
    and confirmed, False if a file was added or replaced meanwhile (the index is then removed)."""
    before = _span_files(store, day_dir)
    keys: list[tuple[int, int]] = []
    for path in sorted(before):
        try:
            parquet = pq.ParquetFile(path, filesystem=store.fs)
        except FileNotFoundError:  # deleted since the listing: its rows are gone, not missing
            continue
        with parquet:
            names = parquet.schema_arrow.names
            columns = [name for name in ("rollout_id", "trace_id", "name") if name in names]
            table = parquet.read(columns=columns)
            if "name" in columns and "attributes" in names and rollout_index.named_diagnostics(table.column("name")):
                table = parquet.read(columns=[*columns, "attributes"])  # only the trainer's files: its diagnostics
        keys += rollout_index.table_keys(table)
    token = secrets.token_hex(8)
    _put(store, f"{day_dir}/{INDEX_NAME}", encode(keys, token))
    after = _span_files(store, day_dir)
    if any(before.get(path) != signature for path, signature in after.items()):
        _delete(store, f"{day_dir}/{INDEX_NAME}")
        return False
    _put(store, f"{day_dir}/{CONFIRMED_NAME}", _CONFIRMED + token.encode("ascii") + b"\n")
    return True


def build_day_index_at(store_uri: str, day_dir: str) -> bool:
    """build_day_index for a worker process (pipeline.Pipeline.index_days)."""
    from lightning_otel.collector.store import Store  # here: store.py imports this module

    return build_day_index(Store(store_uri), day_dir)


def unindexed_days(
    store: Store, ended_before: datetime, limit: int | None = None, skip: Collection[str] = ()
) -> list[str]:
    """The `date=` directories (but `skip`) of days that ended at or before `ended_before` and have
    no trusted index, newest first, at most `limit`. Lists no day's contents."""
    found: list[str] = []
    _, days = store.day_dirs()
    for day in sorted(days, key=lambda path: (path.rsplit("/", 1)[1], path), reverse=True):
        if limit is not None and len(found) >= limit:
            break
        try:
            began = datetime.fromisoformat(day.rsplit("/date=", 1)[1]).replace(tzinfo=UTC)
        except ValueError:  # date=2024-13-45: no day, never indexed (lookups list it)
            continue
        if began + timedelta(days=1) <= ended_before and day not in skip and not DayIndex(store, day).trusted():
            found.append(day)
    return found


def _span_files(store: Store, day_dir: str) -> dict[str, tuple[int | None, int | None]]:
    """The day's span files: path -> (size, modification time in ns)."""
    return {
        info.path: (info.size, info.mtime_ns)
        for info in store.files_under(day_dir)
        if info.base_name.endswith(".parquet")
    }


@contextlib.contextmanager
def _reading(store: Store, path: str) -> Iterator[tuple[int, Callable[[int, int], bytes]] | None]:
    """(size, read_at(offset, length)) of the file at `path` while open; None if there is none."""
    if store.is_local:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            fd = None
        if fd is None:
            yield None
            return
        try:
            yield os.fstat(fd).st_size, lambda offset, length: os.pread(fd, length, offset)
        finally:
            os.close(fd)
        return
    try:
        stream = store.fs.open_input_file(path)
    except FileNotFoundError:
        stream = None
    if stream is None:
        yield None
        return
    with stream:
        yield stream.size(), lambda offset, length: stream.read_at(length, offset)


def _put(store: Store, path: str, data: bytes) -> None:
    """Write `path` whole: locally a durable temporary file renamed into place, else one PUT."""
    if not store.is_local:
        with store.fs.open_output_stream(path) as stream:
            stream.write(data)
        return
    tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}-{threading.get_ident()}.tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _delete(store: Store, path: str) -> None:
    try:
        if store.is_local:
            os.unlink(path)
        else:
            store.fs.delete_file(path)
    except FileNotFoundError:
        pass
