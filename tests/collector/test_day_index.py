"""Day indexes (collector/day_index.py): a lookup by rollout skips the days whose index rules its ids
out, without listing them, and answers as it does without them and as a whole-store connect; a write
into a day removes its index, also when it races the builder; an index that is not whole and
confirmed is never trusted; the pipeline indexes past days only, a few per pass. On S3:
test_day_index_s3.py.

The store spans four days of two services, written the collector's way (Store.write_segment): rollouts
in random hours, rollouts with spans on both sides of a midnight, and rollouts whose LLM span is a
wrapper only because of a call the gateway recorded, without the rollout's id, in the next day.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lookup_helpers import ListingSpy, rollout_spans, spans_table

from lightning_otel.collector import connect, day_index, rollout_index
from lightning_otel.collector.day_index import CONFIRMED_NAME, INDEX_NAME, DayIndex, build_day_index
from lightning_otel.collector.pipeline import DAY_INDEXES_PER_PASS, Pipeline
from lightning_otel.collector.rollout_lookup import rollout_files
from lightning_otel.collector.store import Store
from lightning_otel.collector.wal import WriteAheadLog

BASE_HOUR = 20_400 * 24  # a UTC midnight long ago
DAYS = 4
HOUR_US = 3_600_000_000
QUERIES = (
    "SELECT * FROM llm_calls WHERE rollout_id = ? ORDER BY span_id",
    "SELECT count(*) FROM spans WHERE rollout_id = ?",
    "SELECT * FROM rollouts WHERE rollout_id = ?",
)
RANDOM = [f"ro-{i:03d}" for i in range(60)]
SPLIT = [f"split-{d}" for d in range(DAYS - 1)]  # hour 23 of day d and hour 0 of day d + 1
WRAPPED = [f"wrap-{d}" for d in range(DAYS - 1)]  # its wrapper's inner call in day d + 1, by the gateway


def _trace(rollout: str) -> str:
    return hashlib.blake2b(rollout.encode(), digest_size=16).hexdigest()


def _write(store: Store, rollouts: list[str], hour: int, segment: int, rooted: bool = True) -> None:
    """`rollouts`' spans in hour `hour` (from BASE_HOUR) as the collector writes one WAL segment."""
    table = rollout_spans(
        rollouts,
        began=lambda number: (BASE_HOUR + hour) * HOUR_US + 60_000_000 * (number + 1) + segment * 1_000_000,
        tag=lambda rollout: f"{_trace(rollout)[:8]}{hour:04x}{segment:02x}",
        trace=_trace,
        rooted=lambda _: rooted,
        prompt=[hour, segment],
    )
    store.write_segment(f"{hour:06d}-{segment:02x}", table)


def _write_wrapped(store: Store, rollout: str, midnight_hour: int) -> None:
    """A root and an LLM span without ids just before midnight; inside the latter, just after
    midnight, an LLM call with ids that the gateway recorded without the rollout id."""
    midnight = midnight_hour * HOUR_US
    spans = [  # span id, rollout, kind, start, end, completion ids, service
        ("w0", rollout, "AGENT", midnight - 1_000_000, midnight + 1_000_000, None, "agent"),
        ("w1", rollout, "LLM", midnight - 100_000, midnight + 100_000, None, "agent"),
        ("w2", None, "LLM", midnight + 10_000, midnight + 20_000, [4], "gateway"),
        ("w3", rollout, "EVALUATOR", midnight - 50_000, midnight - 40_000, None, "agent"),
    ]
    n = len(spans)
    table = spans_table(
        {
            "trace_id": pa.array([_trace(rollout)] * n),
            "span_id": pa.array([s[0] for s in spans]),
            "rollout_id": pa.array([s[1] for s in spans], pa.string()),
            "span_kind": pa.array([s[2] for s in spans]),
            "is_rollout_root": pa.array([s[2] == "AGENT" for s in spans]),
            "start_time": pa.array([s[3] for s in spans], pa.timestamp("us", tz="UTC")),
            "end_time": pa.array([s[4] for s in spans], pa.timestamp("us", tz="UTC")),
            "completion_token_ids": pa.array([s[5] for s in spans], pa.list_(pa.int32())),
            "reward_name": pa.array(["reward" if s[2] == "EVALUATOR" else None for s in spans]),
            "reward_value": pa.array([1.0 if s[2] == "EVALUATOR" else None for s in spans]),
            "service_name": pa.array([s[6] for s in spans]),
        },
        n,
    )
    store.write_segment(f"wrap-{midnight_hour}", table)


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(tmp_path / "data")
    store.ensure_schema_file()
    rng = random.Random(37)
    slots: defaultdict[tuple[int, int], list[str]] = defaultdict(list)
    for rollout in RANDOM:
        slots[(rng.randrange(DAYS * 24), rng.randrange(2))].append(rollout)
    for (hour, segment), rollouts in sorted(slots.items()):
        _write(store, rollouts, hour, segment)
    for day, (split, wrapped) in enumerate(zip(SPLIT, WRAPPED)):
        _write(store, [split], day * 24 + 23, 2)
        _write(store, [split], day * 24 + 24, 2, rooted=False)
        _write_wrapped(store, wrapped, BASE_HOUR + (day + 1) * 24)
    return store


