"""The store at scale: the training job's select stage, one rollout's ids, the last hour's rollouts and
the dashboard overview's queries, over stores of 1M, 10M (and 50M) spans in realistic hour partitions.

    python bench/store_scale.py --spans 1000000 10000000 [--days 3] [--keep DIR]
    python bench/store_scale.py --spans 1000000 10000000 --spans-per-hour 13889   # a store growing for months
    python bench/store_scale.py --spans 50000000 --spans-per-hour 13889 --narrowed-only   # no whole-store rows

With `--days` every store covers the same days (a bigger store is busier traffic); with
`--spans-per-hour` the traffic is the same and a bigger store covers more days (a store that grows).

Each store is written with the collector's own Store, one compacted file per service and hour over
`--days` days ending now, written as compaction writes them (compaction.write_compacted: sorted by
rollout, row groups with Bloom filters; the layout a flushing, compacting collector leaves): rollouts of 8 spans (a
root, 4 LLM calls with 64 prompt and 16 completion ids, 2 tool calls, 1 reward), spread evenly over
the hours. The job's state is the steady state of a job that runs every few minutes: every rollout
but the newest `--untrained` in the trained ledger (with start times, one file per step of 512
rollouts, named as retired steps are: checkpoints.ledger_name), and a watermark 10 minutes back. The select stage is `training_run.select_in_window` with that state, and once more with
`[selection] backfill = true` (the whole store, what every run read before the watermark), in the
same run. Each figure is the median of 3 runs on a fresh connection. Disk use is printed. One
rollout's token ids are timed twice: on `connect(DATA, rollout_ids=...)` (only the files whose rollout
index, collector/rollout_index.py, may hold it) and on a whole-store connect; the first lookup on a
store is printed on its own (the process's first also builds the views database, lookup_connection.py).
Before any query the days before today get their day index (collector/day_index.py, what the collector's
maintenance builds), so a lookup lists only the days that may hold the rollout; the time that takes is
printed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_otel.collector import connect
from lightning_otel.collector.compaction import write_compacted
from lightning_otel.collector.day_index import build_day_index, unindexed_days
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store
from lightning_otel.trainer.checkpoints import CheckpointStore, ledger_name
from lightning_otel.trainer.config import TrainConfig
from lightning_otel.trainer.training_run import select_in_window

KINDS = np.array(["AGENT", "LLM", "TOOL", "LLM", "TOOL", "LLM", "LLM", "EVALUATOR"])
SPANS_PER_ROLLOUT = len(KINDS)
PROMPT, COMPLETION = 64, 16
ROLLOUTS_PER_STEP = 512  # one ledger file per trained step, as the job retires them
ONE_ROLLOUT = "SELECT prompt_token_ids, completion_token_ids FROM llm_calls WHERE rollout_id = ?"
LAST_HOUR = """SELECT rollout_id, reward, llm_calls FROM rollouts
               WHERE start_time > now() - INTERVAL 1 HOUR ORDER BY reward DESC LIMIT 20"""
QUERIES = {
    "one rollout's token ids": ONE_ROLLOUT,
    "one rollout's token ids, whole-store connect": ONE_ROLLOUT,
    "last hour's rollouts by reward, connect(since=2 h back)": LAST_HOUR,
    "last hour's rollouts by reward, whole-store connect": LAST_HOUR,
    "overview: counts": "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM rollouts)",
    "overview: reward by version": "SELECT * FROM reward_by_version",
}
# Rows whose connection is narrowed (docs/sql.md, "Which filters prune"): connect(DATA, rollout_ids=...)
# reads only the files whose rollout index may hold the rollout; connect(DATA, since=...) only the hour
# partitions from `since` on (an hour before the window: a rollout that started before the window shows
# whole, so it is not mistaken for one that started inside it). The others connect to the whole store.
NARROWED = {
    "one rollout's token ids": lambda middle: {"rollout_ids": middle},
    "last hour's rollouts by reward, connect(since=2 h back)": lambda middle: {
        "since": datetime.now(UTC) - timedelta(hours=2)
    },
}


def _lists(rows: np.ndarray, width: int, dtype, value) -> pa.Array:
    """A list column: `width` values where `rows` is true, null elsewhere."""
    lengths = np.where(rows, width, 0)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(np.full(int(lengths.sum()), value, dtype=dtype))
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~rows))


def hour_table(first: int, rollouts: int, hour_start_us: int) -> pa.Table:
    """`rollouts` rollouts numbered from `first`, starting evenly over the hour from `hour_start_us`."""
    n = rollouts * SPANS_PER_ROLLOUT
    index = np.arange(n)
    rollout = first + index // SPANS_PER_ROLLOUT
    position = index % SPANS_PER_ROLLOUT
    kind = KINDS[position]
    llm, tool, reward = kind == "LLM", kind == "TOOL", kind == "EVALUATOR"
    start = hour_start_us + ((rollout - first) * (3_500_000_000 // max(rollouts, 1))) + position * 1000
    rollout_ids = np.char.add("r-", rollout.astype(str))
    span_ids = np.char.zfill(np.char.mod("%x", first * SPANS_PER_ROLLOUT + index), 16)

    def strings(values) -> pa.Array:
        return pa.array(values, pa.string())

    def where(mask, value) -> pa.Array:
        return pa.array(np.where(mask, value, None), pa.string())

    columns = {
        "trace_id": strings(np.char.zfill(np.char.mod("%x", rollout), 32)),
        "span_id": strings(span_ids),
        "parent_span_id": pa.array(
            np.where(position == 0, None, np.char.zfill(np.char.mod("%x", index - position + first * 8), 16)),
            pa.string(),
        ),
        "name": strings(kind),
        "kind": pa.array(np.full(n, "INTERNAL")),
        "start_time": pa.array(start, pa.timestamp("us", tz="UTC")),
        "end_time": pa.array(start + 500_000, pa.timestamp("us", tz="UTC")),
        "duration_ms": pa.array(np.full(n, 500.0)),
        "status_code": pa.array(np.full(n, "OK")),
        "service_name": pa.array(np.full(n, "agent")),
        "scope_name": pa.array(np.full(n, "bench")),
        "span_kind": strings(kind),
        "model_name": where(llm, "policy"),
        "token_count_prompt": pa.array(np.where(llm, PROMPT, None), pa.int64()),
        "token_count_completion": pa.array(np.where(llm, COMPLETION, None), pa.int64()),
        "tool_name": where(tool, "search"),
        "rollout_id": strings(rollout_ids),
        "task_id": strings(np.char.add("task-", (rollout // 8).astype(str))),
        "attempt": pa.array(np.zeros(n, dtype=np.int64)),
        "is_rollout_root": pa.array(position == 0),
        "reward_name": where(reward, "reward"),
        "reward_value": pa.array(np.where(reward, (rollout % 7) / 7, np.nan), mask=~reward),
        "policy_version": where(llm, "3"),
        "finish_reason": where(llm, "stop"),
        "prompt_token_ids": _lists(llm, PROMPT, np.int32, 7),
        "completion_token_ids": _lists(llm, COMPLETION, np.int32, 9),
        "completion_logprobs": _lists(llm, COMPLETION, np.float64, -0.5),
    }
    return pa.table(
        {f.name: columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in SPANS_SCHEMA},
        schema=SPANS_SCHEMA,
    )


def build(data_dir: Path, state_dir: Path, spans: int, days: int, untrained: int) -> tuple[int, str]:
    """The store and the job's steady state; returns (rollouts, one rollout id in the middle)."""
    store, hours = Store(data_dir), days * 24
    store.ensure_schema_file()
    per_hour = spans // SPANS_PER_ROLLOUT // hours
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    first_hour = int(now.timestamp()) // 3600 - hours  # the last partition is the hour before this one
    ledger_ids, ledger_starts = [], []
    for h in range(hours):
        table = hour_table(h * per_hour, per_hour, (first_hour + h) * 3_600_000_000)
        write_compacted(store, table, f"{store.partition_dir('agent', first_hour + h)}/compact-{h:05d}.parquet")
        roots = table.filter(table.column("is_rollout_root"))
        ledger_ids.append(roots.column("rollout_id"))
        ledger_starts.append(roots.column("start_time").cast(pa.int64()))
    total = per_hour * hours
    ids = pa.chunked_array(ledger_ids).combine_chunks()[: total - untrained]
    starts = pa.chunked_array(ledger_starts).combine_chunks()[: total - untrained]
    state = CheckpointStore(state_dir)
    trained = pa.table({"rollout_id": ids, "start_us": starts})
    for step, first in enumerate(range(0, trained.num_rows, ROLLOUTS_PER_STEP)):  # as retired steps leave it
        chunk = trained.slice(first, ROLLOUTS_PER_STEP)
        pq.write_table(chunk, state.ledger_dir / ledger_name(f"step-{step + 1:06d}", chunk))
    state.save_watermark(datetime.now(UTC) - timedelta(minutes=10))
    return total, f"r-{total // 2}"


