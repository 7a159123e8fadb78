"""A lookup by rollout finds the trainer's diagnostic spans about that rollout (merge_diagnostics,
input_diagnostics): they belong to the trainer's own trace and name the rollout only in an attribute,
on another day and in another service's partition than the rollout's spans. Compared with a
whole-store connect, with per-file indexes only and with day indexes too."""

from __future__ import annotations

import pyarrow as pa
from lookup_helpers import rollout_spans, spans_table

from lightning_otel.collector import connect
from lightning_otel.collector.day_index import build_day_index
from lightning_otel.collector.store import Store
from lightning_otel.core import schema

DAY_HOURS = 20_400 * 24  # a UTC midnight long ago
HOUR_US = 3_600_000_000
ROLLOUTS = ["diag-a", "diag-b", "diag-c"]
QUERIES = {
    "merge_diagnostics": "SELECT rollout_id, chain, merged, cause FROM merge_diagnostics WHERE rollout_id = ? ORDER BY chain",
    "input_diagnostics": "SELECT rollout_id, cause, excluded FROM input_diagnostics WHERE rollout_id = ? ORDER BY cause",
    "llm_calls": "SELECT span_id FROM llm_calls WHERE rollout_id = ? ORDER BY span_id",
}


def _diagnostics(rows: list[tuple[str, str, dict[str, str]]], start_us: int) -> pa.Table:
    """The trainer's spans: (span id, name, attributes), in one trace of its own, no rollout id."""
    n = len(rows)
    columns = {
        "trace_id": pa.array(["7" * 32] * n),
        "span_id": pa.array([span_id for span_id, _, _ in rows]),
        "name": pa.array([name for _, name, _ in rows]),
        "attributes": pa.array(
            [list(attributes.items()) for _, _, attributes in rows], pa.map_(pa.string(), pa.string())
        ),
        "start_time": pa.array([start_us + i for i in range(n)], pa.timestamp("us", tz="UTC")),
        "end_time": pa.array([start_us + i + 1 for i in range(n)], pa.timestamp("us", tz="UTC")),
        "service_name": pa.array(["trainer"] * n),
    }
    return spans_table(columns, n)


def _store(tmp_path) -> Store:
    store = Store(tmp_path / "data")
    store.ensure_schema_file()
    agent = rollout_spans(
        ROLLOUTS,
        began=lambda number: DAY_HOURS * HOUR_US + 60_000_000 * (number + 1),
        tag=lambda rollout: f"{ROLLOUTS.index(rollout):04x}",
        trace=lambda rollout: f"{ROLLOUTS.index(rollout) + 1:032x}",
        rooted=lambda _: True,
        prompt=[1, 2],
    )
    store.write_segment("000001-00", agent)
    merge, inputs = schema.SPAN_MERGE_BOUNDARY, schema.SPAN_INPUT_DIAGNOSTIC
    trainer = [  # the next day: a training run over diag-a and diag-b; diag-c has none
        ("d0", merge, {schema.MERGE_ROLLOUT: "diag-a", schema.MERGE_CHAIN: "0", schema.MERGE_MERGED: "true"}),
        ("d1", merge, {schema.MERGE_ROLLOUT: "diag-a", schema.MERGE_CHAIN: "1", schema.MERGE_MERGED: "false",
                       schema.MERGE_CAUSE: "retokenized"}),
        ("d2", inputs, {schema.INPUT_ROLLOUT: "diag-b", schema.INPUT_CAUSE: "no_reward", schema.INPUT_EXCLUDED: "true"}),
        ("d3", "train_step", {schema.MERGE_ROLLOUT: "diag-c"}),  # not a diagnostic span: names no rollout
    ]  # fmt: skip
    store.write_segment("000002-00", _diagnostics(trainer, (DAY_HOURS + 30) * HOUR_US))
    return store


def _answers(conn, rollout: str) -> dict[str, list]:
    return {name: conn.execute(sql, [rollout]).fetchall() for name, sql in QUERIES.items()}


def test_a_lookup_finds_the_trainers_diagnostics_of_the_rollout(tmp_path):
    store = _store(tmp_path)
    whole = {rollout: _answers(connect(store.uri), rollout) for rollout in ROLLOUTS}
    assert [row[1:] for row in whole["diag-a"]["merge_diagnostics"]] == [(0, True, None), (1, False, "retokenized")]
    assert whole["diag-b"]["input_diagnostics"] == [("diag-b", "no_reward", True)]
    assert whole["diag-c"]["merge_diagnostics"] == whole["diag-c"]["input_diagnostics"] == []
    for rollout in ROLLOUTS:
        assert _answers(connect(store.uri, rollout_ids=[rollout]), rollout) == whole[rollout], rollout
    days = sorted(store.day_dirs()[1])
    assert len(days) == 2 and all(build_day_index(store, day) for day in days)
    for rollout in ROLLOUTS:
        assert _answers(connect(store.uri, rollout_ids=[rollout]), rollout) == whole[rollout], rollout