def _answers(conn, rollout: str) -> list:
    return [conn.execute(sql, [rollout]).fetchall() for sql in QUERIES]


def _whole_store_answers(store: Store, rollouts: list[str]) -> dict[str, list]:
    """_answers for each of `rollouts` from a whole-store connect, one query per view (each is slow)."""
    conn = connect(store.uri)
    found: dict[str, list] = {rollout: [[], [(0,)], []] for rollout in rollouts}
    for number in (0, 2):
        result = conn.execute(QUERIES[number].replace("rollout_id = ?", "list_contains(?, rollout_id)"), [rollouts])
        column = [d[0] for d in result.description].index("rollout_id")
        for row in result.fetchall():
            found[row[column]][number].append(row)
    counts = "SELECT rollout_id, count(*) FROM spans WHERE list_contains(?, rollout_id) GROUP BY rollout_id"
    for rollout, count in conn.execute(counts, [rollouts]).fetchall():
        found[rollout][1] = [(count,)]
    return found


def _listed(store: Store, rollouts: list[str]) -> list[str]:
    return rollout_files(duckdb.connect(), store, rollouts)


def _index_all(store: Store) -> list[str]:
    days = sorted(store.day_dirs()[1])
    assert len(days) == DAYS + DAYS - 1  # the agent's days, the gateway's
    for day in days:
        assert build_day_index(store, day)
    return days


def _day(store: Store, hour: int, service: str = "agent") -> str:
    return store.partition_dir(service, BASE_HOUR + hour).rsplit("/", 1)[0]


def _days_listed(store: Store, rollouts: list[str]) -> set[str]:
    """The day directories a lookup of `rollouts` lists (the store's file system watched)."""
    listed: list[str] = []
    real, store.fs = store.fs, ListingSpy(store.fs, listed)
    try:
        _listed(store, rollouts)
    finally:
        store.fs = real
    return {day for day in store.day_dirs()[1] if any(path == day or path.startswith(day + "/") for path in listed)}


def _days_holding(store: Store, rollout: str) -> set[str]:
    """The day directories with a span of `rollout` or of its traces, read whole with pyarrow."""
    tables = {info.path: pq.read_table(info.path, columns=["rollout_id", "trace_id"]) for info in store.files()}
    traces = {t for table in tables.values() for r, t in zip(*table.to_pydict().values()) if r == rollout}
    return {
        day_index.day_of(store, path)
        for path, table in tables.items()
        if rollout in table.column("rollout_id").to_pylist() or traces & set(table.column("trace_id").to_pylist())
    }


