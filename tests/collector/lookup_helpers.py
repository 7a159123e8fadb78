"""Shared by the lookup tests (test_rollout_lookup.py, test_day_index.py): span tables of rollouts,
and a file system that notes every directory listed through it."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.fs as pafs

from lightning_otel.collector.span_rows import SPANS_SCHEMA


def spans_table(columns: dict[str, pa.Array], n: int) -> pa.Table:
    """`n` spans: `columns`, every other column of the schema null."""
    return pa.table(
        {f.name: columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in SPANS_SCHEMA},
        schema=SPANS_SCHEMA,
    )


def rollout_spans(
    rollouts: list[str],
    began: Callable[[int], int],
    tag: Callable[[str], str],
    trace: Callable[[str], str],
    rooted: Callable[[str], bool],
    prompt: list[int],
    service: str = "agent",
) -> pa.Table:
    """Per rollout (the number-th starting at began(number), in us): a root if rooted(rollout), an LLM
    wrapper without ids around an LLM call with ids (prompt ids `prompt`), a reward; span ids are
    tag(rollout) and the span's position, the trace trace(rollout)."""
    rows = []
    for number, rollout in enumerate(rollouts):
        kinds = (["AGENT"] if rooted(rollout) else []) + ["LLM", "LLM", "EVALUATOR"]
        for position, kind in enumerate(kinds):
            rows.append((trace(rollout), f"{tag(rollout)}{position:010x}", rollout, kind, position, began(number)))
    n = len(rows)
    has_ids = [kind == "LLM" and position % 2 == 0 for _, _, _, kind, position, _ in rows]
    columns = {
        "trace_id": pa.array([r[0] for r in rows]),
        "span_id": pa.array([r[1] for r in rows]),
        "rollout_id": pa.array([r[2] for r in rows]),
        "name": pa.array([r[3].lower() for r in rows]),
        "span_kind": pa.array([r[3] for r in rows]),
        "is_rollout_root": pa.array([r[3] == "AGENT" for r in rows]),
        # the wrapper (no ids) spans 0..100 us, the call inside it 10..20 us
        "start_time": pa.array([r[5] + (10 if i else 0) for r, i in zip(rows, has_ids)], pa.timestamp("us", tz="UTC")),
        "end_time": pa.array([r[5] + (20 if i else 100) for r, i in zip(rows, has_ids)], pa.timestamp("us", tz="UTC")),
        "reward_name": pa.array(["reward" if r[3] == "EVALUATOR" else None for r in rows]),
        "reward_value": pa.array([float(len(r[2])) if r[3] == "EVALUATOR" else None for r in rows]),
        "prompt_token_ids": pa.array([prompt if i else None for i in has_ids], pa.list_(pa.int32())),
        "completion_token_ids": pa.array([[4, 5] if i else None for i in has_ids], pa.list_(pa.int32())),
        "completion_logprobs": pa.array([[-0.1, -0.2] if i else None for i in has_ids], pa.list_(pa.float64())),
        "service_name": pa.array([service] * n),
    }
    return spans_table(columns, n)


class ListingSpy:
    """A store's file system that notes, in `listed`, each directory (or path) it is asked about."""

    def __init__(self, real: pafs.FileSystem, listed: list[str]) -> None:
        self.real, self.listed = real, listed

    def get_file_info(self, what):
        self.listed.append(what.base_dir if isinstance(what, pafs.FileSelector) else str(what))
        return self.real.get_file_info(what)

    def __getattr__(self, name):
        return getattr(self.real, name)
