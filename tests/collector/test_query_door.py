"""The read-only SQL door (POST /v1/query) has no write path: EXPLAIN ANALYZE COPY and every other
writing statement are refused by DuckDB's parsed statement type, and the sandboxed connection itself
cannot write a file even when a statement gets past that check; no reply names the store's host
path; garbage SQL text is a 400 or 413, never a 500; and a statement that holds a CPU (and DuckDB's
parser the GIL) for seconds is stopped at the time limit in its worker process while the collector
goes on acknowledging exports. The `rollout_ids` field: test_query_door_rollouts.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import duckdb
import pytest
from helpers import file_digests, local_collector
from otlp_helpers import make_spans, post, request_bytes
from test_collector_s3 import s3_endpoint  # noqa: F401  (a fixture: a moto S3 server)

from lightning_otel.collector import query_limits
from lightning_otel.collector.query_sandbox import SPANS_URL, ReadOnlyStore, sandboxed_connect
from lightning_otel.core import schema

pytestmark = pytest.mark.integration


def _query(collector, body: bytes | str) -> tuple[int, dict, str]:
    """POST /v1/query with a raw body (a str is sent as UTF-8, a dict as JSON): (status, reply, reply text)."""
    data = body if isinstance(body, bytes) else body.encode()
    status, _, reply = post(
        collector.http_endpoint + "/v1/query", data, "application/json", {"Authorization": "Bearer q"}
    )
    return status, json.loads(reply), reply.decode()


def _sql(collector, sql: str) -> tuple[int, dict, str]:
    return _query(collector, json.dumps({"sql": sql}))


@pytest.fixture
def store_collector(tmp_path):
    """A collector with 5 spans in Parquet and the query endpoint on; workers ready."""
    with local_collector(tmp_path / "data", query_token="q") as collector:
        body = request_bytes(make_spans(lambda t: [t.start_span(f"kept-{k}").end() for k in range(5)]))
        assert post(collector.http_endpoint + "/v1/traces", body)[0] == 200
        collector.flush()
        deadline = time.monotonic() + 60
        while _sql(collector, "SELECT 1")[0] != 200:  # the query workers' first start
            assert time.monotonic() < deadline
        yield collector


def test_explain_analyze_copy_is_refused_and_the_store_is_unchanged(store_collector, tmp_path):
    spans = tmp_path / "data" / "spans"
    a_store_file = next(p for p in spans.rglob("*.parquet") if p.name != "_schema.parquet")
    before = file_digests(tmp_path)
    forge = (
        "COPY (SELECT trace_id, span_id || 'f' AS span_id, rollout_id, 'reward' AS reward_name, 1e9 AS reward_value"
        " FROM spans_raw LIMIT 1) TO '{}'"
    )
    for sql in (
        "EXPLAIN ANALYZE " + forge.format(spans / "forged.parquet"),
        "EXPLAIN ANALYZE " + forge.format(SPANS_URL + "forged.parquet"),
        f"EXPLAIN ANALYZE COPY (SELECT * FROM spans_raw WHERE false) TO '{a_store_file}'",
        "EXPLAIN SELECT 1",  # no EXPLAIN at all: the simplest proof that none runs what it explains
        "PRAGMA enable_profiling",
        "CALL pragma_version()",
        f"COPY spans_raw TO '{spans / 'copy.parquet'}'",
        f"EXPORT DATABASE '{tmp_path / 'export'}'",
        "SET memory_limit = '10GB'",
        "SELECT 1; COPY (SELECT 1) TO 'x.csv'",
    ):
        status, reply, _ = _sql(store_collector, sql)
        assert status == 400 and reply["error"], sql
    assert file_digests(tmp_path) == before
    status, reply, _ = _sql(store_collector, "SELECT count(*) FROM spans WHERE name LIKE 'kept-%'")
    assert (status, reply["rows"]) == (200, [[5]])


@pytest.mark.parametrize("rollout_ids", [None, ["r-one"]], ids=["whole-store", "narrowed"])
def test_the_sandboxed_connection_itself_cannot_write(tmp_path, monkeypatch, rollout_ids):
    """Past the statement check (statements sent to the connection directly): no file is written in
    the store, elsewhere on disk, or in a spill directory; the same on the views narrowed to a rollout."""
    data = tmp_path / "data"
    with local_collector(data) as collector:
        one = {schema.ROLLOUT_ID: "r-one"}
        body = request_bytes(make_spans(lambda t: [t.start_span("one", attributes=one).end()]))
        assert post(collector.http_endpoint + "/v1/traces", body)[0] == 200
        collector.flush()
    elsewhere, cwd = tmp_path / "elsewhere", tmp_path / "cwd"
    elsewhere.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # DuckDB's default temp directory is ./.tmp
    a_store_file = next(p for p in (data / "spans").rglob("*.parquet") if p.name != "_schema.parquet")
    before = file_digests(tmp_path)
    conn = sandboxed_connect(data, memory_limit="64MB", rollout_ids=rollout_ids)
    try:
        for target in (
            data / "spans" / "forged.parquet",
            a_store_file,
            elsewhere / "x.parquet",
            cwd / ".tmp" / "x.parquet",
            SPANS_URL + "forged.parquet",
            SPANS_URL + a_store_file.relative_to(data / "spans").as_posix(),
        ):
            for sql in (
                f"COPY (SELECT * FROM spans_raw WHERE false) TO '{target}'",
                f"EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{target}'",
            ):
                with pytest.raises(duckdb.Error):
                    conn.execute(sql)
        with pytest.raises(duckdb.Error):
            conn.execute(f"ATTACH '{elsewhere / 'x.db'}' AS x")
        for setting in (
            "SET temp_directory = '.tmp'",
            "SET enable_external_access = true",
            "SET disabled_filesystems = ''",
            "SET lock_configuration = false",
        ):
            with pytest.raises(duckdb.Error):
                conn.execute(setting)
        with pytest.raises(duckdb.Error):  # no local file is read, the store's included
            conn.execute(f"SELECT count(*) FROM read_parquet('{a_store_file}')").fetchall()
        # Too big for 64 MB: with no temp directory it fails instead of writing spill files.
        with pytest.raises(duckdb.OutOfMemoryException):
            conn.execute(
                "SELECT count(*) FROM (SELECT md5(range::VARCHAR) AS k, count(*) FROM range(4000000) GROUP BY k)"
            ).fetchall()
        assert conn.execute("SELECT count(*) FROM spans").fetchone() == (1,)  # it still reads the store
    finally:
        conn.close()
    assert file_digests(tmp_path) == before


def test_the_read_only_store_has_no_write_path_and_no_way_out(tmp_path):
    import fsspec

    (tmp_path / "spans").mkdir()
    (tmp_path / "wal").mkdir()
    (tmp_path / "spans" / "a.parquet").write_bytes(b"data")
    (tmp_path / "wal" / "segment").write_bytes(b"log")
    before = file_digests(tmp_path)
    fs = ReadOnlyStore(str(tmp_path), fsspec.filesystem("file"))
    assert fs.cat_file(SPANS_URL + "a.parquet") == b"data"
    assert [Path(p).name for p in fs.ls(SPANS_URL, detail=False)] == ["a.parquet"]
    for write in (
        lambda: fs.open(SPANS_URL + "a.parquet", "wb"),
        lambda: fs.open(SPANS_URL + "new.parquet", "ab"),
        lambda: fs.pipe_file(SPANS_URL + "new.parquet", b"x"),
        lambda: fs.touch(SPANS_URL + "new.parquet"),
        lambda: fs.rm(SPANS_URL + "a.parquet"),
        lambda: fs.mv(SPANS_URL + "a.parquet", SPANS_URL + "b.parquet"),
    ):
        with pytest.raises((PermissionError, NotImplementedError)):
            write()
    for outside in ("tracestore://wal/segment", SPANS_URL + "../wal/segment", "tracestore:///etc/hostname"):
        with pytest.raises(PermissionError):
            fs.cat_file(outside)
    with pytest.raises(FileNotFoundError) as missing:
        fs.info(SPANS_URL + "gone.parquet")
    assert str(tmp_path) not in str(missing.value)  # errors name the store's path, not the host's
    assert file_digests(tmp_path) == before


def test_no_reply_names_the_store_path(store_collector, tmp_path):
    host_paths = {str(tmp_path), str(tmp_path.resolve())}
    answered = []
    for sql in (
        "SELECT current_setting('allowed_directories')::VARCHAR AS v",
        "SELECT current_setting('temp_directory') AS t, current_setting('home_directory') AS h,"
        " current_setting('secret_directory') AS s",
        "SELECT name, value FROM duckdb_settings()",
        "SELECT view_name, sql FROM duckdb_views()",
        "SELECT * FROM duckdb_databases()",
        "SELECT * FROM duckdb_temporary_files()",
        f"SELECT * FROM glob('{SPANS_URL}**')",
        f"SELECT * FROM read_parquet('{SPANS_URL}gone.parquet')",
        f"SELECT * FROM read_text('{tmp_path}/data/spans/_schema.parquet')",
    ):
        status, reply, text = _sql(store_collector, sql)
        assert status in (200, 400), (sql, reply)
        assert not any(path in text for path in host_paths), (sql, text[:500])
        answered.append(status)
    assert answered[:7] == [200] * 7  # answered, without the path (not merely refused)
    status, reply, _ = _sql(store_collector, "SELECT current_setting('allowed_directories')::VARCHAR AS v")
    assert reply["rows"] == [[str([SPANS_URL])]]


def test_sql_that_is_not_valid_unicode_or_json_is_a_400(store_collector):
    lone_surrogate = b'{"sql": "SELECT \'\\ud800\' AS s"}'  # valid JSON, no UTF-8 for it
    status, reply, _ = _query(store_collector, lone_surrogate)
    assert status == 400 and "not valid Unicode" in reply["error"]
    status, reply, _ = _query(store_collector, b"[" * 100_000)  # deeper than json.loads recurses
    assert status == 400 and "RecursionError" in reply["error"]
    assert _sql(store_collector, "SELECT 'ok' AS s")[1]["rows"] == [["ok"]]  # and nothing else suffered


class _Exporter(threading.Thread):
    """Posts small exports back to back; records when each was sent and acknowledged."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.acks, self.halt = url, [], threading.Event()

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            body = request_bytes(make_spans(lambda t: [t.start_span(f"during-{i}").end()]))
            sent = time.monotonic()
            status = post(self.url, body)[0]
            self.acks.append((sent, time.monotonic(), status))
            i += 1

    def worst_wait(self, start: float, end: float) -> float:
        """The longest an export waited for its ack, or went without one, within [start, end]."""
        times = [start] + [acked for _, acked, _ in self.acks if start <= acked <= end] + [end]
        waits = [acked - sent for sent, acked, _ in self.acks if start <= acked <= end]
        return max([b - a for a, b in zip(times, times[1:])] + waits)


