"""Select rollouts with SQL and rebuild each one from its span tree.

The trainer reads traces only through the collector's query API (`lightning_otel.collector.connect`).
For each selected rollout it fetches the rollout's spans, rebuilds the parent/child tree, and
walks it depth-first with children in start-time order: the LLM calls come out in causal order
(a call made after a tool step follows it). Spans whose parent is missing are treated as roots.

A rollout is excluded, with its reason, when it has no reward or a non-finite one, or when none
of its LLM calls carries token ids and logprobs. Calls without them are left out and counted.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field

import duckdb

from lightning_otel.instrument import schema
from lightning_otel.trainer.merge import LLMCall

log = logging.getLogger(__name__)


@dataclass
class RolloutRecord:
    rollout_id: str
    task_id: str
    reward: float
    calls: list[LLMCall] = field(default_factory=list)
    calls_without_tokens: int = 0


@dataclass
class Selection:
    rollouts: list[RolloutRecord]
    excluded: dict[str, str]  # rollout id -> reason

    @property
    def llm_calls(self) -> int:
        return sum(len(r.calls) for r in self.rollouts)


_SPANS_OF_SELECTED = """
WITH selected AS (SELECT rollout_id, task_id, reward FROM rollouts WHERE {where})
SELECT s.rollout_id, sel.task_id, sel.reward, s.span_id, s.parent_span_id, s.span_kind,
       coalesce(w.is_wrapper, false) AS is_wrapper, s.start_time,
       s.prompt_token_ids, s.completion_token_ids, s.completion_logprobs, s.policy_version
FROM spans s JOIN selected sel USING (rollout_id)
LEFT JOIN (SELECT trace_id, span_id, is_wrapper FROM llm_spans) w USING (trace_id, span_id)
ORDER BY s.rollout_id, s.start_time, s.span_id
"""


def _causal_order(spans: list[dict]) -> list[dict]:
    """Depth-first over the span tree, children by start time; roots are spans without a parent here."""
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str | None, list[dict]] = defaultdict(list)
    for span in spans:
        parent = span["parent_span_id"] if span["parent_span_id"] in by_id else None
        children[parent].append(span)
    ordered: list[dict] = []
    stack = list(reversed(children[None]))  # spans arrive sorted by start time
    while stack:
        span = stack.pop()
        ordered.append(span)
        stack.extend(reversed(children.get(span["span_id"], [])))
    return ordered


def select_rollouts(conn: duckdb.DuckDBPyConnection, where: str = "true") -> Selection:
    """Rollouts matching `where` (SQL over the `rollouts` view's columns), rebuilt for training."""
    result = conn.execute(_SPANS_OF_SELECTED.format(where=where))
    columns = [d[0] for d in result.description]
    per_rollout: dict[str, list[dict]] = defaultdict(list)
    for row in result.fetchall():
        span = dict(zip(columns, row))
        per_rollout[span["rollout_id"]].append(span)

    rollouts, excluded = [], {}
    for rollout_id, spans in per_rollout.items():
        reward = spans[0]["reward"]
        if reward is None:
            excluded[rollout_id] = "no reward"
            continue
        if not math.isfinite(reward):
            excluded[rollout_id] = f"non-finite reward {reward}"
            continue
        record = RolloutRecord(rollout_id=rollout_id, task_id=spans[0]["task_id"], reward=float(reward))
        for span in _causal_order(spans):
            if span["span_kind"] != schema.KIND_LLM or span["is_wrapper"]:
                continue  # a framework's span around the SDK call that carries the tokens
            if span["prompt_token_ids"] is None or span["completion_token_ids"] is None or span["completion_logprobs"] is None:
                record.calls_without_tokens += 1
                continue
            try:
                call = LLMCall(
                    span_id=span["span_id"],
                    prompt_ids=span["prompt_token_ids"],
                    completion_ids=span["completion_token_ids"],
                    logprobs=span["completion_logprobs"],
                    policy_version=span["policy_version"],
                )
            except ValueError as exc:  # misaligned logprobs: skip the call, keep the rollout's others
                log.warning("rollout %s: %s", rollout_id, exc)
                record.calls_without_tokens += 1
                continue
            record.calls.append(call)
        if not record.calls:
            excluded[rollout_id] = "no LLM call with token ids and logprobs"
            continue
        rollouts.append(record)
    return Selection(rollouts=rollouts, excluded=excluded)
