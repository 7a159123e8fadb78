"""Rebuilding rollouts from stored spans, and what happens to broken ones."""

from __future__ import annotations

import pytest
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core import schema
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
            with tracer.start_as_current_span(
                "tool", attributes={**identity, schema.OPENINFERENCE_SPAN_KIND: schema.KIND_TOOL}
            ):
                pass
        if reward is not None:
            # written with the raw OTel API: other exporters can send what reward() would refuse
            tracer.start_span(
                "reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: reward}
            ).end()


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
    assert [c.prompt_ids.tolist() for c in good.calls] == [[1, 2], [1, 2, 3, 9], [7]]
    batch = build_batch(selection)
    tokens = [
        s.token_ids.tolist() for s, r in zip(batch.samples, batch.rollout_of_sample) if batch.rollout_ids[r] == "good"
    ]
    assert tokens == [[1, 2, 3, 9, 4, 5], [7, 8]]
    assert batch.samples_per_rollout == 1.5


def test_where_clause_is_plain_sql_over_rollouts(store):
    assert [r.rollout_id for r in select_rollouts(store, where="reward < 0.5").rollouts] == ["also-good"]


# --- rollout reconstruction: chains, orphans, sub-agents, rewards, selection, staleness ---------

MS = 1_000_000  # ns


def _timed_llm(tracer, name, start_ms, end_ms, prompt, completion, identity, version="1"):
    attributes = {
        **identity,
        schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
        schema.PROMPT_TOKEN_IDS: prompt,
        schema.COMPLETION_TOKEN_IDS: completion,
        schema.COMPLETION_LOGPROBS: [-1.0] * len(completion),
        schema.POLICY_VERSION: version,
    }
    tracer.start_span(name, attributes=attributes, start_time=start_ms * MS).end(end_time=end_ms * MS)


@pytest.fixture
def structured_store(tmp_path):
    from opentelemetry import trace as trace_api

    def build(tracer):
        base = 1_800_000_000_000  # ms
        identity = {schema.ROLLOUT_ID: "shaped", schema.TASK_ID: "t"}
        root = tracer.start_span(
            "rollout",
            attributes={**identity, schema.ROLLOUT_ROOT: True, schema.OPENINFERENCE_SPAN_KIND: schema.KIND_AGENT},
            start_time=base * MS,
        )
        with trace_api.use_span(root, end_on_exit=False):
            _timed_llm(tracer, "a1", base + 10, base + 20, [1, 2], [3], identity)
            # two calls at once: they must land in different chains
            _timed_llm(tracer, "p1", base + 30, base + 60, [1, 2, 3, 4], [5], identity)
            _timed_llm(tracer, "p2", base + 35, base + 55, [1, 2, 3, 4], [6], identity, version="2")
            # continues p2's sequence exactly, after both ended
            _timed_llm(tracer, "a2", base + 70, base + 80, [1, 2, 3, 4, 6, 7], [8], identity, version="2")
            sub = tracer.start_span(
                "researcher",
                attributes={**identity, schema.OPENINFERENCE_SPAN_KIND: schema.KIND_AGENT},
                start_time=(base + 90) * MS,
            )
            with trace_api.use_span(sub, end_on_exit=False):
                _timed_llm(tracer, "s1", base + 91, base + 95, [50, 51], [52], identity)
            sub.end(end_time=(base + 100) * MS)
            for name, value in (("reward", 1.0), ("format", 0.5)):
                tracer.start_span(
                    "reward", attributes={**identity, schema.REWARD_NAME: name, schema.REWARD_VALUE: value}
                ).end()
        root.end(end_time=(base + 200) * MS)
        # an orphan: its parent span was never exported; its time lies inside the rollout span
        orphan_identity = {schema.ROLLOUT_ID: "shaped", schema.TASK_ID: "t"}
        ctx = trace_api.set_span_in_context(
            trace_api.NonRecordingSpan(
                trace_api.SpanContext(
                    root.get_span_context().trace_id,
                    0xDEADBEEF,
                    is_remote=True,
                    trace_flags=trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED),
                )
            )
        )
        span = tracer.start_span(
            "lost-child",
            context=ctx,
            attributes={
                **orphan_identity,
                schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                schema.PROMPT_TOKEN_IDS: [1, 2, 3, 4, 6, 7, 8, 9],
                schema.COMPLETION_TOKEN_IDS: [10],
                schema.COMPLETION_LOGPROBS: [-1.0],
                schema.POLICY_VERSION: "2",
            },
            start_time=(base + 110) * MS,
        )
        span.end(end_time=(base + 120) * MS)
        # a second rollout, other service and versions, for selection filters
        other = {schema.ROLLOUT_ID: "other", schema.TASK_ID: "t"}
        _timed_llm(tracer, "o1", base + 10, base + 20, [1], [2], other, version="9")
        tracer.start_span("reward", attributes={**other, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: 0.0}).end()

    with local_collector(tmp_path / "data") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build, service="svc-a")))[0] == 200
        collector.flush()
        yield connect(collector.data_dir)


