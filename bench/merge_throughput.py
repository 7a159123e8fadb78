"""Reconstruction + merge throughput: stored spans -> rollouts -> chains -> merged samples.

    python bench/merge_throughput.py --calls 20000

A store written through the collector's own Store: rollouts of 8 LLM calls (plus a root and a reward
span), prompts of 4,096 tokens and up, each call's prompt extending the previous call's prompt +
completion (+ 32 tool-output tokens), except one boundary in four where the history is rewritten.
Times, in one pass, each stage of `select_rollouts` + `build_batch`: the SQL and Parquet read into
Arrow, the reconstruction from that table (span trees, chains; `rollouts_from_table`), and the merge
(merge, advantages, weights). Reports LLM calls/s end to end (from Parquet) and once read
(reconstruction + merge), both measured directly, and the peak memory they added, scaled to 100k calls.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_otel.collector import connect
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store
from lightning_otel.trainer import SelectionConfig, build_batch
from lightning_otel.trainer.rollout_data import rollouts_from_table, selection_sql

CALLS_PER_ROLLOUT = 8


def rollout_rows(index: int, rng: np.random.Generator, start_us: int) -> list[dict]:
    rid, trace = f"r{index}", f"{index:032x}"
    rows = [
        dict(
            span_id=f"{index:010x}000000",
            parent_span_id=None,
            name="rollout",
            span_kind="AGENT",
            is_rollout_root=True,
            start=start_us,
            end=start_us + 10_000_000,
        )
    ]
    prompt = rng.integers(3, 150_000, 4096, dtype=np.int32)
    for k in range(CALLS_PER_ROLLOUT):
        completion = rng.integers(3, 150_000, 64, dtype=np.int32)
        rows.append(
            dict(
                span_id=f"{index:010x}{k + 1:06x}",
                parent_span_id=rows[0]["span_id"],
                name="ChatCompletion",
                span_kind="LLM",
                start=start_us + 1000 * (k + 1),
                end=start_us + 1000 * (k + 1) + 500,
                prompt=prompt,
                completion=completion,
                logprobs=np.full(64, -0.5),
            )
        )
        tool = rng.integers(3, 150_000, 32, dtype=np.int32)
        prompt = np.concatenate([prompt, completion, tool])
        if k % 4 == 3:  # rewrite history now and then: the next boundary fails
            prompt = prompt.copy()
            prompt[100] += 1
    rows.append(
        dict(
            span_id=f"{index:010x}ffffff",
            parent_span_id=rows[0]["span_id"],
            name="reward",
            span_kind="EVALUATOR",
            start=start_us + 9_000_000,
            end=start_us + 9_000_001,
            reward=float(rng.random()),
        )
    )
    for row in rows:
        row.update(trace_id=trace, rollout_id=rid, task_id=f"task-{index // 4}")
    return rows


def table(rows: list[dict]) -> pa.Table:
    def column(name, default=None):
        return [row.get(name, default) for row in rows]

    def lists(name: str, dtype: pa.DataType) -> pa.Array:
        return pa.array([row.get(name) for row in rows], pa.list_(dtype))

    n = len(rows)
    data = {
        "trace_id": column("trace_id"),
        "span_id": column("span_id"),
        "parent_span_id": column("parent_span_id"),
        "name": column("name"),
        "kind": ["INTERNAL"] * n,
        "start_time": column("start"),
        "end_time": column("end"),
        "duration_ms": [0.5] * n,
        "status_code": ["OK"] * n,
        "service_name": ["bench"] * n,
        "span_kind": column("span_kind"),
        "rollout_id": column("rollout_id"),
        "task_id": column("task_id"),
        "is_rollout_root": column("is_rollout_root"),
        "reward_name": ["reward" if "reward" in r else None for r in rows],
        "reward_value": column("reward"),
        "policy_version": ["1" if r["span_kind"] == "LLM" else None for r in rows],
        "prompt_token_ids": lists("prompt", pa.int32()),
        "completion_token_ids": lists("completion", pa.int32()),
        "completion_logprobs": lists("logprobs", pa.float64()),
        "attributes": [[] for _ in rows],
        "resource_attributes": [[] for _ in rows],
    }
    return pa.table(
        {f.name: data[f.name] if f.name in data else pa.nulls(n, f.type) for f in SPANS_SCHEMA}, schema=SPANS_SCHEMA
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    rollouts = args.calls // CALLS_PER_ROLLOUT
    store = Store(tempfile.mkdtemp(prefix="lightning-merge-bench-"))
    store.ensure_schema_file()
    rng = np.random.default_rng(0)
    start_us = int(time.time() * 1e6) - 3_600_000_000
    for chunk in range(0, rollouts, 250):
        rows = [
            row for i in range(chunk, min(chunk + 250, rollouts)) for row in rollout_rows(i, rng, start_us + i * 1000)
        ]
        store.write(table(rows), f"{store.spans_root}/service=bench/date=x/hour=00/compact-{chunk:06d}.parquet")
    print(f"store: {rollouts * CALLS_PER_ROLLOUT:,} LLM calls, prompts 4,096-4,800 tokens ({store.root})")

    conn = connect(store.root)
    config = SelectionConfig()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    begin = time.perf_counter()
    spans = conn.sql(selection_sql(config)).to_arrow_table()  # what select_rollouts does, stage by stage
    read = time.perf_counter()
    selection = rollouts_from_table(conn, spans, config)
    selected = time.perf_counter()
    batch = build_batch(selection)
    done = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    calls = selection.llm_calls
    print(
        f"SQL + Parquet read: {read - begin:.2f} s; reconstruction: {selected - read:.2f} s; build_batch: {done - selected:.2f} s"
    )
    print(f"  end to end from Parquet: {done - begin:.2f} s, {calls / (done - begin):,.0f} LLM calls/s")
    print(f"  once read (reconstruction + merge): {done - read:.2f} s, {calls / (done - read):,.0f} LLM calls/s")
    print(
        f"  {len(batch.samples) / len(selection.rollouts):.2f} samples per rollout, {len(batch.boundaries)} boundaries"
    )
    print(
        f"  peak RSS +{peak - rss_before:,.0f} MiB for {calls:,} calls = {(peak - rss_before) * 100_000 / calls:,.0f} MiB per 100k calls"
    )


if __name__ == "__main__":
    main()
