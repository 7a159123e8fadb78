"""One rollout's lookup reads only the files that can hold it (connect(DATA, rollout_ids=...)).

The store is written the collector's way (Store.write_segment for WAL segments, Pipeline.compact for
compaction), over three hour partitions with two segment files each; one rollout spans two hours.
What a narrowed connection answers for a rollout is compared with a full connect's answer; which
files it reads is compared with the files whose rows hold the rollout (read here with pyarrow).
"""

from __future__ import annotations

import os
import random

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lookup_helpers import ListingSpy, rollout_spans, spans_table

from lightning_otel.collector import connect, rollout_index
from lightning_otel.collector.pipeline import Pipeline
from lightning_otel.collector.query_sandbox import sandboxed_connect
from lightning_otel.collector.rollout_index import sidecar_path
from lightning_otel.collector.rollout_lookup import rollout_files
from lightning_otel.collector.store import Store
from lightning_otel.collector.wal import WriteAheadLog

FIRST_HOUR = 490_000  # a closed hour long ago: Pipeline.compact merges every file of it
HOSTILE = "r'\"\n\x00x"  # quotes, a newline, a NUL: still looked up as itself
# Rollouts by (hour offset, segment); "split" is in two hours.
LAYOUT = {
    (0, 0): ["r1", "r2", "split"],
    (0, 1): ["r3", HOSTILE],
    (1, 0): ["r10", "split"],
    (1, 1): ["r4"],
    (2, 0): ["r5", "r6"],
    (2, 1): ["r7"],
}
ROLLOUTS = sorted({r for ids in LAYOUT.values() for r in ids})
EXTRA = "r8"  # written with hour 2's segment, but its spans start in hour 1
QUERIES = {
    "spans": "SELECT trace_id, span_id, name, span_kind, start_time FROM spans WHERE rollout_id = ? ORDER BY span_id",
    "llm_calls": "SELECT span_id, prompt_token_ids, completion_token_ids FROM llm_calls WHERE rollout_id = ? ORDER BY span_id",
    "rollouts": "SELECT rollout_id, trace_id, start_time, end_time, llm_calls, tool_calls, reward FROM rollouts WHERE rollout_id = ?",
}


def _spans(rollouts: list[str], hour: int, segment: int) -> pa.Table:
    """Per rollout: a root (the first hour it appears in), an LLM wrapper without ids around an LLM
    call with ids, a reward; span ids unique per (rollout, hour, segment)."""
    return rollout_spans(
        rollouts,
        began=lambda number: (FIRST_HOUR + hour) * 3_600_000_000 + 60_000_000 * (number + 1) + segment * 1_000_000,
        tag=lambda rollout: f"{(ROLLOUTS + [EXTRA]).index(rollout):02x}{hour:02x}{segment:02x}",
        trace=lambda rollout: f"{sum(map(ord, rollout)):032x}",
        rooted=lambda rollout: hour == min((h for (h, _), ids in LAYOUT.items() if rollout in ids), default=hour),
        prompt=[1, hour, segment],
    )


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(tmp_path / "data")
    store.ensure_schema_file()
    for (hour, segment), rollouts in LAYOUT.items():
        # one segment holds spans of two hours: write_segment splits it, one file (and index) per hour
        table = _spans(rollouts, hour, segment)
        if (hour, segment) == (2, 1):
            table = pa.concat_tables([table, _spans([EXTRA], 1, segment)])
        store.write_segment(f"{hour:06d}-{segment:02x}", table)
    return store


def _answers(conn, rollout: str) -> dict[str, list]:
    return {name: conn.execute(sql, [rollout]).fetchall() for name, sql in QUERIES.items()}


def _files_holding(store: Store, rollout: str) -> set[str]:
    """The span files with a row of `rollout`, read whole with pyarrow (not through the index)."""
    return {
        info.path
        for info in store.files()
        if rollout in pq.read_table(info.path, columns=["rollout_id"]).column("rollout_id").to_pylist()
    }


def _listed(store: Store, rollout: str) -> set[str]:
    return set(rollout_files(duckdb.connect(), store, [rollout])) - {f"{store.spans_root}/_schema.parquet"}


