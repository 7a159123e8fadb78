"""The read-only SQL door (POST /v1/query) has no write path: EXPLAIN ANALYZE COPY and every other
writing statement are refused by DuckDB's parsed statement type, and the sandboxed connection itself
cannot write a file even when a statement gets past that check; no reply names the store's host
path; garbage SQL text is a 400 or 413, never a 500; and a statement that holds a CPU (and DuckDB's
parser the GIL) for seconds is stopped at the time limit in its worker process while the collector
goes on acknowledging exports. With `rollout_ids` the views are narrowed to those rollouts' files
(the same rows for them, none of other rollouts'), behind the same door: bad values are 400s, writes
are refused as on the whole store, and seeded hostile values (hostile_sql.rollout_ids_query) get a
400 or a 200 and write nothing."""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import threading
import time
from pathlib import Path

import duckdb
import pytest
from helpers import local_collector
from hostile_campaign import QUERY_TOKEN, SEED, Watcher, ask, changed, snapshot
from hostile_client import HttpSender
from hostile_sql import Paths, rollout_ids_query
from otlp_helpers import make_spans, post, request_bytes
from test_collector_s3 import s3_endpoint  # noqa: F401  (a fixture: a moto S3 server)

from lightning_otel.collector import query_limits
from lightning_otel.collector.query_limits import MAX_ROLLOUT_ID_BYTES, MAX_ROLLOUT_IDS
from lightning_otel.collector.query_sandbox import SPANS_URL, ReadOnlyStore, sandboxed_connect
from lightning_otel.core import schema

pytestmark = pytest.mark.integration


def _snapshot(*roots: Path) -> dict[str, str]:
    """Every file under `roots`, by path, with a digest of its bytes."""
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for root in roots
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


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
    before = _snapshot(tmp_path)
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
    assert _snapshot(tmp_path) == before
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
    before = _snapshot(tmp_path)
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
    assert _snapshot(tmp_path) == before


def test_the_read_only_store_has_no_write_path_and_no_way_out(tmp_path):
    import fsspec

    (tmp_path / "spans").mkdir()
    (tmp_path / "wal").mkdir()
    (tmp_path / "spans" / "a.parquet").write_bytes(b"data")
    (tmp_path / "wal" / "segment").write_bytes(b"log")
    before = _snapshot(tmp_path)
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
    assert _snapshot(tmp_path) == before


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

ROLLOUTS = ("r1", "r2", "r3")


def _rollout(tracer, rollout: str) -> None:
    """A rollout's root, an LLM call, a tool call and a reward, in one trace."""
    ids = {schema.ROLLOUT_ID: rollout, schema.TASK_ID: f"task-{rollout}"}
    with tracer.start_as_current_span(f"root-{rollout}", attributes={**ids, schema.ROLLOUT_ROOT: True}):
        llm = {**ids, schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM, schema.LLM_MODEL_NAME: "m"}
        tracer.start_span(f"llm-{rollout}", attributes=llm).end()
        tracer.start_span(f"tool-{rollout}", attributes={**ids, schema.OPENINFERENCE_SPAN_KIND: schema.KIND_TOOL}).end()
        reward = {**ids, schema.REWARD_NAME: schema.DEFAULT_REWARD_NAME, schema.REWARD_VALUE: 0.5}
        tracer.start_span(f"reward-{rollout}", attributes=reward).end()


@pytest.fixture(scope="module")
def rollouts_collector(tmp_path_factory):
    """A collector whose store holds ROLLOUTS, each in files of its own (one flush each), queries on."""
    data = tmp_path_factory.mktemp("rollouts") / "data"
    with local_collector(data, query_token=QUERY_TOKEN) as collector:
        for rollout in ROLLOUTS:
            body = request_bytes(make_spans(lambda t, r=rollout: _rollout(t, r)))
            assert post(collector.http_endpoint + "/v1/traces", body)[0] == 200
            collector.flush()
        deadline = time.monotonic() + 60
        while _narrowed(collector, "SELECT 1", None)[0] != 200:  # the query workers' first start
            assert time.monotonic() < deadline
        yield collector


def _narrowed(collector, sql: str, rollout_ids, raw: bytes | None = None) -> tuple[int, dict]:
    """POST /v1/query with `rollout_ids` in the body (None: no such field; `raw`: this body instead)."""
    fields = {"sql": sql} if rollout_ids is None else {"sql": sql, "rollout_ids": rollout_ids}
    status, _, reply = post(
        collector.http_endpoint + "/v1/query",
        raw if raw is not None else json.dumps(fields).encode(),
        "application/json",
        {"Authorization": f"Bearer {QUERY_TOKEN}"},
    )
    return status, json.loads(reply)


def _rows(collector, sql: str, rollout_ids=None) -> list:
    status, reply = _narrowed(collector, sql, rollout_ids)
    assert status == 200, (sql, rollout_ids, reply)
    return reply["rows"]


