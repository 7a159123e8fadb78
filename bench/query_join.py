"""Query benchmark: join `llm_calls` to `rollouts` over a store of 1M spans.

    python bench/query_join.py --spans 1000000

The store is written through the collector's own Store (same layout, options and file sizes a
flushing collector produces after compaction): rollouts of 8 spans (a root, 4 LLM calls with
512-token prompts and 64-token completions, 2 tool calls, 1 reward), 2 KB of prompt text per LLM
call in the attributes map. Reports the median of 3 runs of each query on a fresh connection.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_otel.collector import connect
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store

QUERIES = {
    "join llm_calls x rollouts, group by task": """
        SELECT r.task_id, count(*) AS calls, avg(r.reward) AS reward, sum(c.token_count_completion) AS tokens
        FROM llm_calls c JOIN rollouts r USING (rollout_id) GROUP BY r.task_id ORDER BY calls DESC LIMIT 10""",
    "rollouts of the last hour by reward": """
        SELECT rollout_id, reward, llm_calls FROM rollouts
        WHERE start_time > now() - INTERVAL 1 HOUR ORDER BY reward DESC LIMIT 20""",
    "token ids of one rollout": """
        SELECT len(prompt_token_ids), len(completion_token_ids) FROM llm_calls WHERE rollout_id = 'r-4242'""",
}


def _lists(present: list[bool], values: pa.Array) -> pa.Array:
    """`values` in each row where `present`, else null: built in Arrow (Python lists of 10M spans'
    ids would take tens of GB)."""
    offsets, end = [0], 0
    for here in present:
        end += len(values) if here else 0
        offsets.append(end)
    mask = pa.array([not here for here in present] + [False])
    elements = pa.concat_arrays([values] * sum(present)) if any(present) else values.slice(0, 0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), elements, mask=mask)


def build_chunk(first_rollout: int, rollouts: int, now_us: int) -> pa.Table:
    kinds = ["AGENT", "LLM", "TOOL", "LLM", "TOOL", "LLM", "LLM", "EVALUATOR"]
    n = rollouts * len(kinds)
    rollout_index = [first_rollout + i // len(kinds) for i in range(n)]
    kind = [kinds[i % len(kinds)] for i in range(n)]
    is_llm = [k == "LLM" for k in kind]
    start = [now_us - (r % 3600) * 1_000_000 + (i % len(kinds)) * 1000 for i, r in enumerate(rollout_index)]
    text = "word " * 400
    prompt_ids = _lists(is_llm, pa.array(range(512), pa.int32()))
    completion_ids = _lists(is_llm, pa.array(range(64), pa.int32()))
    logprobs = _lists(is_llm, pa.array([-0.5] * 64, pa.float64()))
    columns = {
        "trace_id": [f"{r:032x}" for r in rollout_index],
        "span_id": [f"{i + first_rollout * len(kinds):016x}" for i in range(n)],
        "parent_span_id": [
            None if i % len(kinds) == 0 else f"{(i // len(kinds)) * len(kinds) + first_rollout * len(kinds):016x}"
            for i in range(n)
        ],
        "name": kind,
        "kind": ["INTERNAL"] * n,
        "start_time": start,
        "end_time": [s + 500_000 for s in start],
        "duration_ms": [500.0] * n,
        "status_code": ["OK"] * n,
        "status_message": [None] * n,
        "service_name": ["bench"] * n,
        "scope_name": ["bench"] * n,
        "span_kind": kind,
        "model_name": ["policy" if llm else None for llm in is_llm],
        "token_count_prompt": [512 if llm else None for llm in is_llm],
        "token_count_completion": [64 if llm else None for llm in is_llm],
        "token_count_total": [576 if llm else None for llm in is_llm],
        "tool_name": ["search" if k == "TOOL" else None for k in kind],
        "rollout_id": [f"r-{r}" for r in rollout_index],
        "task_id": [f"task-{r % 5000}" for r in rollout_index],
        "attempt": [0] * n,
        "is_rollout_root": [k == "AGENT" for k in kind],
        "reward_name": ["reward" if k == "EVALUATOR" else None for k in kind],
        "reward_value": [float(r % 7) / 7 if k == "EVALUATOR" else None for r, k in zip(rollout_index, kind)],
        "policy_version": ["3" if llm else None for llm in is_llm],
        "finish_reason": ["stop" if llm else None for llm in is_llm],
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": completion_ids,
        "completion_logprobs": logprobs,
        "attributes": [[("input.value", text)] if llm else [] for llm in is_llm],
        "resource_attributes": [[("service.name", "bench")]] * n,
        "events": [None] * n,
    }
    return pa.table(
        {
            f.name: pa.array(columns[f.name], f.type) if not isinstance(columns[f.name], pa.Array) else columns[f.name]
            for f in SPANS_SCHEMA
        },
        schema=SPANS_SCHEMA,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10, help="Parquet files (compacted partitions)")
    parser.add_argument("--store", help="keep the store in this directory; reuse it if it holds one already")
    args = parser.parse_args()
    data_dir = args.store or tempfile.mkdtemp(prefix="lightning-query-bench-")
    store = Store(data_dir)
    if store.files():
        print(f"reusing the store in {data_dir} (its own span count, not --spans)")
    else:
        store.ensure_schema_file()
        rollouts = args.spans // 8
        per_file = rollouts // args.files
        now_us = int(time.time() * 1e6)
        started = time.perf_counter()
        for index in range(args.files):
            table = build_chunk(index * per_file, per_file, now_us)
            store.write(table, f"{store.spans_root}/service=bench/date=x/hour=00/compact-{index:04d}.parquet")
        print(
            f"wrote {rollouts * 8:,} spans in {args.files} files in {time.perf_counter() - started:.0f} s ({data_dir})"
        )
    rows = connect(data_dir).execute("SELECT count(*) FROM spans_raw").fetchone()[0]
    size = sum(path.stat().st_size for path in Path(data_dir).rglob("*") if path.is_file())
    print(f"store: {rows:,} spans, {len(store.files())} span files, {size / 2**30:.2f} GiB on disk")
    for label, sql in QUERIES.items():
        timings = []
        for _ in range(3):
            conn = connect(data_dir)
            begin = time.perf_counter()
            conn.execute(sql).fetchall()
            timings.append(time.perf_counter() - begin)
        print(f"  {label}: median {statistics.median(timings):.2f} s (runs: {', '.join(f'{t:.2f}' for t in timings)})")


if __name__ == "__main__":
    main()
