"""Rebuilding rollouts from stored spans, and what happens to broken ones."""

from __future__ import annotations

import pytest

from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes
from lightning_otel.collector import connect
from lightning_otel.instrument import schema
from lightning_otel.servers import free_port
from lightning_otel.trainer import build_batch, select_rollouts


def _llm(tracer, name, prompt, completion, logprobs=None, extra=None):
    attributes = {schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM, **(extra or {})}
    if prompt is not None:
        attributes[schema.PROMPT_TOKEN_IDS] = prompt
        attributes[schema.COMPLETION_TOKEN_IDS] = completion
        attributes[schema.COMPLETION_LOGPROBS] = logprobs if logprobs is not None else [-1.0] * len(completion)
    tracer.start_span(name, attributes=attributes).end()


def _rollout(tracer, rollout_id, task, reward, calls):
    identity = {schema.ROLLOUT_ID: rollout_id, schema.TASK_ID: task}
    with tracer.start_as_current_span("rollout", attributes={**identity, schema.ROLLOUT_ROOT: True}):
        for name, prompt, completion, *rest in calls:
            with tracer.start_as_current_span("step", attributes=identity):
                _llm(tracer, name, prompt, completion, *rest, extra=identity)
            with tracer.start_as_current_span("tool", attributes={**identity, schema.OPENINFERENCE_SPAN_KIND: schema.KIND_TOOL}):
                pass
        if reward is not None:
            # written with the raw OTel API: other exporters can send what reward() would refuse
            tracer.start_span("reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: reward}).end()


@pytest.fixture
def store(tmp_path):
    def build(tracer):
        _rollout(tracer, "good", "t", 1.0, [("c1", [1, 2], [3]), ("c2", [1, 2, 3, 9], [4, 5]), ("c3", [7], [8])])
        _rollout(tracer, "also-good", "t", 0.0, [("d1", [1], [2])])
        _rollout(tracer, "no-reward", "t", None, [("e1", [1], [2])])
        _rollout(tracer, "nan-reward", "t", float("nan"), [("f1", [1], [2])])
        _rollout(tracer, "no-tokens", "t", 1.0, [("g1", None, None)])
        _rollout(tracer, "misaligned", "t", 0.5, [("h1", [1], [2, 3], [-1.0]), ("h2", [5], [6])])

    with local_collector(tmp_path / "data") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
        yield connect(collector.data_dir)


def test_broken_rollouts_are_excluded_with_a_reason_and_the_rest_kept(store):
    selection = select_rollouts(store)
    assert sorted(r.rollout_id for r in selection.rollouts) == ["also-good", "good", "misaligned"]
    assert selection.excluded == {
        "no-reward": "no reward",
        "nan-reward": "non-finite reward nan",
        "no-tokens": "no LLM call with token ids and logprobs",
    }
    misaligned = next(r for r in selection.rollouts if r.rollout_id == "misaligned")
    assert len(misaligned.calls) == 1 and misaligned.calls_without_tokens == 1


def test_calls_come_out_in_causal_order_and_merge(store):
    selection = select_rollouts(store, where="rollout_id IN ('good', 'also-good')")
    good = next(r for r in selection.rollouts if r.rollout_id == "good")
    assert [list(c.prompt_ids) for c in good.calls] == [[1, 2], [1, 2, 3, 9], [7]]
    batch = build_batch(selection)
    tokens = [s.token_ids for s, r in zip(batch.samples, batch.rollout_of_sample) if batch.rollout_ids[r] == "good"]
    assert tokens == [[1, 2, 3, 9, 4, 5], [7, 8]]
    assert batch.samples_per_rollout == 1.5


def test_where_clause_is_plain_sql_over_rollouts(store):
    assert [r.rollout_id for r in select_rollouts(store, where="reward < 0.5").rollouts] == ["also-good"]