def index_days(data_dir: Path) -> int:
    """Build the day index of every day before today, as the collector's maintenance does a few days
    per pass (pipeline.Pipeline.index_days); returns how many."""
    store = Store(data_dir)
    days = unindexed_days(store, datetime.now(UTC))
    for day in days:
        assert build_day_index(store, day), day
    return len(days)


def median_seconds(run, repeats: int = 3) -> tuple[float, list[float]]:
    timings = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        timings.append(time.perf_counter() - began)
    return statistics.median(timings), timings


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(spans: int, days: int, untrained: int, keep: Path | None, whole_store: bool = True) -> None:
    root = Path(tempfile.mkdtemp(prefix="lightning-store-scale-", dir=keep))
    data_dir, state_dir = root / "traces", root / "state"
    began = time.perf_counter()
    rollouts, middle = build(data_dir, state_dir, spans, days, untrained)
    print(
        f"{rollouts * SPANS_PER_ROLLOUT:,} spans ({rollouts:,} rollouts, {days * 24} hour partitions): "
        f"built in {time.perf_counter() - began:.0f} s, {disk_bytes(data_dir) / 2**30:.2f} GiB on disk",
        flush=True,
    )
    began = time.perf_counter()
    indexed = index_days(data_dir)
    print(f"  day indexes of the {indexed} days before today: built in {time.perf_counter() - began:.1f} s", flush=True)
    config = TrainConfig()
    config.store.data_dir, config.checkpoints.dir = str(data_dir), str(state_dir)
    config.selection.max_rollouts, config.selection.min_age_s = 512, 0.0
    state = CheckpointStore(state_dir)
    for label, backfill in (("select stage, windowed (watermark)", False), ("select stage, whole store", True)):
        if backfill and not whole_store:
            continue
        config.selection.backfill = backfill
        found = select_in_window(config, state).selection
        seconds, runs = median_seconds(lambda: select_in_window(config, state))
        print(
            f"  {label}: median {seconds:.2f} s ({', '.join(f'{t:.2f}' for t in runs)}); "
            f"{len(found.rollouts)} rollouts selected",
            flush=True,
        )
    for label, sql in QUERIES.items():
        if not whole_store and label not in NARROWED:
            continue
        params = [middle] if "?" in sql else []
        narrowed = NARROWED[label](middle) if label in NARROWED else {}
        if params:  # a lookup that found nothing would time nothing
            began = time.perf_counter()
            assert connect(data_dir, **narrowed).execute(sql, params).fetchall(), label
            print(f"  {label}, the first on this store: {(time.perf_counter() - began) * 1000:.0f} ms", flush=True)
        seconds, runs = median_seconds(
            lambda sql=sql, params=params, narrowed=narrowed: (
                connect(data_dir, **narrowed).execute(sql, params).fetchall()
            )
        )
        print(f"  {label}: median {seconds * 1000:.0f} ms ({', '.join(f'{t * 1000:.0f}' for t in runs)})", flush=True)
    if keep is None:
        shutil.rmtree(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--spans-per-hour", type=int, help="fixed traffic: the days follow from --spans")
    parser.add_argument("--untrained", type=int, default=400, help="newest rollouts not in the ledger yet")
    parser.add_argument("--keep", type=Path, help="build the stores under this folder and keep them")
    parser.add_argument(
        "--narrowed-only",
        action="store_true",
        help="time only the windowed select and the narrowed queries (the whole-store ones take minutes at 50M)",
    )
    args = parser.parse_args()
    for spans in args.spans:
        days = max(1, round(spans / args.spans_per_hour / 24)) if args.spans_per_hour else args.days
        measure(spans, days, args.untrained, args.keep, whole_store=not args.narrowed_only)


if __name__ == "__main__":
    main()
