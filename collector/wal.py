"""The append-only log that makes an acknowledged export durable before the reply.

Layout: DATA/wal/<segment>.wal, segments numbered upwards. A record is
    u32 length | u32 crc32(payload) | payload (the OTLP/protobuf request body)
and `append` returns only after write + fsync. A torn record at a segment's end (a crash
mid-write, never acknowledged) fails its length or CRC check and is dropped on read.

The writer thread rotates the active segment, turns closed segments into Parquet, and deletes
them; whatever segments exist at start-up are replayed the same way.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Iterator

_HEADER = struct.Struct("<II")
_SUFFIX = ".wal"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        existing = self.segments()
        self._next = (existing[-1] + 1) if existing else 1
        self._active_id: int | None = None
        self._file = None
        self._records = 0

    def path(self, segment: int) -> Path:
        return self.directory / f"{segment:012d}{_SUFFIX}"

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.directory.glob(f"*{_SUFFIX}") if p.stem.isdigit())

    def append(self, payload: bytes) -> None:
        """Write one record and fsync it. Returns only once the record is on disk."""
        header = _HEADER.pack(len(payload), zlib.crc32(payload))
        with self._lock:
            if self._file is None:
                self._active_id = self._next
                self._next += 1
                self._file = open(self.path(self._active_id), "ab")  # noqa: SIM115 - kept open
                _fsync_dir(self.directory)  # the new file's name must survive a crash too
            self._file.write(header + payload)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._records += 1

    def rotate(self) -> int | None:
        """Close the active segment (if it has records) and return its id; appends go to a new one."""
        with self._lock:
            if self._file is None:
                return None
            self._file.close()
            closed, self._file, self._active_id, self._records = self._active_id, None, None, 0
            return closed

    def closed_segments(self) -> list[int]:
        with self._lock:
            return [s for s in self.segments() if s != self._active_id]

    def read(self, segment: int) -> Iterator[bytes]:
        data = self.path(segment).read_bytes()
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, offset)
            start, end = offset + _HEADER.size, offset + _HEADER.size + length
            if end > len(data) or zlib.crc32(data[start:end]) != crc:
                return  # torn tail: never acknowledged
            yield data[start:end]
            offset = end

    def remove(self, segment: int) -> None:
        self.path(segment).unlink(missing_ok=True)

    def close(self) -> None:
        self.rotate()
