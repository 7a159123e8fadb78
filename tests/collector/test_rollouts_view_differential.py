"""The `rollouts` and `llm_calls` views against a plain-SQL reference written from their definitions
(docs/sql.md), over a small store where every span is stored more than once (a retried export in
the same file, a compaction overlap in another), with framework wrappers, rewards reported twice,
several policy versions and rollouts with nothing but a reward.

The reference first keeps one copy of each (trace_id, span_id), then computes every column from that
deduplicated table; the views group some columns straight from spans_raw (query.py says why), so
this is what would catch a column that a span's copies do change.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from lightning_otel.collector import connect
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store
from lightning_otel.core import schema

ROLLOUTS = 60
_US = pa.timestamp("us", tz="UTC")


def _rollout_spans(rng: random.Random, index: int) -> list[dict]:
    """One rollout's spans: a root, LLM calls (some with token ids, some wrapped by a framework's
    span without ids, some without ids alone), tool calls and reward reports."""
    rollout, trace = f"r-{index:03d}", f"{rng.getrandbits(128):032x}"
    began = 1_800_000_000_000_000 + index * 10_000_000
    common = {"rollout_id": rollout, "task_id": f"task-{index % 7}", "attempt": index % 3, "trace_id": trace}
    common["service_name"] = "agent" if index % 5 else "other-agent"
    version = [None, "1", "2"][index % 3]
    spans = [
        {
            **common,
            "name": "rollout",
            "span_kind": "AGENT",
            "is_rollout_root": True,
            "start_time": began,
            "end_time": began + 9_000_000,
            "status_code": "ERROR" if index % 11 == 0 else "OK",
            "attributes": [(schema.ROLLOUT_SPLIT, "eval")] if index % 4 == 0 else [],
        }
    ]
    at = began + 1000
    for call in range(rng.randrange(0, 4)):
        shape = rng.choice(["ids", "wrapped", "bare", "inner_client", "twin"])
        ids = shape in ("ids", "wrapped", "inner_client")
        start, end = at, at + 200_000
        llm = {**common, "name": f"call-{call}", "span_kind": "LLM", "start_time": start, "end_time": end}
        llm["policy_version"] = version if rng.random() < 0.8 else "3"
        if ids:
            llm |= {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "completion_logprobs": [-0.5]}
        llm["token_count_completion"] = rng.randrange(1, 50)
        spans.append(llm)
        if shape == "wrapped":  # a framework's span around the SDK call: not a call of its own
            spans.append({**llm, "name": "wrapper", "start_time": start - 10, "end_time": end + 10} | _no_ids())
        if shape == "inner_client":  # a GenAI client span inside the captured call
            spans.append({**llm, "name": "client", "start_time": start + 5, "end_time": end - 5} | _no_ids())
        if shape == "twin":  # two spans without ids with one window: the larger span id is the call
            spans.append({**llm, "name": "twin"} | _no_ids())
        at = end + 1000
    for tool in range(rng.randrange(0, 3)):
        spans.append({**common, "name": f"tool-{tool}", "span_kind": "TOOL", "start_time": at, "end_time": at + 10})
        at += 100
    for name in rng.sample(["reward", "format", "length"], rng.randrange(0, 3)):
        for report in range(rng.randrange(1, 3)):  # reported again later: the latest counts
            spans.append(
                {
                    **common,
                    "name": "reward",
                    "span_kind": "EVALUATOR",
                    "reward_name": name,
                    "reward_value": float(rng.randrange(0, 5)),
                    "start_time": at + 20_000_000 + report * 1000,  # after the rollout's own spans
                    "end_time": at + 20_000_000 + report * 1000 + 1,
                }
            )
    for span in spans:
        span["span_id"] = f"{rng.getrandbits(64):016x}"
    return spans


def _no_ids() -> dict:
    return {"prompt_token_ids": None, "completion_token_ids": None, "completion_logprobs": None}


def _table(rows: list[dict]) -> pa.Table:
    return pa.table(
        {
            f.name: pa.array([r.get(f.name) for r in rows], _US if f.name.endswith("_time") else f.type)
            for f in SPANS_SCHEMA
        },
        schema=SPANS_SCHEMA,
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng, rows = random.Random(11), []
    for index in range(ROLLOUTS):
        rows += _rollout_spans(rng, index)
    # An inner call recorded by another service without the rollout id: it still makes the span
    # around it a wrapper. And a rollout with nothing but reward reports.
    wrapper = next(r for r in rows if r["name"] == "wrapper")
    rows.append(
        {**wrapper, "name": "sdk", "rollout_id": None, "span_id": "f" * 16, "start_time": wrapper["start_time"] + 1}
    )
    rows[-1] |= {"end_time": wrapper["end_time"] - 1, "completion_token_ids": [9], "service_name": "sdk"}
    rows.append({"trace_id": "e" * 32, "span_id": "e" * 16, "rollout_id": "r-rewards-only", "name": "reward",
                 "span_kind": "EVALUATOR", "reward_name": "reward", "reward_value": 1.0,
                 "start_time": 1_700_000_000_000_000, "end_time": 1_700_000_000_000_001})  # fmt: skip
    # A rollout over two traces whose exporter numbers span ids per trace (a custom id generator):
    # the same span id in each trace is two spans, not two copies of one.
    for trace in ("c" * 32, "d" * 32):
        common = {
            "trace_id": trace,
            "rollout_id": "r-two-traces",
            "task_id": "task-0",
            "start_time": 1_800_900_000_000_000,
        }
        rows.append({**common, "span_id": "1".zfill(16), "name": "call", "span_kind": "LLM",
                     "end_time": 1_800_900_001_000_000, "completion_token_ids": [5]})  # fmt: skip
        rows.append({**common, "span_id": "2".zfill(16), "name": "tool", "span_kind": "TOOL",
                     "end_time": 1_800_900_000_000_010})  # fmt: skip
    rng.shuffle(rows)
    data = Store(tmp_path_factory.mktemp("store"))
    data.ensure_schema_file()
    directory = data.partition_dir("agent", 500_000)
    retried = rows[: len(rows) // 2]  # a retried export: stored twice in one file
    data.write(_table(rows[: len(rows) // 2] + retried), f"{directory}/part-0.parquet")
    data.write(_table(rows[len(rows) // 2 :]), f"{directory}/part-1.parquet")
    data.write(_table(list(reversed(rows))), f"{directory}/compact-0.parquet")  # compaction overlap
    return data


def _reference(conn) -> None:
    conn.execute("CREATE TEMP TABLE d AS SELECT DISTINCT ON (trace_id, span_id) * FROM spans_raw")
    conn.execute("""CREATE TEMP TABLE ref_calls AS SELECT c.* FROM d c WHERE c.span_kind = 'LLM' AND NOT (
        c.completion_token_ids IS NULL AND EXISTS (
            SELECT 1 FROM d i WHERE i.trace_id = c.trace_id AND i.span_kind = 'LLM' AND i.span_id <> c.span_id AND (
                i.start_time >= c.start_time AND i.end_time <= c.end_time
                    AND (i.completion_token_ids IS NOT NULL OR i.start_time > c.start_time
                         OR i.end_time < c.end_time OR i.span_id > c.span_id)
                OR i.completion_token_ids IS NOT NULL
                    AND c.start_time >= i.start_time AND c.end_time <= i.end_time)))""")
    conn.execute("""CREATE TEMP TABLE ref_latest AS
        SELECT rollout_id, reward_name AS name, reward_value AS value FROM d r
        WHERE reward_name IS NOT NULL AND rollout_id IS NOT NULL AND start_time = (
            SELECT max(start_time) FROM d l WHERE l.rollout_id = r.rollout_id AND l.reward_name = r.reward_name)""")


REFERENCE_ROLLOUTS = f"""
    SELECT rollout_id, max(task_id), max(attempt), max(service_name),
           min(trace_id) FILTER (WHERE is_rollout_root),
           min(start_time) FILTER (WHERE reward_name IS NULL), max(end_time) FILTER (WHERE reward_name IS NULL),
           (SELECT count(*) FROM ref_calls c WHERE c.rollout_id = d.rollout_id),
           count(*) FILTER (WHERE span_kind = 'TOOL'),
           (SELECT value FROM ref_latest l WHERE l.rollout_id = d.rollout_id AND l.name = 'reward'),
           (SELECT map_from_entries(list(struct_pack(k := name, v := value) ORDER BY name))
            FROM ref_latest l WHERE l.rollout_id = d.rollout_id),
           list(DISTINCT policy_version ORDER BY policy_version) FILTER (WHERE policy_version IS NOT NULL),
           coalesce(bool_or(is_rollout_root AND status_code = 'ERROR'), false),
           coalesce(max(attributes['{schema.ROLLOUT_SPLIT}']) FILTER (WHERE is_rollout_root OR span_kind = 'LLM'),
                    '{schema.SPLIT_TRAIN}')
    FROM d WHERE rollout_id IS NOT NULL GROUP BY rollout_id ORDER BY rollout_id"""


def test_rollouts_match_the_reference_over_deduplicated_spans(store):
    conn = connect(store.uri)
    assert (
        conn.execute("SELECT count(*) FROM spans_raw").fetchone()[0]
        > conn.execute("SELECT count(*) FROM spans").fetchone()[0]
    )
    _reference(conn)
    expected = conn.execute(REFERENCE_ROLLOUTS).fetchall()
    got = conn.execute("""SELECT rollout_id, task_id, attempt, service_name, trace_id, start_time, end_time,
                                 llm_calls, tool_calls, reward, rewards, policy_versions, failed, split
                          FROM rollouts ORDER BY rollout_id""").fetchall()  # fmt: skip
    assert len(got) == ROLLOUTS + 2
    assert got == expected
    # The store does exercise what the columns depend on.
    assert {row[8] for row in got} >= {0, 1, 2} and any(row[7] for row in got) and any(row[12] for row in got)
    assert any(row[5] is None for row in got) and any(row[11] and len(row[11]) > 1 for row in got)
    wrappers = conn.execute("SELECT count(*) FROM llm_spans WHERE is_wrapper").fetchone()[0]
    assert wrappers >= 3


def test_llm_calls_match_the_reference(store):
    conn = connect(store.uri)
    _reference(conn)
    query = "SELECT trace_id, span_id, rollout_id, token_count_completion FROM {} ORDER BY ALL"
    assert conn.execute(query.format("llm_calls")).fetchall() == conn.execute(query.format("ref_calls")).fetchall()