def test_concurrent_calls_become_separate_chains_and_orphans_are_placed(structured_store):
    from lightning_otel.trainer import SelectionConfig

    [rollout] = select_rollouts(structured_store, config=SelectionConfig(where="rollout_id = 'shaped'")).rollouts
    chains = sorted([[c.span_id for c in chain] for chain in rollout.chains])
    names = dict(structured_store.execute("SELECT span_id, name FROM spans").fetchall())
    assert sorted([[names[c.span_id] for c in chain] for chain in rollout.chains]) == [
        ["a1", "p1"],
        ["p2", "a2", "lost-child"],
        ["s1"],  # p1 and p2 overlapped; s1 is the sub-agent's
    ]
    assert rollout.orphans == 1 and len(chains) == 3
    batch = build_batch(select_rollouts(structured_store, "rollout_id = 'shaped'"))
    assert len(batch.samples) == 3  # each chain merges exactly
    assert [b.boundary.merged for b in batch.boundaries] == [True, True, True]


def test_reward_aggregation_and_selection_filters(structured_store):
    from lightning_otel.trainer import SelectionConfig

    def rewards(**kwargs):
        selection = select_rollouts(structured_store, config=SelectionConfig(**kwargs))
        return {r.rollout_id: r.reward for r in selection.rollouts}

    assert rewards() == {"shaped": 1.0, "other": 0.0}
    assert rewards(reward="sum") == {"shaped": 1.5, "other": 0.0}
    assert rewards(reward="mean") == {"shaped": 0.75, "other": 0.0}
    assert rewards(reward="name:format") == {"shaped": 0.5}  # "other" has no such reward: excluded
    assert rewards(min_version=5) == {"other": 0.0}
    assert rewards(max_version=2) == {"shaped": 1.0}
    assert rewards(service="svc-a", where="task_id = 't'") == {"shaped": 1.0, "other": 0.0}
    assert rewards(since="2099-01-01 00:00:00+00") == {}
    with pytest.raises(ValueError, match="aggregation"):
        rewards(reward="median")


def test_max_staleness_drops_old_samples(structured_store):
    selection = select_rollouts(structured_store, "rollout_id = 'shaped'")
    fresh = build_batch(selection, max_staleness=0, current_version=2)
    assert fresh.stale_samples == 2 and len(fresh.samples) == 1  # only the chain generated by version 2
    assert build_batch(selection, max_staleness=1, current_version=2).stale_samples == 0


def test_calls_without_token_ids_can_be_rebuilt_from_messages(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from lightning_otel.trainer import SelectionConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    identity = {schema.ROLLOUT_ID: "hosted", schema.TASK_ID: "t"}

    def build(tracer):
        tracer.start_span(
            "ChatCompletion",
            attributes={
                **identity,
                schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                "llm.input_messages.0.message.role": "user",
                "llm.input_messages.0.message.content": "hello",
                "llm.output_messages.0.message.content": " apple",
            },
        ).end()
        tracer.start_span(
            "reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: 1.0}
        ).end()

    with local_collector(tmp_path / "data") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
        conn = connect(collector.data_dir)
        assert select_rollouts(conn).excluded == {"hosted": "no LLM call with token ids and logprobs"}
        [rollout] = select_rollouts(
            conn, config=SelectionConfig(allow_reconstructed=True, tokenizer=tokenizer)
        ).rollouts
    [call] = rollout.calls
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False
    )
    assert call.reconstructed and rollout.reconstructed_calls == 1
    assert call.prompt_ids.tolist() == tokenizer.encode(rendered, add_special_tokens=False)
    assert call.completion_ids.tolist() == tokenizer.encode(" apple", add_special_tokens=False) + [
        tokenizer.eos_token_id
    ]
    assert all(v != v for v in call.logprobs)  # NaN: no behaviour logprobs


def test_merge_diagnostics_are_queryable_next_to_the_spans(tmp_path, tiny_model_dir):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from transformers import AutoTokenizer

    from lightning_otel.trainer.diagnostics import diagnose, publish

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    identity = {schema.ROLLOUT_ID: "diag", schema.TASK_ID: "t"}

    def build(tracer):
        _timed_llm(tracer, "c1", 1000, 1010, [1, 2], [3, 4], identity)
        _timed_llm(tracer, "c2", 1020, 1030, [1, 2, 3, 4, 5], [6], identity)  # extends: merges
        _timed_llm(tracer, "c3", 1040, 1050, [7, 2, 3, 4, 5, 6], [8], identity)  # history edited
        tracer.start_span(
            "reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: 1.0}
        ).end()

    with local_collector(tmp_path / "data") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
        batch = build_batch(select_rollouts(connect(collector.data_dir)))
        records = diagnose(batch, tokenizer)
        provider = TracerProvider()
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.http_endpoint + "/v1/traces"))
        )
        publish(records, provider.get_tracer("trainer"))
        provider.shutdown()
        collector.flush()
        rows = (
            connect(collector.data_dir)
            .execute(
                "SELECT merged, position, cause FROM merge_diagnostics WHERE rollout_id = 'diag' ORDER BY merged DESC"
            )
            .fetchall()
        )
        rollout = (
            connect(collector.data_dir)
            .execute("SELECT llm_calls, end_time FROM rollouts WHERE rollout_id = 'diag'")
            .fetchall()
        )
    assert rows == [(True, None, None), (False, 0, "context_rewritten")]
    assert rollout[0][0] == 3  # diagnostics are not spans of the rollout