def test_a_lookup_answers_the_same_with_day_indexes_without_them_and_as_a_whole_store_connect(store):
    wanted = sorted(random.Random(7).sample(RANDOM, 12)) + SPLIT + WRAPPED + ["absent"]
    expected = _whole_store_answers(store, wanted)
    assert expected[wanted[0]] == _answers(connect(store.uri), wanted[0])  # as asked one at a time
    # the wrapper's call is the gateway's, in the next day: the rollout has no call of its own
    assert expected["wrap-1"][0] == [] and expected["wrap-1"][1] == [(3,)]
    assert len(expected["split-1"][0]) == 2 and expected["split-1"][1] == [(7,)]  # a call each day
    without = {rollout: _answers(connect(store.uri, rollout_ids=[rollout]), rollout) for rollout in wanted}
    files_without = {rollout: _listed(store, [rollout]) for rollout in wanted}
    _index_all(store)
    for rollout in wanted:
        assert _answers(connect(store.uri, rollout_ids=[rollout]), rollout) == without[rollout] == expected[rollout]
        # the per-file indexes chose these files before; the day indexes only spare listings
        assert _listed(store, [rollout]) == files_without[rollout], rollout
    several = random.Random(8).sample(wanted, 5)
    conn = connect(store.uri, rollout_ids=several)
    assert all(_answers(conn, rollout) == expected[rollout] for rollout in several)


def test_a_lookup_lists_no_day_whose_index_rules_its_ids_out(store):
    every_day = set(store.day_dirs()[1])
    assert _days_listed(store, ["split-1"]) == every_day  # no index yet: every day is listed
    _index_all(store)
    for rollout in ["split-1", "wrap-0", "ro-005", "ro-031", "absent"]:
        holding = _days_holding(store, rollout)
        assert len(holding) <= 2 and _days_listed(store, [rollout]) == holding, rollout
    # the wrapped rollout's trace reaches the gateway's next day (the second round)
    assert _days_holding(store, "wrap-0") == {_day(store, 23), _day(store, 24, "gateway")}


def test_a_write_into_an_indexed_day_removes_its_index(store):
    _index_all(store)
    day = _day(store, 30)
    _write(store, ["late"], 30, 7)
    assert not os.path.exists(f"{day}/{INDEX_NAME}") and not DayIndex(store, day).trusted()
    assert all(DayIndex(store, other).trusted() for other in store.day_dirs()[1] if other != day)
    found = _answers(connect(store.uri, rollout_ids=["late"]), "late")
    assert found == _answers(connect(store.uri), "late") and found[1] == [(4,)]


def test_a_build_between_a_writers_first_delete_and_its_file_leaves_no_index(store, monkeypatch):
    """The builder lists the day while the file is written under its temporary name: its index,
    confirmed, lacks the file; the writer's delete once the file is in place removes it."""
    day = _day(store, 30)
    write_sidecar = store._write_rollout_index  # runs once the file is written, before its rename

    def build_then_index(path, table, size):
        assert build_day_index(store, day)
        assert os.path.exists(f"{day}/{CONFIRMED_NAME}")
        write_sidecar(path, table, size)

    monkeypatch.setattr(store, "_write_rollout_index", build_then_index)
    _write(store, ["late"], 30, 7)
    assert not os.path.exists(f"{day}/{INDEX_NAME}")
    assert _answers(connect(store.uri, rollout_ids=["late"]), "late")[1] == [(4,)]


def test_a_lookup_while_a_file_is_in_place_but_not_yet_announced_finds_it(store, monkeypatch):
    """Between a writer's rename and its second delete, the index of the day as it was before the
    write is gone already (the writer's first delete): a lookup then finds the new file."""
    from lightning_otel.collector import store as store_module

    _index_all(store)
    day, real_fsync = _day(store, 30), store_module.fsync_path
    seen = []

    def rename_done(path: str) -> None:  # runs once the file has its name, before the second delete
        real_fsync(path)
        seen.append(_answers(connect(store.uri, rollout_ids=["late"]), "late")[1])

    monkeypatch.setattr(store_module, "fsync_path", rename_done)
    _write(store, ["late"], 30, 7)
    assert seen == [[(4,)]] and not DayIndex(store, day).trusted()


def test_a_file_replaced_after_the_builder_read_it_leaves_no_index(store, monkeypatch):
    """Same name, other content, written (with both deletes) after the builder read the day's files
    and before its index: the second listing sees another size and time, so no confirmation."""
    _write(store, ["early"], 30, 7)
    day, real_put = _day(store, 30), day_index._put

    def replace_then_put(store_: Store, path: str, data: bytes) -> None:
        if path.endswith(INDEX_NAME):
            _write(store, ["late"], 30, 7)  # the same segment, so the same file name
        real_put(store_, path, data)

    monkeypatch.setattr(day_index, "_put", replace_then_put)
    assert build_day_index(store, day) is False
    assert not DayIndex(store, day).trusted()
    assert _answers(connect(store.uri, rollout_ids=["late"]), "late")[1] == [(4,)]


