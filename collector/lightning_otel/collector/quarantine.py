"""Where acknowledged exports go when they cannot become Parquet, so that nothing is retried forever.

An export body that the converter cannot decode, or a whole WAL segment whose conversion failed
MAX_ATTEMPTS times, is moved aside with its reason:
    WAL_DIR/quarantine/<segment>.wal      the records themselves, in the log's own format: moved
                                          back into WAL_DIR, the next start converts them again
    DATA_DIR/quarantine/<segment>.json    one JSON object per quarantined record or segment:
                                          segment, record (its index, null: the whole segment),
                                          bytes, reason, quarantined_at, raw_file
The reasons sit in the store, so SQL reads them where it reads spans (docs/sql.md):
    SELECT * FROM read_json('DATA_DIR/quarantine/*.json')
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from lightning_otel.collector.store import Store
from lightning_otel.collector.wal import fsync_path, read_records, record_bytes

QUARANTINE_DIR = "quarantine"
MAX_REASON_CHARS = 500  # a reason quotes the failing value at most this far: it goes to the log too


def describe(error: BaseException) -> str:
    """`Type: message`, cut to MAX_REASON_CHARS (a message may quote a 10 MB attribute)."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def raw_dir(wal_dir: str | os.PathLike) -> Path:
    return Path(wal_dir) / QUARANTINE_DIR


def reasons_path(store: Store, segment: str) -> str:
    return f"{store.root.rstrip('/')}/{QUARANTINE_DIR}/{segment}.json"


def _reason(segment: str, record: int | None, size: int, reason: str, raw_file: Path) -> dict:
    return {
        "segment": segment,
        "record": record,
        "bytes": size,
        "reason": reason,
        "quarantined_at": datetime.now(UTC).isoformat(),
        "raw_file": str(raw_file),
    }


def _write_reasons(store: Store, segment: str, reasons: list[dict]) -> None:
    text = "".join(json.dumps(reason) + "\n" for reason in reasons).encode()
    path = reasons_path(store, segment)
    directory = path.rsplit("/", 1)[0]
    store.fs.create_dir(directory, recursive=True)
    if not store.is_local:
        with store.fs.open_output_stream(path) as stream:  # an object appears whole
            stream.write(text)
        return
    tmp = f"{directory}/.{segment}.json.tmp"
    with open(tmp, "wb") as handle:
        handle.write(text)
        os.fsync(handle.fileno())
    os.replace(tmp, path)  # a reader's glob never sees half a file
    fsync_path(directory)


def quarantine_records(store: Store, wal_dir: str | os.PathLike, segment: str, failed: list[tuple]) -> Path:
    """Copy the records `failed` ((index, payload, flags, reason) each) of `segment` aside, durably,
    before the segment is deleted. Doing it again (a crash before the delete) rewrites the same files."""
    directory = raw_dir(wal_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{segment}.wal"
    tmp = directory / f".{segment}.wal.tmp"
    with open(tmp, "wb") as handle:
        for _, payload, flags, _ in failed:
            handle.write(record_bytes(payload, flags))
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    fsync_path(directory)
    _write_reasons(store, segment, [_reason(segment, i, len(p), reason, target) for i, p, _, reason in failed])
    return target


def quarantine_segment(store: Store, wal_path: str | os.PathLike, segment: str, reason: str) -> Path:
    """Move a whole segment aside (its conversion kept failing); returns where it went."""
    source = Path(wal_path)
    directory = raw_dir(source.parent)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.name
    size = source.stat().st_size
    _write_reasons(store, segment, [_reason(segment, None, size, reason, target)])
    os.replace(source, target)  # same file system: the log's own directory
    fsync_path(directory)
    fsync_path(source.parent)
    return target


@dataclass
class Summary:
    files: int
    records: int
    directory: Path


def summary(wal_dir: str | os.PathLike) -> Summary:
    """What the quarantine holds now: files and the export records in them."""
    directory = raw_dir(wal_dir)
    files = sorted(directory.glob("*.wal")) if directory.is_dir() else []
    records = sum(sum(1 for _ in read_records(path, verify=False)) for path in files)
    return Summary(len(files), records, directory)
