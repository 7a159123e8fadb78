"""The append-only log that makes an acknowledged export durable before the reply.

Layout: DATA/wal/<sequence>-<random>.wal. The sequence orders segments; the random part makes a
segment's name unique across restarts (an empty log restarts its sequence), because the Parquet
files a segment turns into are named after it. A record is
    u32 length | u32 crc32(payload) | payload (the OTLP/protobuf request body)
and `append` returns only after write + fsync. A torn record at a segment's end (a crash
mid-write, never acknowledged) fails its length or CRC check and is dropped on read.

The writer thread rotates the active segment, turns closed segments into Parquet, and deletes
them; whatever segments exist at start-up are replayed the same way.
"""

from __future__ import annotations

import os
import secrets
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
        self._next = int(existing[-1].split("-")[0]) + 1 if existing else 1
        self._active: str | None = None
        self._file = None

    def path(self, segment: str) -> Path:
        return self.directory / f"{segment}{_SUFFIX}"

    def segments(self) -> list[str]:
        """Segment names, oldest first."""
        return sorted(p.stem for p in self.directory.glob(f"*{_SUFFIX}") if p.stem.split("-")[0].isdigit())

    def append(self, payload: bytes) -> None:
        """Write one record and fsync it. Returns only once the record is on disk."""
        header = _HEADER.pack(len(payload), zlib.crc32(payload))
        with self._lock:
            if self._file is None:
                self._active = f"{self._next:012d}-{secrets.token_hex(4)}"
                self._next += 1
                self._file = open(self.path(self._active), "ab")  # noqa: SIM115 - kept open
                _fsync_dir(self.directory)  # the new file's name must survive a crash too
            self._file.write(header + payload)
            self._file.flush()
            os.fsync(self._file.fileno())

    def rotate(self) -> str | None:
        """Close the active segment (if any) and return its name; appends go to a new one."""
        with self._lock:
            if self._file is None:
                return None
            self._file.close()
            closed, self._file, self._active = self._active, None, None
            return closed

    def closed_segments(self) -> list[str]:
        with self._lock:
            return [s for s in self.segments() if s != self._active]

    def read(self, segment: str) -> Iterator[bytes]:
        data = self.path(segment).read_bytes()
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, offset)
            start, end = offset + _HEADER.size, offset + _HEADER.size + length
            if end > len(data) or zlib.crc32(data[start:end]) != crc:
                return  # torn tail: never acknowledged
            yield data[start:end]
            offset = end

    def remove(self, segment: str) -> None:
        self.path(segment).unlink(missing_ok=True)

    def close(self) -> None:
        self.rotate()