def _write_after_first_listing(monkeypatch, store: Store, then=None) -> None:
    """The builder's first listing of a day is followed by a write of rollout `late` into that day;
    its second listing by `then()`."""
    listings = []
    real = day_index._span_files

    def listing(store_: Store, day_dir: str):
        found = real(store_, day_dir)
        listings.append(day_dir)
        if len(listings) == 1:
            _write(store, ["late"], 30, 7)
        elif then is not None:
            then()
        return found

    monkeypatch.setattr(day_index, "_span_files", listing)


def test_a_file_written_while_the_builder_reads_the_day_leaves_no_index(store, monkeypatch):
    day = _day(store, 30)
    _write_after_first_listing(monkeypatch, store)
    assert build_day_index(store, day) is False
    assert not os.path.exists(f"{day}/{INDEX_NAME}") and not os.path.exists(f"{day}/{CONFIRMED_NAME}")
    assert _answers(connect(store.uri, rollout_ids=["late"]), "late")[1] == [(4,)]


def test_an_index_its_builder_never_confirmed_is_not_trusted(store, monkeypatch):
    """The builder dies after writing an index that lacks a file written after its first listing."""
    day = _day(store, 30)

    def killed() -> None:
        raise RuntimeError("killed")

    _write_after_first_listing(monkeypatch, store, then=killed)
    with pytest.raises(RuntimeError, match="killed"):
        build_day_index(store, day)
    assert os.path.exists(f"{day}/{INDEX_NAME}") and not os.path.exists(f"{day}/{CONFIRMED_NAME}")
    monkeypatch.undo()
    assert _answers(connect(store.uri, rollout_ids=["late"]), "late")[1] == [(4,)]
    assert day in _days_listed(store, ["absent"])


def _zeroed(token: str, blocks: int, hashes: int = day_index.HASHES) -> bytes:
    """A day index with no bit set: trusted, it rules out every id."""
    header = f"{token} {hashes} {blocks}\n".encode()
    return b"lightning-otel day index 1\n" + header + bytes(64 * blocks) + b"\nend\n"


def _confirmation(token: str) -> bytes:
    return f"lightning-otel day index confirmed {token}\n".encode()


@pytest.mark.parametrize("blocks", [1, 200])  # read whole at once; read a block at a time
def test_an_index_not_whole_and_confirmed_is_never_trusted(store, blocks):
    _index_all(store)
    day, rollout = _day(store, 23), "split-0"
    token, other = "0123456789abcdef", "fedcba9876543210"
    good = _zeroed(token, blocks)

    def lookup_with(index: bytes | None, confirmation: bytes | None) -> tuple[list, bool]:
        for name, content in ((INDEX_NAME, index), (CONFIRMED_NAME, confirmation)):
            path = f"{day}/{name}"
            if os.path.isdir(path):
                os.rmdir(path)
            elif os.path.exists(path):
                os.unlink(path)
            if content == b"<directory>":
                os.mkdir(path)
            elif content is not None:
                with open(path, "wb") as handle:
                    handle.write(content)
        answers = _answers(connect(store.uri, rollout_ids=[rollout]), rollout)
        return answers, day in _days_listed(store, [rollout])

    expected = _answers(connect(store.uri), rollout)
    # Whole and confirmed, the empty index is trusted: the day is skipped and the rollout's spans there
    # missed. Every variant below would do the same if it were trusted.
    missed, listed = lookup_with(good, _confirmation(token))
    assert not listed and expected[1] == [(7,)] and missed[1] == [(3,)]  # only the next day's
    header_end = good.index(b"\n", 27) + 1
    variants = {
        "torn": (good[:-1], _confirmation(token)),
        "torn in the filter": (good[: header_end + 64 * blocks - 1], _confirmation(token)),
        "a block short, end marker kept": (good[: header_end + 64 * (blocks - 1)] + b"\nend\n", _confirmation(token)),
        "a block long": (good[:-5] + bytes(64) + b"\nend\n", _confirmation(token)),
        "no end marker": (good[:-5] + b"\nEND\n", _confirmation(token)),
        "another header": (good.replace(b"day index 1", b"day index 2"), _confirmation(token)),
        "a file's index": (rollout_index.encode([], 0), _confirmation(token)),
        "no hashes": (_zeroed(token, blocks, hashes=0), _confirmation(token)),
        "too many hashes": (_zeroed(token, blocks, hashes=17), _confirmation(token)),
        "a token not hex": (_zeroed("0123456789abcdeg", blocks), _confirmation("0123456789abcdeg")),
        "garbage": (random.Random(3).randbytes(len(good)), _confirmation(token)),
        "empty": (b"", _confirmation(token)),
        "a directory": (b"<directory>", _confirmation(token)),
        "unconfirmed": (good, None),
        "confirmed for another index": (good, _confirmation(other)),
        "confirmation torn": (good, _confirmation(token)[:-1]),
        "confirmation garbage": (good, b"x" * len(_confirmation(token))),
    }
    for name, (index, confirmation) in variants.items():
        assert lookup_with(index, confirmation) == (expected, True), name


