"""The training job's window behind its watermark (trainer/selection_window.py): the pure rule, the
collector's windowed views, and scheduled runs on a real store (no vLLM: no replica to swap into)
where a late reward inside the look-back is trained, one after it only by back-fill, a crash between
selection and commit still trains each rollout once, and the run reads only the window's partitions."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.trainer.checkpoints import CheckpointStore
from lightning_otel.trainer.config import TrainConfig
from lightning_otel.trainer.selection_window import next_watermark, window

T = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def test_the_first_run_and_a_backfill_read_everything_later_runs_the_window():
    assert window(None, 3600, 600, backfill=False) == window(T, 3600, 600, backfill=True)
    assert window(None, 3600, 600, backfill=False).select_from is None
    later = window(T, 3600, 600, backfill=False)
    assert later.select_from == datetime(2026, 12, 4, 11, 0, tzinfo=UTC)
    assert later.read_from == datetime(2026, 12, 4, 10, 50, tzinfo=UTC)


def test_the_watermark_is_the_cutoff_held_back_by_what_is_still_to_come():
    assert next_watermark(T, 30, None, None) == T - timedelta(seconds=30)
    open_since = T - timedelta(minutes=20)
    assert next_watermark(T, 30, open_since, None) == open_since
    assert next_watermark(T, 30, open_since, T - timedelta(hours=2)) == T - timedelta(hours=2)
    assert next_watermark(T, 30, None, T) == T - timedelta(seconds=30)  # never past the cutoff


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1e9)


def _rollouts(tracer, task: str, started: datetime, rewards: tuple | None, prefix: str, split: str = "train") -> None:
    """Two rollouts of `task`, each one LLM call of 20 s from `started`; rewards (None: not yet)."""
    for index in range(2):
        identity = {schema.ROLLOUT_ID: f"{prefix}-{index}", schema.TASK_ID: task, schema.ROLLOUT_SPLIT: split}
        span = tracer.start_span(
            "ChatCompletion",
            start_time=_ns(started),
            attributes={
                **identity,
                schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                schema.PROMPT_TOKEN_IDS: [5, 6, 7, 8, 9],
                schema.COMPLETION_TOKEN_IDS: [30 + index, 31, 32],
                schema.COMPLETION_LOGPROBS: [-6.0] * 3,
            },
        )
        span.end(end_time=_ns(started + timedelta(seconds=20)))
        if rewards is not None:
            _reward(tracer, f"{prefix}-{index}", task, rewards[index])


def _reward(tracer, rollout_id: str, task: str, value: float) -> None:
    attributes = {schema.ROLLOUT_ID: rollout_id, schema.TASK_ID: task, schema.REWARD_NAME: "reward"}
    tracer.start_span("reward", attributes={**attributes, schema.REWARD_VALUE: value}).end()


def _send(collector, build) -> None:
    assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
    collector.flush()


def _ledger(state) -> list[str]:
    files = list((state / "checkpoints").glob("step-*/rollouts.parquet")) + list((state / "ledger").glob("*.parquet"))
    return sorted(rid for f in files for rid in pq.read_table(f).column("rollout_id").to_pylist())


def test_connect_since_reads_only_the_partitions_from_that_hour_on(tmp_path):
    now = datetime.now(UTC)
    with local_collector(tmp_path / "traces") as collector:
        _send(
            collector,
            lambda tracer: [
                _rollouts(tracer, "old", now - timedelta(hours=5), (1.0, 0.0), "old"),
                _rollouts(tracer, "new", now - timedelta(minutes=5), (1.0, 0.0), "new"),
            ],
        )
        everything = connect(collector.data_dir).execute("SELECT count(*) FROM spans").fetchone()[0]
        windowed = connect(collector.data_dir, since=now - timedelta(hours=1))
        assert everything == 8
        assert windowed.execute(
            "SELECT list_sort(list(rollout_id)) FROM rollouts WHERE start_time IS NOT NULL"
        ).fetchone()[0] == ["new-0", "new-1"]
        # the old rollouts' reward spans are new, but without their calls they have no start: never selected
        assert windowed.execute("SELECT count(*) FROM spans WHERE rollout_id LIKE 'old-%'").fetchone()[0] == 2
        assert connect(collector.data_dir, since=now + timedelta(hours=2)).execute(
            "SELECT count(*) FROM spans"
        ).fetchone() == (0,)


@pytest.fixture
def job(tmp_path, tiny_model_dir):
    config = TrainConfig()
    config.model.base = str(tiny_model_dir)
    config.server.replicas = []  # nothing to swap into: the selection is what is tested
    config.selection.min_age_s, config.selection.min_rollouts = 0.0, 2
    config.selection.lookback_s, config.selection.max_rollout_s = 3600.0, 3600.0
    config.checkpoints.dir = str(tmp_path / "state")
    with local_collector(tmp_path / "traces") as collector:
        config.store.data_dir = str(collector.data_dir)
        config.store.otlp_endpoint = collector.http_endpoint + "/v1/traces"
        yield config, collector


def test_late_rewards_inside_the_look_back_train_outside_it_only_by_backfill(job):
    from lightning_otel.trainer.training_run import run_once

    config, collector = job
    state, now = CheckpointStore(Path(config.checkpoints.dir)), datetime.now(UTC)
    _send(
        collector,
        lambda tracer: [
            _rollouts(tracer, "fresh", now - timedelta(minutes=10), (1.0, 0.0), "fresh"),
            _rollouts(tracer, "late", now - timedelta(minutes=30), None, "late"),  # rewarded after run 1
            _rollouts(tracer, "stale", now - timedelta(hours=3), None, "stale"),  # rewarded after the look-back
            _rollouts(tracer, "held-out", now - timedelta(minutes=10), (1.0, 0.0), "eval", split="eval"),
        ],
    )
    first = run_once(config)
    assert first.status == "trained" and _ledger(state.root) == ["fresh-0", "fresh-1"]
    assert first.eval_rollouts == 2 and "eval-0" not in first.excluded  # counted, not excluded for a fault
    watermark = state.watermark()
    assert watermark is not None and now - timedelta(seconds=5) < watermark <= datetime.now(UTC)

    def rewards(tracer):
        for prefix in ("late", "stale"):
            _reward(tracer, f"{prefix}-0", prefix, 1.0)
            _reward(tracer, f"{prefix}-1", prefix, 0.0)

    _send(collector, rewards)
    second = run_once(config)
    assert second.status == "trained" and _ledger(state.root) == ["fresh-0", "fresh-1", "late-0", "late-1"]
    assert run_once(config).status == "nothing to do"  # "stale" started 3 h before the watermark
    config.selection.backfill = True
    assert run_once(config).status == "trained"
    assert _ledger(state.root) == ["fresh-0", "fresh-1", "late-0", "late-1", "stale-0", "stale-1"]
    assert run_once(config).status == "nothing to do"  # the ledger still keeps a back-fill exactly-once


def test_a_crash_between_selection_and_commit_trains_each_rollout_once(job):
    from lightning_otel.trainer.training_run import run_once

    config, collector = job
    state, now = CheckpointStore(Path(config.checkpoints.dir)), datetime.now(UTC)
    _send(collector, lambda tracer: _rollouts(tracer, "a", now - timedelta(minutes=10), (1.0, 0.0), "a"))
    assert run_once(config).status == "trained"
    before = state.watermark()
    time.sleep(0.01)
    _send(collector, lambda tracer: _rollouts(tracer, "b", now - timedelta(minutes=40), (1.0, 0.0), "b"))

    class Crash(Exception):
        pass

    def crash_after_update(stage: str) -> None:
        if stage == "update":
            raise Crash

    with pytest.raises(Crash):
        run_once(config, on_stage=crash_after_update)
    assert state.watermark() == before and _ledger(state.root) == ["a-0", "a-1"]
    assert run_once(config).status == "trained"
    assert run_once(config).status == "nothing to do"
    assert _ledger(state.root) == ["a-0", "a-1", "b-0", "b-1"]


def test_max_rollouts_holds_the_watermark_at_the_newest_rollout_it_took(job):
    from lightning_otel.trainer.training_run import run_once

    config, collector = job
    state, now = CheckpointStore(Path(config.checkpoints.dir)), datetime.now(UTC)
    config.selection.max_rollouts = 2
    _send(
        collector,
        lambda tracer: [
            _rollouts(tracer, "first", now - timedelta(minutes=50), (1.0, 0.0), "first"),
            _rollouts(tracer, "second", now - timedelta(minutes=20), (1.0, 0.0), "second"),
        ],
    )
    assert run_once(config).status == "trained" and _ledger(state.root) == ["first-0", "first-1"]
    held = state.watermark()
    assert held is not None and abs(held - (now - timedelta(minutes=50))) < timedelta(milliseconds=1)  # not "second"
    assert run_once(config).status == "trained"
    assert _ledger(state.root) == ["first-0", "first-1", "second-0", "second-1"]


def test_the_ledger_files_before_the_window_are_not_opened(tmp_path, monkeypatch):
    """Retired steps' ledger files are named with their newest start; a run's window passes over the
    older ones unopened and still gets every id it must not select (nulls and old-named files always)."""
    state = CheckpointStore(tmp_path / "state")
    steps = {  # step -> (ids, start times in us)
        1: (["a", "b"], [100, 200]),
        2: (["c", "d"], [300, None]),  # a start the ledger does not know: the file is always read
        3: (["e"], [None]),
        4: (["f", "g"], [500, 600]),
    }
    for step, (ids, starts) in steps.items():
        folder = state.checkpoints / f"step-{step:06d}"
        folder.mkdir()
        table = pa.table({"rollout_id": pa.array(ids, pa.string()), "start_us": pa.array(starts, pa.int64())})
        pq.write_table(table, folder / "rollouts.parquet")
        (folder / "state.json").write_text(json.dumps({"version": str(step)}))
    pq.write_table(pa.table({"rollout_id": ["old"]}), state.ledger_dir / "step-000000.parquet")  # no start_us
    state.retire(keep=2)  # steps 1 and 2 go to the ledger, 3 and 4 stay committed
    assert sorted(p.name for p in state.ledger_dir.iterdir()) == [
        "step-000000.parquet",
        "step-000001.newest-200.parquet",
        "step-000002.parquet",
    ]
    opened = []
    read_table = pq.read_table
    monkeypatch.setattr(
        pq, "read_table", lambda path, *a, **k: opened.append(Path(path).name) or read_table(path, *a, **k)
    )
    ids = lambda started_from: sorted(state.trained_ids(started_from).column("rollout_id").to_pylist())  # noqa: E731
    assert ids(None) == ["a", "b", "c", "d", "e", "f", "g", "old"]
    opened.clear()
    assert ids(300) == ["c", "d", "e", "f", "g", "old"]
    assert "step-000001.newest-200.parquet" not in opened and "step-000002.parquet" in opened
    opened.clear()
    assert ids(401) == ["d", "e", "f", "g", "old"]
    assert not any(name.startswith("step-000001") for name in opened)
    assert ids(200) == ["b", "c", "d", "e", "f", "g", "old"]  # the boundary: a start equal to it is kept