def _compact(store: Store, tmp_path, delete_inputs: bool) -> Pipeline:
    pipeline = Pipeline(store, WriteAheadLog(tmp_path / "wal"), workers=0)
    assert pipeline.compact(now=1.0) == 3  # one new file per hour partition
    if delete_inputs:
        pipeline.delete_doomed(now=1e12)
    return pipeline


def test_each_file_has_an_index_and_the_glob_reads_no_index_as_spans(store):
    files = store.files()
    assert len(files) == 7  # six segment files, and r8's hour of the (2, 1) segment
    assert all(os.path.exists(sidecar_path(info.path)) for info in files)
    rows = sum(pq.read_metadata(info.path).num_rows for info in files)
    assert connect(store.uri).execute("SELECT count(*) FROM spans_raw").fetchone() == (rows,)
    # the query door's glob (tracestore://spans/**/*.parquet) as well
    assert sandboxed_connect(store.uri).execute("SELECT count(*) FROM spans_raw").fetchone() == (rows,)


@pytest.mark.parametrize("stage", ["written", "compacted, inputs not yet deleted", "compacted"])
def test_lookup_answers_as_a_full_connect_does(store, tmp_path, stage):
    if stage != "written":
        _compact(store, tmp_path, delete_inputs=stage == "compacted")
    full = connect(store.uri)
    for rollout in ROLLOUTS + [EXTRA, "absent"]:
        expected = _answers(full, rollout)
        assert _answers(connect(store.uri, rollout_ids=rollout), rollout) == expected, rollout
        if rollout != "absent":
            assert expected["spans"] and len(expected["llm_calls"]) >= 1  # the wrapper is no call
        assert _listed(store, rollout) == _files_holding(store, rollout), rollout
    # its two hours' files; while compaction's inputs remain, those and the compacted files
    assert len(_files_holding(store, "split")) == (4 if stage == "compacted, inputs not yet deleted" else 2)
    both = connect(store.uri, rollout_ids=["r1", "split"])
    assert _answers(both, "split") == _answers(full, "split") and _answers(both, "r1") == _answers(full, "r1")


def test_a_file_without_a_trustworthy_index_is_read(store):
    holding = sorted(_files_holding(store, "r4"))
    assert len(holding) == 1 and _listed(store, "r5") == _files_holding(store, "r5")
    sidecar = sidecar_path(holding[0])
    with open(sidecar, "rb") as handle:
        whole = handle.read()
    table = pq.read_table(holding[0])
    keys = rollout_index.keys(table.column("rollout_id").to_pylist(), table.column("trace_id").to_pylist())
    assert rollout_index.encode(keys, os.path.getsize(holding[0])) == whole  # what the collector wrote
    # Torn (twice), one for a file of another size (the file replaced), and none at all.
    torn = whole[: -len(b"\nend\n") - 1] + b"\nend\n"
    for content in (whole[:-2], torn, rollout_index.encode(keys, os.path.getsize(holding[0]) + 1), None):
        if content is None:
            os.unlink(sidecar)
        else:
            with open(sidecar, "wb") as handle:
                handle.write(content)
        assert holding[0] in _listed(store, "r5"), content  # not ruled out: read for every lookup
        r4 = connect(store.uri, rollout_ids="r4").execute(QUERIES["spans"], ["r4"]).fetchall()
        assert r4 == connect(store.uri).execute(QUERIES["spans"], ["r4"]).fetchall() and len(r4) == 4


