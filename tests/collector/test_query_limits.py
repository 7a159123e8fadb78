"""POST /v1/query is bounded: a statement past the time limit is stopped (504), more than the cap
at once get 429 + Retry-After, and meanwhile the collector keeps acknowledging exports and turning
them into Parquet. The dashboard's endpoint has the same limits (one implementation)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.cli import build_parser
from lightning_otel.collector import connect
from lightning_otel.dashboards.server import DashboardServer
from lightning_otel.testing.servers import CollectorProcess

pytestmark = pytest.mark.integration

HEAVY = "SELECT count(*) FROM range(40000000000)"  # minutes of work for DuckDB on two cores
LIMIT_S = 2.0


def _query(url: str, sql: str, token: str | None = "q"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, headers, reply = post(url, json.dumps({"sql": sql}).encode(), "application/json", headers)
    return status, headers, json.loads(reply)


def _wait_until_answered(url: str, token: str | None = "q") -> None:
    """Until the query workers are up: their first start (a process importing DuckDB) can take a few
    seconds on a loaded machine, and the time limit counts from admission (a cold query gets a 504)."""
    deadline = time.monotonic() + 60
    while _query(url, "SELECT 1", token)[0] != 200:
        assert time.monotonic() < deadline, "the query workers never started"


def _parquet_rows(data_dir: Path, seen: dict) -> int:
    for path in (data_dir / "spans").rglob("*.parquet"):
        if path not in seen:
            try:
                seen[path] = pq.ParquetFile(path).metadata.num_rows
            except OSError:
                continue  # being compacted away
    return sum(seen.values())


class _Exporter(threading.Thread):
    """Posts 20-span exports back to back; records (acknowledged at, status)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.acks, self.halt = url, [], threading.Event()

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            body = request_bytes(make_spans(lambda t: [t.start_span(f"ingest-{i}-{k}").end() for k in range(20)]))
            status = post(self.url, body)[0]
            self.acks.append((time.monotonic(), status))
            i += 1


def test_a_heavy_query_is_stopped_in_time_while_ingest_goes_on(tmp_path):
    data_dir = tmp_path / "data"
    args = ["--query-token", "q", "--query-timeout-s", str(LIMIT_S), "--query-max-concurrent", "1"]
    with CollectorProcess(
        data_dir, flush_interval_s=0.2, log_path=tmp_path / "collector.log", extra_args=args
    ) as collector:
        query_url = collector.url + "/v1/query"
        _wait_until_answered(query_url)
        exporter = _Exporter(collector.traces_endpoint)
        exporter.start()
        footers: dict = {}
        deadline = time.monotonic() + 30
        while _parquet_rows(data_dir, footers) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # ingest running before the query starts

        outcome = {}
        heavy = threading.Thread(target=lambda: outcome.update(reply=_query(query_url, HEAVY)))
        started = time.monotonic()
        rows_before = _parquet_rows(data_dir, footers)
        heavy.start()
        time.sleep(0.5)
        status, headers, busy = _query(query_url, "SELECT 1")  # the one slot is taken
        heavy.join(timeout=60)
        elapsed = time.monotonic() - started
        rows_after = _parquet_rows(data_dir, footers)
        exporter.halt.set()
        exporter.join()

        assert status == 429 and headers["Retry-After"] == "1" and "queries are running" in busy["error"]
        code, _, reply = outcome["reply"]
        assert code == 504 and reply["timeout_s"] == LIMIT_S and "longer than 2 s" in reply["error"]
        assert elapsed <= LIMIT_S + 1
        during = [status for at, status in exporter.acks if started <= at <= started + elapsed]
        assert len(during) >= 3 and set(during) == {200}, during  # acknowledged while the query ran
        assert rows_after > rows_before  # and turned into Parquet meanwhile
        assert _query(query_url, "SELECT 42 AS x")[2] == {"columns": ["x"], "rows": [[42]], "truncated": False}

        acked = 20 * sum(1 for _, status in exporter.acks if status == 200)
        deadline = time.monotonic() + 30
        while _parquet_rows(data_dir, footers) < acked and time.monotonic() < deadline:
            time.sleep(0.1)
        assert connect(data_dir).execute("SELECT count(*) FROM spans WHERE name LIKE 'ingest-%'").fetchone()[0] == acked


def test_the_dashboard_query_endpoint_has_the_same_limits(tmp_path):
    server = DashboardServer("127.0.0.1", 0, str(tmp_path / "empty-store"), query_timeout_s=1.0, query_max_concurrent=1)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    url = server.url + "v1/query"
    try:
        _wait_until_answered(url, token=None)
        outcome = {}
        heavy = threading.Thread(target=lambda: outcome.update(reply=_query(url, HEAVY, token=None)))
        started = time.monotonic()
        heavy.start()
        time.sleep(0.3)
        status, headers, _ = _query(url, "SELECT 1", token=None)
        heavy.join(timeout=60)
        assert status == 429 and headers["Retry-After"] == "1"
        code, _, reply = outcome["reply"]
        assert code == 504 and "longer than 1 s" in reply["error"]
        assert time.monotonic() - started <= 2.0
        assert _query(url, "SELECT 7 AS n", token=None)[2]["rows"] == [[7]]
    finally:
        server.shutdown()
        server.server_close()


def test_query_limit_flags_and_environment(monkeypatch):
    args = build_parser().parse_args(["collector", "--query-timeout-s", "5", "--query-max-concurrent", "3"])
    assert (args.query_timeout_s, args.query_max_concurrent) == (5.0, 3)
    defaults = build_parser().parse_args(["collector"])
    assert (defaults.query_timeout_s, defaults.query_max_concurrent) == (30.0, 2)
    monkeypatch.setenv("LIGHTNING_OTEL_QUERY_TIMEOUT_S", "7.5")
    monkeypatch.setenv("LIGHTNING_OTEL_QUERY_MAX_CONCURRENT", "4")
    for command in ("collector", "dashboard"):
        args = build_parser().parse_args([command])
        assert (args.query_timeout_s, args.query_max_concurrent) == (7.5, 4), command


def test_the_memory_limit_holds_and_bad_bodies_are_400(tmp_path):
    from lightning_otel.collector.query_limits import QueryLimiter

    limiter = QueryLimiter(tmp_path / "store", timeout_s=60)
    code, reply, _ = limiter.answer(json.dumps({"sql": "SELECT current_setting('memory_limit') AS m"}).encode())
    assert (code, reply["rows"]) == (200, [["953.6 MiB"]])  # 1 GB
    code, reply, _ = limiter.answer(json.dumps({"sql": "SELECT list(range) FROM range(100000000)"}).encode())
    assert code == 400 and "Out of Memory" in reply["error"]
    assert limiter.answer(b"not json")[0] == 400 and limiter.answer(b'{"sql": 5}')[0] == 400
    assert limiter.answer(b'{"sql": "SELECT 1"}')[0] == 200  # every slot was given back
