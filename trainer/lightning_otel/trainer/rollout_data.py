"""Select rollouts with SQL and rebuild each one from its span tree into chains of LLM calls.

The trainer reads traces only through the collector's query API (`lightning_otel.collector.connect`).

Rebuilding a rollout:
- Its spans form a tree; a span whose parent never arrived is an orphan, placed under the
  innermost span of its trace whose time window contains it (and counted).
- LLM calls are grouped by agent scope (their nearest AGENT ancestor: the rollout itself, or a
  sub-agent), and within a scope into chains: a call joins a chain whose last call had ended when
  it started (preferring one it extends exactly, else the one that ended last), or starts a new
  chain. So two calls that ran at once are never interleaved in one chain, and sub-agents with
  their own system prompts do not break their parent's chain.
- Framework wrapper spans (llm_spans.is_wrapper) are not calls; calls without token ids are
  skipped and counted, or rebuilt from their messages when asked (reconstruct.py).

A rollout is excluded, with its reason, when its reward is missing, not finite or out of range
(|reward| > max_abs_reward), or when none of its calls can be trained on. The reward is
configurable: the latest `reward` (default), `sum` or `mean` of every named reward's latest value,
the `last` reported, or `name:<reward name>`.

Why a reward range, default 1e6: under mean-only advantages (scale_by_std = false) a reward is its
advantage's scale, and a finite reward of 1e35 gave a finite loss but an infinite float32 gradient
norm (the norm squares ~1e34-sized gradients), so the step was refused. z-scores are bounded, but a
reward past 1e6 is a unit mistake or a forged value in any task we know (pass/fail, scores, test
counts, costs). Within the range a token's loss gradient is at most max(1 + eps_high, dual_clip) *
2e6 times its weight (<= 1), far from float32's limits. inf turns the check off.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from lightning_otel.core import schema
from lightning_otel.trainer.config import SelectionSection
from lightning_otel.trainer.merge import LLMCall, first_divergence

log = logging.getLogger(__name__)

# Why select_rollouts excludes a rollout (Selection.excluded's values start with one of these).
NO_REWARD = "no reward"
NON_FINITE_REWARD = "non-finite reward"
REWARD_OUT_OF_RANGE = "reward out of range"
NO_TRAINABLE_CALL = "no LLM call with token ids and logprobs"
_CAUSES = {
    NO_REWARD: "no_reward",
    NON_FINITE_REWARD: "non_finite_reward",
    REWARD_OUT_OF_RANGE: "reward_out_of_range",
    NO_TRAINABLE_CALL: "no_trainable_call",
}


def exclusion_cause(reason: str) -> str:
    """The cause name (input_diagnostics.cause) of one of Selection.excluded's reasons."""
    return next((cause for prefix, cause in _CAUSES.items() if reason.startswith(prefix)), "other")


@dataclass
class SelectionConfig:
    where: str = "true"  # SQL over the `rollouts` view's columns
    since: str | None = None  # start_time >= since (an ISO timestamp or any DuckDB timestamp literal)
    until: str | None = None
    service: str | None = None
    min_version: int | None = None  # policy versions (integers) that served the rollout's calls
    max_version: int | None = None
    reward: str = schema.DEFAULT_REWARD_NAME  # "reward" | "sum" | "mean" | "last" | "name:<reward name>"
    allow_reconstructed: bool = False  # train on calls whose ids were rebuilt from messages
    max_abs_reward: float = SelectionSection.max_abs_reward  # 1e6; larger |reward|: excluded (inf: off)
    limit: int | None = None  # at most this many rollouts, oldest first
    exclude: str | None = None  # a table or view in the connection with a rollout_id column to leave out
    only_rewarded: bool = False  # leave unrewarded rollouts out of the selection (they may get one later)
    tokenizer: Any = None  # needed to rebuild ids (and used to classify merge failures)