def test_a_span_of_the_rollouts_trace_without_its_id_in_another_file_still_counts(store):
    """r9's LLM span without ids wraps a call that another service recorded in r9's trace without the
    rollout id (in that service's partition): it is a wrapper, so r9 has no calls."""
    began, trace = (FIRST_HOUR + 2) * 3_600_000_000 + 1_800_000_000, "9" * 32

    def spans(rollout, span_ids, kinds, windows, ids) -> pa.Table:
        n = len(span_ids)
        return spans_table(
            {
                "trace_id": pa.array([trace] * n),
                "span_id": pa.array(span_ids),
                "rollout_id": pa.array([rollout] * n, pa.string()),
                "span_kind": pa.array(kinds),
                "is_rollout_root": pa.array([k == "AGENT" for k in kinds]),
                "start_time": pa.array([began + a for a, _ in windows], pa.timestamp("us", tz="UTC")),
                "end_time": pa.array([began + b for _, b in windows], pa.timestamp("us", tz="UTC")),
                "completion_token_ids": pa.array([[4] if i else None for i in ids], pa.list_(pa.int32())),
                "service_name": pa.array(["agent" if rollout else "gateway"] * n),
            },
            n,
        )

    store.write_segment("000009-00", spans("r9", ["9a", "9b"], ["AGENT", "LLM"], [(0, 100), (10, 90)], [0, 0]))
    store.write_segment("000009-01", spans(None, ["9c"], ["LLM"], [(20, 30)], [1]))
    gateway = [info.path for info in store.files() if "service=gateway" in info.path]
    full = _answers(connect(store.uri), "r9")
    assert full["llm_calls"] == [] and full["rollouts"][0][4] == 0 and len(full["spans"]) == 2
    assert _answers(connect(store.uri, rollout_ids="r9"), "r9") == full
    assert _listed(store, "r9") == _files_holding(store, "r9") | set(gateway)


def test_files_that_cannot_hold_the_rollout_are_never_opened(store, tmp_path):
    _compact(store, tmp_path, delete_inputs=True)
    expected = _answers(connect(store.uri), "r4")
    # Every other span file becomes bytes no Parquet reader accepts, of its own size (its index
    # still describes it): a lookup that opened one would fail.
    others = [info for info in store.files() if info.path not in _files_holding(store, "r4")]
    assert len(others) == 2
    for info in others:
        with open(info.path, "wb") as handle:
            handle.write(b"x" * info.size)
    assert _answers(connect(store.uri, rollout_ids="r4"), "r4") == expected
    with pytest.raises(Exception, match="(?i)parquet"):
        connect(store.uri).execute(QUERIES["spans"], ["r4"]).fetchall()
    source = (
        connect(store.uri, rollout_ids="r4")
        .execute("SELECT sql FROM duckdb_views() WHERE view_name = 'spans_raw'")
        .fetchone()[0]
    )
    assert all(info.path not in source for info in others) and source.count(".parquet") == 2  # schema + one


def test_a_span_file_appears_only_once_its_index_is_in_place(tmp_path):
    store = Store(tmp_path / "data")
    path = f"{store.partition_dir('agent', FIRST_HOUR)}/part-000001-aa.parquet"
    os.makedirs(sidecar_path(path))  # where the index goes, something it cannot replace
    with pytest.raises(OSError):
        store.write_segment("000001-aa", _spans(["r1"], 0, 0))
    assert store.files() == []  # no file that every lookup would have to read


def test_compaction_deletes_each_input_with_its_index(store, tmp_path):
    before = {info.path for info in store.files()}
    _compact(store, tmp_path, delete_inputs=True)
    after = {info.path for info in store.files()}
    assert not before & after and len(after) == 3
    left = sorted(str(p) for p in (tmp_path / "data" / "spans").rglob("*.rollouts"))
    assert left == sorted(sidecar_path(path) for path in after)


def test_a_filter_never_rules_out_an_id_it_holds_and_seldom_one_it_does_not():
    rng = random.Random(37)
    held = [f"{rng.getrandbits(128):032x}" for _ in range(5000)] + ["", HOSTILE, "é" * 300]
    traces = [f"{rng.getrandbits(128):032x}" for _ in range(5000)]
    sidecar = rollout_index.encode(rollout_index.keys(held, traces), 1234)
    assert all(rollout_index.may_hold(sidecar, 1234, rollout_index.keys([r])) for r in held)
    assert all(rollout_index.may_hold(sidecar, 1234, rollout_index.keys(trace_ids=[t])) for t in traces)
    others = [f"{rng.getrandbits(128):032x}" for _ in range(20_000)] + traces  # a trace id is no rollout id
    wrongly = sum(rollout_index.may_hold(sidecar, 1234, rollout_index.keys([r])) for r in others)
    assert wrongly <= 3 * rollout_index.FALSE_POSITIVES * len(others), wrongly
    assert len(sidecar) < 10_010 * 2.5  # about 14 bits an id at 0.1%


