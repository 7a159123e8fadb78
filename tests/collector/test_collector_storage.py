"""Durability under kill -9 with exporters sending, compaction and retention."""

from __future__ import annotations

import os
import signal
import threading
import time

import duckdb
from helpers import local_collector, wait_for
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core.servers import free_port
from lightning_otel.testing.servers import CollectorProcess

HOUR_NS = 3600 * 10**9


def _spans_at(start_ns: int, names: list[str]):
    def build(tracer):
        for name in names:
            tracer.start_span(name, start_time=start_ns).end(end_time=start_ns + 1000)

    return make_spans(build)


def _raw_count(data_dir, where="true"):
    return duckdb.execute(
        f"SELECT count(*) FROM read_parquet('{data_dir}/spans/**/*.parquet') WHERE {where}"
    ).fetchone()[0]


def test_kill_9_while_exporters_send_loses_no_acknowledged_span(tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    collector = CollectorProcess(data_dir, port=port, flush_interval_s=0.2).start()
    acknowledged: list[str] = []
    stop = threading.Event()

    def sender(index: int) -> None:
        batch = 0
        while not stop.is_set():
            names = [f"s{index}-b{batch}-{i}" for i in range(50)]
            try:
                status = post(collector.url + "/v1/traces", request_bytes(_spans_at(time.time_ns(), names)))[0]
            except OSError:
                return  # the collector is gone
            if status == 200:
                acknowledged.extend(names)
            batch += 1

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(3)  # several flush rounds: some spans in Parquet, some only in the log
    os.killpg(collector.process.pid, signal.SIGKILL)
    collector.process.wait()
    stop.set()
    for thread in threads:
        thread.join()
    assert len(acknowledged) > 500
    with CollectorProcess(data_dir, port=port, flush_interval_s=0.2):
        names = set(
            wait_for(
                lambda: [r[0] for r in connect(data_dir).execute("SELECT name FROM spans").fetchall()],
                lambda rows: set(acknowledged) <= set(rows),
                timeout_s=60,
            )
        )
    assert set(acknowledged) <= names
    # exactly once, not just once in the view: replaying a segment rewrites the same files
    duplicates = duckdb.sql(
        f"SELECT name, count(*) c FROM read_parquet('{data_dir}/spans/**/*.parquet') GROUP BY name HAVING c > 1"
    ).fetchall()
    assert duplicates == []


def test_compaction_merges_small_files_and_readers_never_see_duplicates(tmp_path):
    now = time.time_ns()
    with local_collector(tmp_path / "d", compact_min_files=4, compact_grace_s=60) as collector:
        url = collector.http_endpoint + "/v1/traces"
        bodies = [request_bytes(_spans_at(now, [f"b{batch}-{i}" for i in range(5)])) for batch in range(6)]
        for body in bodies:
            assert post(url, body)[0] == 200
            collector.flush()  # one small file per batch
        assert post(url, bodies[0][:])[0] == 200  # a retried export: five duplicates
        collector.flush()
        files_before = len(collector.store.files())
        assert files_before == 7 and _raw_count(collector.data_dir) == 35
        assert collector.pipeline.compact() == 1
        # inputs stay during the grace period; the view deduplicates the overlap
        assert connect(collector.data_dir).execute("SELECT count(*) FROM spans").fetchone()[0] == 30
        collector.pipeline.delete_doomed(now=time.monotonic() + 3600)
        files = collector.store.files()
        assert len(files) == 1 and files[0].base_name.startswith("compact-")
        assert _raw_count(collector.data_dir) == 30  # deduplicated physically too
        codecs = dict(
            connect(collector.data_dir)
            .execute(f"SELECT path_in_schema, compression FROM parquet_metadata('{files[0].path}')")
            .fetchall()
        )
        assert (
            codecs["name"] == "ZSTD" and codecs["prompt_token_ids, list, element"] == "UNCOMPRESSED"
        )  # the long-term codec
        assert connect(collector.data_dir).execute("SELECT count(*) FROM spans").fetchone()[0] == 30


def test_closed_hours_compact_to_one_file_and_retention_deletes_old_hours(tmp_path):
    now = time.time_ns()
    three_days_ago = now - 72 * HOUR_NS
    yesterday = now - 20 * HOUR_NS
    with local_collector(tmp_path / "d", retention_hours=48) as collector:
        url = collector.http_endpoint + "/v1/traces"
        for start, label in ((three_days_ago, "old"), (yesterday, "recent-a"), (yesterday, "recent-b"), (now, "now")):
            assert post(url, request_bytes(_spans_at(start, [f"{label}-{i}" for i in range(3)])))[0] == 200
            collector.flush()
        assert collector.pipeline.compact() == 1  # yesterday's hour is closed: its 2 files become 1
        assert collector.pipeline.index_days() >= 1  # three days ago's day index, beside its hour
        old_date = time.strftime("date=%Y-%m-%d", time.gmtime(three_days_ago / 1e9))
        old_days = [p for p in (collector.data_dir / "spans").rglob(old_date) if (p / "day.rollouts").exists()]
        assert collector.pipeline.apply_retention() == 1  # three days ago is past 48 hours
        assert old_days and not any(day.exists() for day in old_days)  # its day index went with its last hour
        collector.pipeline.delete_doomed(now=time.monotonic() + 3600)
        names = {r[0].split("-")[0] for r in connect(collector.data_dir).execute("SELECT name FROM spans").fetchall()}
        assert names == {"recent", "now"}
        assert _raw_count(collector.data_dir) == 9