NESTED_4MB = "SELECT " + "(" * 2_000_000 + "1" + ")" * 2_000_000  # ~27 s of parsing holding the GIL before


@pytest.mark.parametrize("max_sql_bytes", [None, 8 << 20], ids=["size-limit", "worker-process"])
def test_a_4mb_query_neither_outlives_the_time_limit_nor_stalls_ingest(tmp_path, monkeypatch, max_sql_bytes):
    """Refused at once by the size limit (413); with that limit raised, parsed in a worker process that
    is stopped at the time limit (the collector runs in this process: a GIL held by DuckDB's parser
    here would stop the exporter thread too)."""
    if max_sql_bytes is not None:
        monkeypatch.setattr(query_limits, "MAX_SQL_BYTES", max_sql_bytes)
    limit_s = 2.0
    with local_collector(tmp_path / "data", query_token="q", query_timeout_s=limit_s) as collector:
        deadline = time.monotonic() + 60
        while _sql(collector, "SELECT 1")[0] != 200:
            assert time.monotonic() < deadline
        exporter = _Exporter(collector.http_endpoint + "/v1/traces")
        exporter.start()
        time.sleep(0.5)
        started = time.monotonic()
        status, reply, _ = _sql(collector, NESTED_4MB)
        elapsed = time.monotonic() - started
        time.sleep(0.5)
        exporter.halt.set()
        exporter.join()
        if max_sql_bytes is None:
            assert status == 413 and "at most 1048576" in reply["error"]
        else:  # a 400 (too deep) only on a machine that parses 4 MB within the limit
            assert (status, reply.get("timeout_s")) == (504, limit_s) or "expression depth" in reply["error"]
        assert elapsed <= limit_s + 1.5
        assert {status for _, _, status in exporter.acks} == {200}
        assert exporter.worst_wait(started, started + elapsed) < 3.0
        if max_sql_bytes is not None:  # acknowledged while the worker parsed
            assert len([1 for _, acked, _ in exporter.acks if started <= acked <= started + elapsed]) >= 3
        assert _sql(collector, "SELECT 42 AS x")[1]["rows"] == [[42]]  # a killed worker was replaced


