"""The read door's `rollout_ids` (POST /v1/query): the views narrowed to those rollouts' files (the
same rows for them, none of other rollouts'), behind the same door: bad values are 400s, writes are
refused as on the whole store, and seeded hostile values (hostile_sql.rollout_ids_query) get a 400 or
a 200 and write nothing."""

from __future__ import annotations

import json
import random
import secrets
import time
from pathlib import Path

import pytest
from helpers import file_digests, local_collector
from hostile_campaign import QUERY_TOKEN, SEED, Watcher, ask, changed, snapshot
from hostile_client import HttpSender
from hostile_sql import Paths, rollout_ids_query
from otlp_helpers import make_spans, post, request_bytes
from test_collector_s3 import s3_endpoint  # noqa: F401  (a fixture: a moto S3 server)

from lightning_otel.collector.query_limits import MAX_ROLLOUT_ID_BYTES, MAX_ROLLOUT_IDS
from lightning_otel.collector.query_sandbox import SPANS_URL
from lightning_otel.core import schema

pytestmark = pytest.mark.integration


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
    before = file_digests(data.parent)
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
    assert file_digests(data.parent) == before
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