def test_a_day_filter_never_rules_out_an_id_it_holds_and_seldom_one_it_does_not(tmp_path):
    store = Store(tmp_path / "data")
    day = f"{store.spans_root}/service=agent/date=2025-01-01"
    os.makedirs(day)
    rng = random.Random(37)
    held = [f"{rng.getrandbits(128):032x}" for _ in range(5000)] + ["", "r'\"\n\x00x", "é" * 300]
    traces = [f"{rng.getrandbits(128):032x}" for _ in range(5000)]
    token = "00000000000000aa"
    with open(f"{day}/{INDEX_NAME}", "wb") as handle:
        handle.write(day_index.encode(rollout_index.keys(held, traces), token))
    with open(f"{day}/{CONFIRMED_NAME}", "wb") as handle:
        handle.write(_confirmation(token))
    index = DayIndex(store, day)
    assert index.trusted() and os.path.getsize(f"{day}/{INDEX_NAME}") > 4096  # read a block at a time
    assert all(index.may_hold(rollout_index.keys([r])) for r in held)
    assert all(index.may_hold(rollout_index.keys(trace_ids=[t])) for t in traces)
    others = [f"{rng.getrandbits(128):032x}" for _ in range(20_000)] + traces  # a trace id is no rollout id
    wrongly = sum(DayIndex(store, day).may_hold(rollout_index.keys([r])) for r in others)
    assert wrongly <= 0.004 * len(others), wrongly  # about 0.2%


def test_the_pipeline_indexes_past_days_only_a_few_per_pass(tmp_path):
    store = Store(tmp_path / "data")
    for day in range(7):
        _write(store, [f"p-{day}"], day * 24 + 3, 0)
    pipeline = Pipeline(store, WriteAheadLog(tmp_path / "wal"), workers=0, compact_grace_s=600)
    days = [_day(store, day * 24) for day in range(7)]

    def indexed() -> list[bool]:
        return [DayIndex(store, day).trusted() for day in days]

    # the last day ended 5 minutes ago, within compaction's grace: not yet
    now = datetime.fromtimestamp((BASE_HOUR + 7 * 24) * 3600, UTC) + timedelta(minutes=5)
    assert DAY_INDEXES_PER_PASS == 4
    assert pipeline.index_days(now) == 4 and indexed() == [False] * 2 + [True] * 4 + [False]  # newest first
    assert pipeline.index_days(now) == 2 and indexed() == [True] * 6 + [False]
    assert pipeline.index_days(now) == 0
    assert pipeline.index_days(now + timedelta(minutes=10)) == 1 and all(indexed())
    # today's spans: maintenance (the real clock) leaves today's day without an index
    hour = int(datetime.now(UTC).timestamp()) // 3600 - BASE_HOUR
    _write(store, ["today"], hour, 0)
    today = _day(store, hour)
    pipeline.maintain()
    assert not os.path.exists(f"{today}/{INDEX_NAME}") and all(indexed())
    assert pipeline.index_days() == 0