ABOUT_ONE_ROLLOUT = (  # what the dashboard's rollout page asks, and more
    "SELECT rollout_id, task_id, trace_id, start_time::VARCHAR, llm_calls, tool_calls, reward, rewards::VARCHAR"
    " FROM rollouts WHERE rollout_id = '{r}'",
    "SELECT span_id, name, span_kind FROM spans WHERE rollout_id = '{r}' ORDER BY span_id",
    "SELECT span_id, model_name, training_source FROM llm_calls WHERE rollout_id = '{r}' ORDER BY span_id",
    "SELECT span_id, name FROM tool_calls WHERE rollout_id = '{r}'",
    "SELECT name, value FROM rewards WHERE rollout_id = '{r}'",
)
DISTINCT_ROLLOUTS = "SELECT count(DISTINCT rollout_id) AS n FROM spans"


def test_rollout_ids_answer_the_same_rows_from_the_rollouts_files_only(rollouts_collector):
    collector = rollouts_collector
    assert _rows(collector, DISTINCT_ROLLOUTS) == [[3]]
    for rollout in ROLLOUTS:
        assert _rows(collector, DISTINCT_ROLLOUTS, [rollout]) == [[1]], rollout  # narrowed: its files only
        other = next(r for r in ROLLOUTS if r != rollout)
        for sql in (template.format(r=rollout) for template in ABOUT_ONE_ROLLOUT):
            whole = _rows(collector, sql)
            assert whole, sql
            assert _rows(collector, sql, [rollout]) == whole, sql
            assert _rows(collector, sql, [other]) == [], (sql, other)  # narrowed to another: nothing of it
    assert _rows(collector, DISTINCT_ROLLOUTS, ["r1", "r3"]) == [[2]]
    assert _rows(collector, DISTINCT_ROLLOUTS, ["r2"] * MAX_ROLLOUT_IDS) == [[1]]  # duplicates are one id
    assert _rows(collector, DISTINCT_ROLLOUTS, [f"x{i}" for i in range(MAX_ROLLOUT_IDS - 1)] + ["r2"]) == [[1]]
    for odd in ("nope", "a\x00b", "'", "r1' OR 1=1 --", "x" * MAX_ROLLOUT_ID_BYTES, "é" * (MAX_ROLLOUT_ID_BYTES // 2)):
        assert _rows(collector, "SELECT count(*) FROM spans", [odd]) == [[0]], odd[:40]  # data, never SQL


@pytest.mark.parametrize(
    "value, message",
    [
        ("null", "must be a list of 1 to 100 rollout ids (strings), not null"),
        ('"r1"', "must be a list of 1 to 100 rollout ids (strings), not a string"),
        ("5", "not a number"),
        ('{"r1": true}', "not an object"),
        ("[]", "rollout ids (strings), not 0"),
        (json.dumps([f"r{i}" for i in range(101)]), "rollout ids (strings), not 101"),
        (json.dumps(["r1"] * 101), "rollout ids (strings), not 101"),
        ("[1]", "item 0 is a number"),
        ('["r1", null]', "item 1 is null"),
        ('[["r1"]]', "item 0 is a list"),
        ('[""]', "'rollout_ids' item 0 is empty"),
        (json.dumps(["x" * (MAX_ROLLOUT_ID_BYTES + 1)]), "item 0 is 4097 bytes; at most 4096 are accepted"),
        (json.dumps(["r1", "é" * (MAX_ROLLOUT_ID_BYTES // 2 + 1)]), "item 1 is 4098 bytes; at most 4096"),
        ('["\\ud800"]', "'rollout_ids' item 0 is not valid Unicode"),
    ],
    ids=lambda v: v[:24],
)
def test_bad_rollout_ids_are_400s_that_say_why(rollouts_collector, value, message):
    body = f'{{"sql": "SELECT 1", "rollout_ids": {value}}}'.encode()
    status, reply = _narrowed(rollouts_collector, "", None, raw=body)
    assert status == 400 and message in reply["error"], reply


def test_writes_are_refused_with_rollout_ids_as_without(rollouts_collector):
    """Each statement gets the same refusal, word for word, on the narrowed views as on the whole
    store, and nothing changes on disk."""
    data = Path(rollouts_collector.data_dir)
    a_store_file = next(p for p in (data / "spans").rglob("*.parquet") if p.name != "_schema.parquet")
    before = _snapshot(data.parent)
    for sql in (
        "CREATE TABLE t AS SELECT 1",
        "CREATE TEMP TABLE t AS SELECT 1",
        "CREATE OR REPLACE TEMP VIEW spans_raw AS SELECT 1",
        "CREATE OR REPLACE VIEW spans AS SELECT 1",
        "CREATE MACRO m() AS 1",
        "INSERT INTO spans_raw SELECT * FROM spans_raw",
        "DROP VIEW spans_raw",
        f"COPY (SELECT * FROM spans_raw) TO '{data / 'spans' / 'forged.parquet'}'",
        f"COPY (SELECT * FROM spans_raw WHERE false) TO '{a_store_file}'",
        f"COPY (SELECT 1 AS a) TO '{SPANS_URL}forged.parquet'",
        f"EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{SPANS_URL}forged.parquet'",
        f"EXPORT DATABASE '{data.parent / 'export'}'",
        f"ATTACH '{data.parent / 'x.db'}' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "PRAGMA threads = 64",
        "CHECKPOINT",
        "DETACH memory",
        f"SELECT * FROM read_parquet('{a_store_file}')",
        f"SELECT * FROM read_text('{data / 'spans' / '_schema.parquet'}')",
        "SELECT * FROM read_text('/etc/passwd')",
        f"SELECT * FROM glob('{data}/**')",
        "SELECT * FROM query('COPY (SELECT 1) TO ''" + str(data.parent / "q.csv") + "''')",
    ):
        whole = _narrowed(rollouts_collector, sql, None)
        narrowed = _narrowed(rollouts_collector, sql, ["r1"])
        assert whole[0] == 400 and narrowed == whole, (sql, whole, narrowed)
    assert _snapshot(data.parent) == before
    assert _rows(rollouts_collector, "SELECT count(*) FROM spans", ["r1"]) == [[4]]  # and it still answers


def _worker_pids(collector) -> set[int]:
    return {worker.process.pid for worker in collector.http.queries._workers._all}


HOSTILE_ROLLOUT_QUERIES = 160


def test_hostile_rollout_ids_get_a_400_or_a_200_and_write_nothing(rollouts_collector, tmp_path, monkeypatch):
    """Seeded (HOSTILE_SEED replays it): wrong types, huge lists, huge and odd strings, NULs, quotes
    and SQL in ids, duplicates, beside plain reads and write-or-peek statements. No 5xx, no query
    worker lost or replaced, no file written or changed, nothing from outside the store in a reply."""
    collector = rollouts_collector
    data = Path(collector.data_dir)
    canary, cwd = tmp_path / "canary", tmp_path / "cwd"
    canary.mkdir()
    cwd.mkdir()
    secret = f"canary-{secrets.token_hex(8)}"
    (canary / "secret.txt").write_text(secret)
    started_in = Path.cwd()  # the query workers' working directory may be this one
    monkeypatch.chdir(cwd)
    part = next(str(p) for p in sorted((data / "spans").rglob("part-*.parquet")))
    paths = Paths(str(data), str(data / "spans"), part, str(canary), secret, str(cwd), learned=(SPANS_URL,))
    port = int(collector.http_endpoint.rsplit(":", 1)[1])
    pids, before = _worker_pids(collector), snapshot(data, canary)
    watcher = Watcher(cwd, canary)
    sender = HttpSender("127.0.0.1", port, timeout_s=120)
    sent, outcomes = [], []
    for n in range(HOSTILE_ROLLOUT_QUERIES):
        query = rollout_ids_query(random.Random(f"{SEED}/rollout-ids/{n}"), paths, n, ROLLOUTS)
        sent.append(query)
        outcomes.append(ask(sender, query, paths, "rollout-ids", n))
    time.sleep(0.5)  # a write that lands just after its reply
    appeared = watcher.stop()
    replay = f"replay with HOSTILE_SEED={SEED}"

    def listing(items) -> str:
        return "\n".join(map(str, list(items)[:12]))

    wrong = [
        f"#{o.index} {q.kind} {str(q.rollout_ids)[:80]!r} -> {o.code} {o.reply[:200]}"
        for q, o in zip(sent, outcomes)
        if o.code is None or o.code >= 500 or (q.allowed is not None and o.code not in q.allowed)
    ]
    assert not wrong, f"{replay}\n{listing(wrong)}"
    kinds = {q.kind.split("-")[1] for q in sent}
    assert {"read", "raw", "copy"} <= kinds and {o.code for o in outcomes} == {200, 400}, (kinds, replay)
    assert _worker_pids(collector) == pids, f"a query worker died or was replaced; {replay}"
    assert _rows(collector, DISTINCT_ROLLOUTS) == [[3]] and _rows(collector, DISTINCT_ROLLOUTS, ["r2"]) == [[1]]
    assert changed(before, snapshot(data, canary)) == [], replay
    assert appeared == [], f"files appeared outside the store; {replay}\n{listing(appeared)}"
    written = [t for q in sent for t in q.targets if (cwd / t).exists() or (started_in / t).exists()]
    assert written == [], f"{replay}\n{listing(written)}"
    leaked = [o for o in outcomes if o.secret or o.leaked]
    assert not leaked, f"{replay}\n{listing(leaked)}"
