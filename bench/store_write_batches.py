"""Store.write against pq.write_table on a table made of many one-span batches (issue 37).

    python bench/store_write_batches.py --batches 20000 --rounds 2

An exporter with OpenTelemetry's SimpleSpanProcessor sends one span per request, and a WAL segment
becomes `pa.Table.from_batches` of one record batch per request (pipeline.convert_segment): here
each batch is one training span of payload (b)'s shape (4,096 prompt ids, 512 completion ids, 512
logprobs). Both writers get the same chunked table and LIVE_WRITE_OPTIONS, to a local file, and
Store.write also fsyncs and renames (so it is timed with pyarrow alone too); the best of `--rounds`
is printed for each, then every round, with the list-page fallbacks counted during the run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lightning_otel.collector import list_pages
from lightning_otel.collector.span_rows import SPANS_SCHEMA, decode_request, to_batch
from lightning_otel.collector.store import LIVE_WRITE_OPTIONS, Store, lists_with_values
from lightning_otel.testing.payloads import build_request


def one_span_table(batches: int) -> pa.Table:
    """`batches` one-row record batches of one training span, as a segment of one-span exports."""
    batch = to_batch([decode_request(build_request(1, True))])
    return pa.Table.from_batches([batch] * batches, SPANS_SCHEMA)


def timed(rounds: int, write) -> str:
    """The best of `rounds`, then every round: a 450 MB write's time follows the page cache and the
    disk's writeback as much as the writer."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        write()
        times.append(time.perf_counter() - started)
    return f"{min(times):.2f} s (rounds: {', '.join(f'{t:.2f}' for t in times)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    table = one_span_table(args.batches)
    print(f"{len(table):,} rows in {table.column('prompt_token_ids').num_chunks:,} chunks", flush=True)
    with tempfile.TemporaryDirectory(prefix="store-write-") as tmp:
        store = Store(Path(tmp) / "data")
        path = f"{store.spans_root}/f.parquet"
        columns = lists_with_values(table)
        fallbacks_before = dict(getattr(list_pages, "fallback_counts", dict)())
        ours = timed(args.rounds, lambda: store.write(table, path, LIVE_WRITE_OPTIONS, columns))
        fallbacks_after = dict(getattr(list_pages, "fallback_counts", dict)())
        assert pq.read_table(path).num_rows == len(table)
        theirs = timed(args.rounds, lambda: pq.write_table(table, f"{tmp}/pyarrow.parquet", **LIVE_WRITE_OPTIONS))
        # Store.write with no list columns: pyarrow alone, plus the fsync and rename every live file gets
        durable = timed(args.rounds, lambda: store.write(table, f"{store.spans_root}/p.parquet", LIVE_WRITE_OPTIONS))
        # in memory, no disk: the CPU cost alone, free of the page cache and the disk's noise
        encode = timed(args.rounds, lambda: list_pages.encode(table, columns, **LIVE_WRITE_OPTIONS))
        in_memory = timed(args.rounds, lambda: pq.write_table(table, pa.BufferOutputStream(), **LIVE_WRITE_OPTIONS))
    print(f"Store.write, list_pages for {', '.join(columns)}: {ours}")
    print(f"pq.write_table alone, same table and options: {theirs}")
    print(f"Store.write, pyarrow alone (write_table + fsync + rename): {durable}")
    print(f"in memory: list_pages.encode {encode}; pq.write_table to a buffer {in_memory}")
    print(f"list_pages fallbacks during Store.write: {fallbacks_before} -> {fallbacks_after}")


if __name__ == "__main__":
    main()