def test_rollout_ids_take_one_id_or_several_strings(store):
    conn = connect(store.uri, rollout_ids=iter(["r4", "r5"]))
    # the files of r4 and r5: r5's also holds r6 (the views narrow files, not rows)
    assert {r for (r,) in conn.execute("SELECT DISTINCT rollout_id FROM spans").fetchall()} == {"r4", "r5", "r6"}
    with pytest.raises(TypeError, match="id is a string"):
        connect(store.uri, rollout_ids=[4])


def test_since_and_rollout_ids_narrow_together(store):
    from datetime import UTC, datetime

    since = datetime.fromtimestamp((FIRST_HOUR + 1) * 3600, UTC)
    listed = set(rollout_files(duckdb.connect(), store, ["split", "r1"], since)) - {
        f"{store.spans_root}/_schema.parquet"
    }
    assert listed == _files_holding(store, "split") - _files_holding(store, "r1")  # hour 0 is outside


def test_lookup_connections_share_only_the_read_only_views(store):
    """Lookups are cursors of one read-only database per process (lookup_connection.py): each
    has its own files, TEMP objects and registered tables, and none can drop or replace the views."""
    full = connect(store.uri)
    first, second = connect(store.uri, rollout_ids="r1"), connect(store.uri, rollout_ids="r5")  # other files
    first.execute("CREATE TEMP TABLE mine AS SELECT 1 AS x")
    first.register("registered", pa.table({"x": [1]}))
    for name in ("mine", "registered"):
        with pytest.raises(duckdb.CatalogException):
            second.execute(f"SELECT * FROM {name}")
    for statement in ("DROP VIEW llm_calls", "CREATE OR REPLACE VIEW spans AS SELECT 1", "CREATE TABLE t (x INT)"):
        with pytest.raises(duckdb.Error, match="read-only"):
            second.execute(statement)
    # each still reads its own rollout's files, as a full connect answers
    assert _answers(first, "r1") == _answers(full, "r1") and _answers(second, "r5") == _answers(full, "r5")
    assert first.execute("SELECT count(*) FROM spans WHERE rollout_id = 'r5'").fetchone() == (0,)
    assert second.execute("SELECT count(*) FROM spans WHERE rollout_id = 'r1'").fetchone() == (0,)
    first.close()
    assert _answers(connect(store.uri, rollout_ids="r1"), "r1") == _answers(full, "r1")  # closing one closes no other
    assert _answers(second, "r5") == _answers(full, "r5")


def test_since_lists_only_the_days_from_since_on_and_what_lies_outside_the_layout(tmp_path):
    """Store.files_since (connect(DATA, since=...), the training job's window) never lists the `date=`
    directories of earlier days: the listing costs what the window holds, not the store's age."""
    from datetime import UTC, datetime

    store = Store(tmp_path / "data")
    store.ensure_schema_file()
    for hour in (0, 30, 60):  # three days
        store.write_segment(f"{hour:06d}-00", _spans(["r1"], hour, 0))
    stray = f"{store.spans_root}/service=agent/stray.parquet"  # outside the date/hour layout: always kept
    pq.write_table(_spans(["r2"], 0, 1), stray)
    listed: list[str] = []
    store.fs = ListingSpy(store.fs, listed)  # notes each directory listed
    files = store.files_since(datetime.fromtimestamp((FIRST_HOUR + 30) * 3600, UTC))
    day = {hour: store.partition_dir("agent", FIRST_HOUR + hour).rsplit("/hour=", 1)[0] for hour in (0, 30, 60)}
    assert {f.rsplit("/hour=", 1)[0] for f in files if "/hour=" in f} == {day[30], day[60]}
    assert stray in files
    assert listed and not any(path.startswith(day[0]) for path in listed)  # the old day never listed
    assert any(path.startswith(day[30]) for path in listed)
