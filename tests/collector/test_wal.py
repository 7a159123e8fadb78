"""The write-ahead log and the pipeline's use of it: torn records, failed writes, early rotation."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib

import pyarrow.parquet as pq
from otlp_helpers import make_spans, request_bytes

from lightning_otel.collector.pipeline import IDLE_ROTATE_BYTES, Pipeline
from lightning_otel.collector.store import Store
from lightning_otel.collector.wal import _HEADER, WriteAheadLog, read_segment
from lightning_otel.testing.payloads import build_request


def _stored_rows(store: Store) -> int:
    return sum(pq.ParquetFile(info.path).metadata.num_rows for info in store.files())


def _body(n: int, name: str = "op") -> bytes:
    def build(tracer):
        for i in range(n):
            with tracer.start_as_current_span(f"{name}-{i}"):
                pass

    return request_bytes(make_spans(build))


def test_a_torn_record_left_by_a_crash_is_dropped_on_replay(tmp_path):
    # A crash can leave a record whose length is whole but whose bytes never reached the disk:
    # only the CRC tells. Segments inherited from an earlier run are read with their CRCs checked.
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(_body(3))
    segment = wal.rotate()
    torn = _body(2)
    with open(wal.path(segment), "ab") as handle:
        handle.write(_HEADER.pack(len(torn), zlib.crc32(torn), 0) + b"\0" * len(torn))
    assert len(list(read_segment(wal.path(segment), verify=False))) == 2  # what skipping the CRC would read
    assert len(list(read_segment(wal.path(segment)))) == 1

    store = Store(tmp_path / "data")
    pipeline = Pipeline(store, WriteAheadLog(tmp_path / "wal"), workers=0).start()  # a restart: replay
    pipeline.stop()
    assert _stored_rows(store) == 3


def test_record_checksums_are_zlibs_crc32(tmp_path):
    # The log computes its CRC-32 with a faster library; the format stays zlib's CRC-32: a record
    # written by the log carries zlib.crc32 of its payload, and one written with zlib.crc32 reads back.
    payloads = [b"", b"x", bytes(range(256)) * 40_000, _body(2)]
    wal = WriteAheadLog(tmp_path / "wal")
    for payload in payloads:
        wal.append(payload)
    segment = wal.rotate()
    data, offset = wal.path(segment).read_bytes(), 0
    for payload in payloads:
        length, crc, _ = _HEADER.unpack_from(data, offset)
        assert (length, crc) == (len(payload), zlib.crc32(payload))
        offset += _HEADER.size + length
    extra = b"written elsewhere" * 1000
    with open(wal.path(segment), "ab") as handle:
        handle.write(_HEADER.pack(len(extra), zlib.crc32(extra), 0) + extra)
    assert [bytes(p) for p in read_segment(wal.path(segment))] == [*payloads, extra]


_FAILING_WRITER = r"""
import os, resource, signal, sys
from lightning_otel.collector.wal import WriteAheadLog, read_segment
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
wal = WriteAheadLog(sys.argv[1])
wal.append(b"a" * 300_000)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, hard))
try:
    wal.append(b"b" * 300_000)  # the kernel writes up to the limit, then refuses the rest
    print("no failure")
except OSError as exc:
    print("failed", exc.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
wal.append(b"c" * 1000)
segment = wal.rotate()
print([bytes(p[:1]) for p in read_segment(wal.path(segment), verify=False)])
"""


def test_a_failed_write_is_cut_off_so_later_records_stay_readable(tmp_path):
    # A real failure from the kernel (a file size limit, as a full disk would), in a child process.
    out = subprocess.run(
        [sys.executable, "-c", _FAILING_WRITER, str(tmp_path / "wal")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("failed"), lines
    assert lines[1] == "[b'a', b'c']"  # the partial 'b' record was cut off; the next record is intact


def test_the_end_of_a_burst_is_queryable_without_waiting_for_the_flush_interval(tmp_path):
    store = Store(tmp_path / "data")
    store.ensure_schema_file()
    wal = WriteAheadLog(tmp_path / "wal")
    pipeline = Pipeline(store, wal, flush_interval_s=60.0, workers=0).start()
    try:
        small = _body(2, "small")
        wal.append(small)
        time.sleep(0.5)
        assert _stored_rows(store) == 0, "a small export waits for the flush interval (shares a file)"
        big = build_request(60, training=True)  # token arrays: over IDLE_ROTATE_BYTES
        assert len(big) + len(small) >= IDLE_ROTATE_BYTES
        wal.append(big)
        deadline = time.monotonic() + 10
        while _stored_rows(store) < 62 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stored_rows(store) == 62
    finally:
        pipeline.stop()


def test_conversion_workers_run_at_a_lower_priority(tmp_path):
    # When CPU is short, exports are acknowledged first; conversion takes the CPU left over.
    store = Store(tmp_path / "data")
    pipeline = Pipeline(store, WriteAheadLog(tmp_path / "wal"), workers=1, worker_nice=7)
    try:
        assert pipeline.executor.submit(os.nice, 0).result(timeout=60) == os.nice(0) + 7
    finally:
        pipeline.stop()
