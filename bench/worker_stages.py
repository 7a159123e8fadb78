"""Where a Parquet conversion worker's CPU goes, stage by stage, per span (BENCHMARKS.md, issue 16).

    python bench/worker_stages.py --payload b --requests 30 --rounds 3
    python bench/worker_stages.py --payload b --keep-freed-memory   # as the pipeline's workers run

Builds the payload's requests (lightning_otel.testing.payloads, fresh ids per request), appends them to a real
write-ahead log (32 MiB segments, as the collector closes them) and converts every segment the way
pipeline.convert_segment does, in this one process, timing each step with this process's CPU clock
(user + system, so page faults and the kernel's copies count; other work on the machine counts less
than in wall time). The Parquet write is also repeated with pyarrow alone (as before list_pages), on
two column subsets (token lists alone, everything else), with compression off, and as list_pages'
buffers alone, to show what each part costs.
`--keep-freed-memory` applies the workers' allocator setting (span_decoder.keep_freed_memory) first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa
import pyarrow.parquet as pq
from collector_ingest import PAYLOADS, variants

from lightning_otel.collector import list_pages, span_decoder, span_rows
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import LIVE_WRITE_OPTIONS, Store
from lightning_otel.collector.wal import WriteAheadLog, fsync_path, read_segment
from lightning_otel.testing.payloads import build_request

TOKEN_COLUMNS = [column for column, *_ in span_rows.LISTS]


class Clock:
    """CPU seconds per named stage, summed over calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def time(self, stage: str, fn, *args):
        self.seconds.setdefault(stage, 0.0)  # printed in the order the stages start
        started = time.process_time()
        out = fn(*args)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.process_time() - started
        return out


def convert(clock: Clock, segment: Path, workdir: Path) -> int:
    """pipeline.convert_segment's steps, each timed; then the table written again in parts (extra)."""
    bodies = clock.time("read the segment (mmap, records)", lambda: list(read_segment(segment, False)))
    assemble = span_rows.assemble
    span_rows.assemble = lambda *a: clock.time("  of which Arrow arrays from the C walk's lists", assemble, *a)
    try:
        batches = clock.time(
            "decode: span_decoder.batch_from_body", lambda: [span_decoder.batch_from_body(b) for b in bodies]
        )
    finally:
        span_rows.assemble = assemble
    table = clock.time("pa.Table.from_batches", pa.Table.from_batches, batches, SPANS_SCHEMA)
    store = Store(workdir / "store")
    clock.time("Store.write_segment (Parquet, fsync, rename)", store.write_segment, segment.stem, table)
    clock.time("unlink the segment", os.unlink, segment)
    out = str(workdir / "again.parquet")
    rest = [c for c in table.column_names if c not in TOKEN_COLUMNS]
    rest_compression = {
        leaf: codec for leaf, codec in LIVE_WRITE_OPTIONS["compression"].items() if leaf.split(".")[0] in rest
    }
    plain = dict(use_dictionary=False, write_statistics=False, compression="none")
    extra = {
        "list_pages.encode alone (the live file's buffers, not written)": lambda: list_pages.encode(
            table, TOKEN_COLUMNS, **LIVE_WRITE_OPTIONS
        ),
        "pq.write_table alone, pyarrow for every column (live options)": lambda: pq.write_table(
            table, out, **LIVE_WRITE_OPTIONS
        ),
        "fsync of that file": lambda: fsync_path(out),
        "token list columns alone, pyarrow's writer (options as live)": lambda: pq.write_table(
            table.select(TOKEN_COLUMNS), out, **plain
        ),
        "all other columns alone": lambda: pq.write_table(
            table.select(rest), out, **{**LIVE_WRITE_OPTIONS, "compression": rest_compression}
        ),
        "pyarrow alone, live options, compression none (not used)": lambda: pq.write_table(
            table, out, **{**LIVE_WRITE_OPTIONS, "compression": "none"}
        ),
    }
    for label, fn in extra.items():
        clock.time("again: " + label, fn)
    return table.num_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payload", choices=PAYLOADS, default="b")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="convert the whole log this many times")
    parser.add_argument("--keep-freed-memory", action="store_true", help="the workers' allocator setting")
    args = parser.parse_args()
    if not span_decoder.available():
        sys.exit("the compiled decoder is not available: these stages are the compiled path's")
    if args.keep_freed_memory and not span_decoder.keep_freed_memory():
        sys.exit("keep_freed_memory did not take on this platform")
    spans_per_request, training = PAYLOADS[args.payload]
    bodies = variants(build_request(spans_per_request, training), args.requests, seed=1)
    workdir = Path(tempfile.mkdtemp(prefix="lightning-stages-"))
    clock, spans = Clock(), 0
    try:
        for round_ in range(args.rounds):
            log = WriteAheadLog(workdir / f"wal-{round_}")
            for body in bodies:
                log.append(body)
            log.rotate()
            for segment in log.closed_segments():
                spans += convert(clock, log.path(segment), workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"payload ({args.payload}), {spans} spans, keep_freed_memory={args.keep_freed_memory}; CPU per span:")
    for stage, seconds in clock.seconds.items():
        print(f"  {stage:66s} {seconds / spans * 1e6:7.1f} us")
    steps = [s for s in clock.seconds if not s.startswith(("  of which", "again: "))]
    total = sum(clock.seconds[s] for s in steps)
    print(f"  {'convert_segment, its steps summed':66s} {total / spans * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