@dataclass
class RolloutRecord:
    rollout_id: str
    task_id: str
    reward: float
    chains: list[list[LLMCall]] = field(default_factory=list)
    calls_without_tokens: int = 0
    reconstructed_calls: int = 0
    orphans: int = 0
    start_us: int | None = None  # the rollout's start (the `rollouts` view's start_time), epoch microseconds

    @property
    def calls(self) -> list[LLMCall]:
        return [call for chain in self.chains for call in chain]


@dataclass
class Selection:
    rollouts: list[RolloutRecord]
    excluded: dict[str, str]  # rollout id -> reason
    # the start times (epoch microseconds) of the oldest and newest rollout the SQL selected, trained
    # or excluded; None: none was (the training job's watermark, selection_window.py)
    oldest_start_us: int | None = None
    newest_start_us: int | None = None

    @property
    def llm_calls(self) -> int:
        return sum(len(r.calls) for r in self.rollouts)


def _reward_expression(reward: str) -> str:
    if reward == schema.DEFAULT_REWARD_NAME:
        return "r.reward"
    if reward == "sum":
        return "list_sum(map_values(r.rewards))"
    if reward == "mean":
        return "list_avg(map_values(r.rewards))"
    if reward == "last":
        return "(SELECT arg_max(value, time) FROM rewards w WHERE w.rollout_id = r.rollout_id)"
    if reward.startswith("name:"):
        return f"r.rewards['{reward[5:].replace(chr(39), chr(39) * 2)}']"
    raise ValueError(f"reward aggregation must be reward, sum, mean, last or name:<name>; got {reward!r}")


def selection_sql(config: SelectionConfig) -> str:
    """The rollouts' spans, unordered, from `spans_raw`: the dedup window of `spans`, or an ORDER BY,
    would carry every token list through a sort (twice the time and memory). Duplicate copies of a
    span are dropped in select_rollouts instead, and calls are ordered per chain."""
    # Evaluation rollouts are never trained on, whatever `where` says: they measure the policy.
    conditions = [f"({config.where})", f"r.split <> '{schema.SPLIT_EVAL}'"]
    if config.since:
        conditions.append(f"r.start_time >= TIMESTAMPTZ '{config.since}'")
    if config.until:
        conditions.append(f"r.start_time < TIMESTAMPTZ '{config.until}'")
    if config.service:
        conditions.append(f"r.service_name = '{config.service.replace(chr(39), chr(39) * 2)}'")
    versions = "list_transform(r.policy_versions, lambda v: TRY_CAST(v AS BIGINT))"
    if config.min_version is not None:
        conditions.append(f"list_min({versions}) >= {int(config.min_version)}")
    if config.max_version is not None:
        conditions.append(f"list_max({versions}) <= {int(config.max_version)}")
    if config.exclude:
        conditions.append(f"r.rollout_id NOT IN (SELECT rollout_id FROM {config.exclude})")
    if config.only_rewarded:
        conditions.append(f"({_reward_expression(config.reward)}) IS NOT NULL")
    limit = f"ORDER BY r.start_time, r.rollout_id LIMIT {int(config.limit)}" if config.limit else ""
    return f"""
        WITH selected AS (
            SELECT r.rollout_id, r.task_id, {_reward_expression(config.reward)} AS reward, r.start_time
            FROM rollouts r WHERE {" AND ".join(conditions)} {limit})
        SELECT s.rollout_id, sel.task_id, sel.reward, epoch_us(sel.start_time) AS rollout_start_us, s.trace_id, s.span_id, s.parent_span_id, s.span_kind,
               epoch_us(s.start_time) AS start_us, epoch_us(s.end_time) AS end_us,
               s.prompt_token_ids, s.completion_token_ids, s.completion_logprobs, s.policy_version,
               CASE WHEN s.span_kind = '{schema.KIND_LLM}' AND s.completion_token_ids IS NULL THEN s.attributes END AS attributes
        FROM spans_raw s JOIN selected sel USING (rollout_id)"""


_WRAPPERS = "SELECT DISTINCT span_id FROM llm_spans WHERE is_wrapper AND rollout_id IN ({ids})"