@pytest.mark.usefixtures("s3_endpoint")
def test_an_object_store_is_read_through_the_same_read_only_door(tmp_path):
    import boto3

    def listing() -> dict[str, str]:
        objects = boto3.client("s3").list_objects_v2(Bucket="traces", Prefix="door/").get("Contents", [])
        return {o["Key"]: o["ETag"] for o in objects}

    with local_collector("s3://traces/door", wal_dir=str(tmp_path / "wal"), query_token="q") as collector:
        rollout = [{schema.ROLLOUT_ID: f"s3-r{k % 2}"} for k in range(3)]
        body = request_bytes(
            make_spans(lambda t: [t.start_span(f"s3-{k}", attributes=rollout[k]).end() for k in range(3)])
        )
        assert post(collector.http_endpoint + "/v1/traces", body)[0] == 200
        collector.flush()
        before = listing()
        deadline = time.monotonic() + 60
        while (answer := _sql(collector, "SELECT count(*) FROM spans"))[0] != 200:
            assert time.monotonic() < deadline, answer
        assert answer[1]["rows"] == [[3]]
        assert _sql(collector, f"EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{SPANS_URL}forged.parquet'")[0] == 400
        narrowed = {"sql": "SELECT count(*) FROM spans WHERE rollout_id = 's3-r0'", "rollout_ids": ["s3-r0"]}
        assert _query(collector, json.dumps(narrowed))[1]["rows"] == [[2]]  # its files chosen on the object store
        nothing = {"sql": "SELECT count(*) FROM spans", "rollout_ids": ["nope"]}
        assert _query(collector, json.dumps(nothing))[1]["rows"] == [[0]]  # no file can hold it
        copy = {"sql": f"COPY (SELECT 1 AS a) TO '{SPANS_URL}forged.parquet'", "rollout_ids": ["s3-r0"]}
        assert _query(collector, json.dumps(copy))[0] == 400
    for rollout_ids in (None, ["s3-r0"]):
        conn = sandboxed_connect("s3://traces/door", rollout_ids=rollout_ids)
        try:
            for target in (SPANS_URL + "forged.parquet", "s3://traces/door/spans/forged.parquet"):
                with pytest.raises(duckdb.Error):
                    conn.execute(f"COPY (SELECT 1 AS a) TO '{target}'")
            with pytest.raises(duckdb.Error):  # the object store is read through tracestore:// alone
                conn.execute("SELECT count(*) FROM read_parquet('s3://traces/door/spans/**/*.parquet')").fetchall()
        finally:
            conn.close()
    assert listing() == before


# --- rollout_ids: the views narrowed to rollouts -----------------------------------------------------