def _list_views(column: pa.ChunkedArray, dtype) -> list[np.ndarray | None]:
    """Per-row numpy views into a list column's flat values, chunk by chunk: no copy of the data,
    no per-element Python objects."""
    views: list[np.ndarray | None] = []
    for array in column.chunks:
        offsets = array.offsets.to_numpy()
        values = array.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        views += [values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(array))]
    return views


def select_rollouts(
    conn: duckdb.DuckDBPyConnection, where: str = "true", config: SelectionConfig | None = None
) -> Selection:
    """Rollouts matching the selection, rebuilt into chains of calls ready to merge."""
    config = config or SelectionConfig(where=where)
    return rollouts_from_table(conn, conn.sql(selection_sql(config)).to_arrow_table(), config)


def rollouts_from_table(conn: duckdb.DuckDBPyConnection, table: pa.Table, config: SelectionConfig) -> Selection:
    """select_rollouts once its SQL has been read (`table`); `conn` answers one small query for wrapper spans."""
    prompts = _list_views(table.column("prompt_token_ids"), np.int32)
    completions = _list_views(table.column("completion_token_ids"), np.int32)
    logprobs = _list_views(table.column("completion_logprobs"), np.float64)
    scalars = {
        name: table.column(name).to_pylist()
        for name in (
            "rollout_id",
            "task_id",
            "reward",
            "rollout_start_us",
            "trace_id",
            "span_id",
            "parent_span_id",
            "span_kind",
            "start_us",
            "end_us",
            "policy_version",
        )
    }
    # Wrapper spans (a framework's span around the SDK call) in a second, small query: joined into
    # the first, they would make DuckDB hash every token list.
    rollout_ids = sorted(set(scalars["rollout_id"]))
    quoted = ", ".join("'" + r.replace("'", "''") + "'" for r in rollout_ids) or "NULL"
    wrappers = {row[0] for row in conn.execute(_WRAPPERS.format(ids=quoted)).fetchall()}
    scalars["is_wrapper"] = [span_id in wrappers for span_id in scalars["span_id"]]
    attributes = table.column("attributes").to_pylist() if config.allow_reconstructed else None
    rows_by_rollout: dict[str, list[int]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for index, rollout_id in enumerate(scalars["rollout_id"]):
        key = (scalars["trace_id"][index], scalars["span_id"][index])
        if key not in seen:  # a retried export or a compaction overlap: keep the first copy
            seen.add(key)
            rows_by_rollout[rollout_id].append(index)

    rollouts, excluded = [], {}
    for rollout_id, rows in rows_by_rollout.items():
        first = rows[0]
        reward = scalars["reward"][first]
        if reward is None:
            excluded[rollout_id] = NO_REWARD
            continue
        if not math.isfinite(reward):
            excluded[rollout_id] = f"{NON_FINITE_REWARD} {reward}"
            continue
        if abs(reward) > config.max_abs_reward:
            excluded[rollout_id] = f"{REWARD_OUT_OF_RANGE} {reward:g} (max_abs_reward {config.max_abs_reward:g})"
            continue
        record = RolloutRecord(
            rollout_id=rollout_id,
            task_id=scalars["task_id"][first],
            reward=float(reward),
            start_us=scalars["rollout_start_us"][first],
        )
        spans = [_SpanRow(i, scalars) for i in rows]
        record.orphans = _attach_orphans(spans)
        scopes = _agent_scopes(spans)
        calls_by_scope: dict[str, list[tuple[_SpanRow, LLMCall]]] = defaultdict(list)
        for span in spans:
            if span.kind != schema.KIND_LLM or span.is_wrapper:
                continue
            call = _call(span, prompts, completions, logprobs, attributes, config, record)
            if call is not None:
                calls_by_scope[scopes[span.span_id]].append((span, call))
        for scope_calls in calls_by_scope.values():
            record.chains.extend(_chains(scope_calls))
        if not record.chains:
            excluded[rollout_id] = NO_TRAINABLE_CALL
            continue
        rollouts.append(record)
    starts = [start for start in scalars["rollout_start_us"] if start is not None]
    return Selection(rollouts, excluded, min(starts, default=None), max(starts, default=None))


class _SpanRow:
    __slots__ = ("index", "trace_id", "span_id", "parent", "kind", "is_wrapper", "start", "end", "version")

    def __init__(self, index: int, scalars: dict[str, list]) -> None:
        self.index = index
        self.trace_id = scalars["trace_id"][index]
        self.span_id = scalars["span_id"][index]
        self.parent = scalars["parent_span_id"][index]
        self.kind = scalars["span_kind"][index]
        self.is_wrapper = scalars["is_wrapper"][index]
        self.start = scalars["start_us"][index]
        self.end = scalars["end_us"][index]
        self.version = scalars["policy_version"][index]


def _attach_orphans(spans: list[_SpanRow]) -> int:
    """Give each span whose parent never arrived the innermost span of its trace containing it."""
    ids = {span.span_id for span in spans}
    orphans = 0
    for span in spans:
        if span.parent is None or span.parent in ids:
            continue
        orphans += 1
        containers = [
            s
            for s in spans
            if s is not span and s.trace_id == span.trace_id and s.start <= span.start and s.end >= span.end
        ]
        span.parent = min(containers, key=lambda s: s.end - s.start).span_id if containers else None
    return orphans


def _agent_scopes(spans: list[_SpanRow]) -> dict[str, str]:
    """span id -> id of its nearest AGENT ancestor (itself excluded); 'root' if none."""
    by_id = {span.span_id: span for span in spans}
    scopes: dict[str, str] = {}
    for span in spans:
        current, seen = by_id.get(span.parent), 0
        while current is not None and current.kind != schema.KIND_AGENT and seen < len(spans):
            current, seen = by_id.get(current.parent), seen + 1
        scopes[span.span_id] = current.span_id if current is not None else "root"
    return scopes


def _call(
    span: _SpanRow,
    prompts,
    completions,
    logprobs,
    attributes,
    config: SelectionConfig,
    record: RolloutRecord,
) -> LLMCall | None:
    i = span.index
    prompt, completion, lps = prompts[i], completions[i], logprobs[i]
    if prompt is not None and completion is not None and lps is not None:
        try:
            return LLMCall(span.span_id, prompt, completion, lps, span.version)
        except ValueError as exc:  # misaligned logprobs: skip the call, keep the rollout's others
            log.warning("rollout %s: %s", record.rollout_id, exc)
    elif config.allow_reconstructed and config.tokenizer is not None and attributes is not None:
        from lightning_otel.trainer.reconstruct import reconstruct_call

        rebuilt = reconstruct_call(span.span_id, dict(attributes[i] or []), config.tokenizer, span.version)
        if rebuilt is not None:
            record.reconstructed_calls += 1
            return rebuilt
    record.calls_without_tokens += 1
    return None


def _chains(calls: list[tuple[_SpanRow, LLMCall]]) -> list[list[LLMCall]]:
    """Split one agent scope's calls into chains of calls that did not overlap in time."""
    chains: list[tuple[list[LLMCall], list[int]]] = []  # (calls, [end time of the last call])
    for span, call in sorted(calls, key=lambda item: (item[0].start, item[0].span_id)):
        ready = [chain for chain in chains if chain[1][0] <= span.start]
        chosen = ready[0] if len(ready) == 1 else None  # the common case: one sequential chain
        if len(ready) > 1:
            chosen = next((chain for chain in ready if first_divergence(chain[0][-1], call.prompt_ids) is None), None)
        if chosen is None and ready:
            chosen = max(ready, key=lambda chain: chain[1][0])
        if chosen is None:
            chosen = ([], [0])
            chains.append(chosen)
        chosen[0].append(call)
        chosen[1][0] = span.end
    return [chain for chain, _ in chains]
