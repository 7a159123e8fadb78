"""Input hygiene: behaviour logprobs that are NaN, infinite, below the floor or positive are masked
out of the loss before the batch is built and reported in SQL; rewards out of range exclude their
rollout; what is left trains with a bounded gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.trainer.input_hygiene import invalid_behaviour_logprobs, screen_call
from lightning_otel.trainer.merge import LLMCall
from lightning_otel.trainer.rollout_data import (
    RolloutRecord,
    Selection,
    SelectionConfig,
    exclusion_cause,
    select_rollouts,
)
from lightning_otel.trainer.update import UntrainableBatch, UpdateConfig, build_batch

POISONED = [-1.2, -math.inf, -0.8, math.nan, -9999.0, -2.0, 0.7]  # -9999.0: vLLM's -inf; 0.7: log p > 0
AFTER_TOOL = [-40.0, -1.5, -0.7]  # -40 is above the floor: trained, but clamped and clipped


def test_invalid_values_against_the_floor():
    values = [-1.0, math.nan, math.inf, -math.inf, -9999.0, -50.0, -50.001, -40.0, 0.0]
    assert invalid_behaviour_logprobs(values).tolist() == [False, True, True, True, True, False, True, False, False]
    assert invalid_behaviour_logprobs(values, floor=-30.0).tolist()[7] is True


def test_positive_logprobs_past_float_noise_are_invalid():
    """log p <= 0: 0 and float32 rounding near p = 1 (up to 1e-4) are kept, anything larger is not."""
    values = [0.0, -0.0, 1.2e-7, 1e-4, 1.01e-4, 0.7, 5.0, -1e-9]
    assert invalid_behaviour_logprobs(values).tolist() == [False, False, False, False, True, True, True, False]
    recorded = LLMCall("p", [1, 2], [3, 4, 5, 6], [-0.5, 0.7, 5.0, 1e-5])
    screened, report = screen_call(recorded, "rollout", "task")
    assert screened.masked.tolist() == [False, True, True, False]
    assert (report.tokens, report.nan, report.infinite, report.below_floor, report.positive) == (2, 0, 0, 0, 2)
    assert report.highest == 5.0 and report.lowest is None
    assert report.detail == "2 behaviour logprob(s) masked: 2 positive (highest 5)"


def test_reconstructed_calls_keep_their_nan_logprobs_and_are_not_reported():
    rebuilt = LLMCall("r", [1, 2], [3, 4], [math.nan, math.nan], reconstructed=True)
    assert screen_call(rebuilt, "rollout", "task") == (rebuilt, None)
    recorded = LLMCall("c", [1, 2], [3, 4, 5], [math.nan, -1.0, -9999.0])
    screened, report = screen_call(recorded, "rollout", "task")
    assert screened.masked.tolist() == [True, False, True]
    assert (report.tokens, report.nan, report.infinite, report.below_floor, report.lowest) == (2, 1, 0, 1, -9999.0)
    assert report.detail == "2 behaviour logprob(s) masked: 1 NaN, 1 below -50 (lowest -9999)"
    # the rebuilt call trains (on-policy): its tokens keep the loss mask; the recorded one loses two
    batch = build_batch(
        Selection([RolloutRecord("a", "t", 1.0, [[rebuilt]]), RolloutRecord("b", "t", 0.0, [[recorded]])], {})
    )
    assert (
        batch.samples[0].loss_mask.tolist() == [0, 0, 1, 1] and np.isnan(batch.samples[0].behaviour_logprobs[2:]).all()
    )
    assert batch.samples[1].loss_mask.tolist() == [0, 0, 0, 1, 0]
    assert batch.token_weights[1].tolist() == [0, 0, 0, 0.5, 0]  # R = 2 rollouts, T_b = 1 token left
    assert [m.span_id for m in batch.masked_calls] == ["c"]


def test_a_batch_with_every_token_masked_is_a_clear_error():
    calls = [LLMCall("c", [1], [2, 3], [math.nan, -math.inf])]
    with pytest.raises(UntrainableBatch, match="every generated token is masked") as failure:
        build_batch(Selection([RolloutRecord("only", "t", 1.0, [calls])], {}))
    assert failure.value.rollout_ids == ["only"] and failure.value.cause == "no_trainable_token"


@pytest.fixture
def poisoned_store(tmp_path):
    """Four rollouts of one task, one with a -inf, a NaN, a -9999, a positive and a -40 behaviour
    logprob, one with a reward of -1e6 (the edge of the range); rollouts with a NaN reward and with
    rewards past max_abs_reward. A real collector writes them."""
    prompt = list(range(10, 22))
    first = [101, 102, 103, 104, 105, 106, 107]

    def build(tracer):
        def call(identity, prompt_ids, completion, logprobs):
            tracer.start_span(
                "ChatCompletion",
                attributes={
                    **identity,
                    schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                    schema.PROMPT_TOKEN_IDS: prompt_ids,
                    schema.COMPLETION_TOKEN_IDS: completion,
                    schema.COMPLETION_LOGPROBS: logprobs,
                },
            ).end()

        for rollout_id, reward in (
            ("poisoned", 0.0),
            ("clean-1", 1.0),
            ("clean-2", 0.5),
            ("nan-reward", math.nan),
            ("forged", 1e9),  # past max_abs_reward (1e6): excluded like a NaN
            ("negative-forged", -1e35),
            ("at-the-limit", -1e6),  # within: trained
        ):
            identity = {schema.ROLLOUT_ID: rollout_id, schema.TASK_ID: "t"}
            if rollout_id == "poisoned":
                call(identity, prompt, first, POISONED)
                call(identity, prompt + first + [7, 8], [201, 202, 203], AFTER_TOOL)  # [7, 8]: a tool's output
            else:
                call(identity, prompt, [150 + len(rollout_id), 160, 170], [-6.0, -6.0, -6.0])
            tracer.start_span(
                "reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: reward}
            ).end()

    with local_collector(tmp_path / "data") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
        yield collector


def test_poisoned_logprobs_through_select_build_update_leave_finite_weights_and_rows_in_sql(
    poisoned_store, tiny_model_dir, tmp_path
):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from lightning_otel.trainer.diagnostics import input_records, publish_inputs
    from lightning_otel.trainer.policy import PolicyTrainer

    conn = connect(poisoned_store.data_dir)
    selection = select_rollouts(conn)
    assert sorted(r.rollout_id for r in selection.rollouts) == ["at-the-limit", "clean-1", "clean-2", "poisoned"]
    assert selection.excluded == {
        "nan-reward": "non-finite reward nan",
        "forged": "reward out of range 1e+09 (max_abs_reward 1e+06)",
        "negative-forged": "reward out of range -1e+35 (max_abs_reward 1e+06)",
    }
    unbounded = select_rollouts(conn, config=SelectionConfig(max_abs_reward=math.inf))  # the check off
    assert unbounded.excluded == {"nan-reward": "non-finite reward nan"} and len(unbounded.rollouts) == 6
    poisoned_span = conn.execute(
        "SELECT span_id FROM llm_calls WHERE rollout_id = 'poisoned' ORDER BY start_time"
    ).fetchall()[0][0]

    trainer = PolicyTrainer(tiny_model_dir, tmp_path / "work", UpdateConfig(learning_rate=1e-3))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.train_on(selection)

    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))  # a step was taken
    # One bad token used to give a gradient norm of ~1e15 (-40 against ~-6) or inf (-9999): now the
    # -40 token's ratio is clamped and clipped, the four others carry no loss at all.
    assert 0 < result.metrics["grad_norm"] < 10, result.metrics["grad_norm"]
    [masked] = result.batch.masked_calls
    assert (masked.span_id, masked.tokens, masked.nan, masked.infinite, masked.below_floor, masked.positive) == (
        poisoned_span,
        4,
        1,
        1,
        1,
        1,
    )
    sample = next(
        s
        for s, r in zip(result.batch.samples, result.batch.rollout_of_sample)
        if result.batch.rollout_ids[r] == "poisoned"
    )
    generated = np.flatnonzero(sample.loss_mask).tolist()
    # the -inf, NaN, -9999 and 0.7 tokens (13, 15, 16, 18) and the tool's 19, 20 are out
    assert generated == [12, 14, 17, 21, 22, 23]
    assert result.metrics["masked_tokens"] == 4 and result.metrics["masked_calls"] == 1

    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=poisoned_store.http_endpoint + "/v1/traces"))
    )
    exclusions = {rid: (exclusion_cause(reason), reason) for rid, reason in selection.excluded.items()}
    publish_inputs(input_records(result.batch.masked_calls, exclusions), provider.get_tracer("test"))
    provider.shutdown()
    poisoned_store.flush()
    rows = (
        connect(poisoned_store.data_dir)
        .execute(
            "SELECT rollout_id, span_id, cause, tokens, excluded, detail FROM input_diagnostics ORDER BY rollout_id"
        )
        .fetchall()
    )
    assert rows == [
        ("forged", None, "reward_out_of_range", None, True, "reward out of range 1e+09 (max_abs_reward 1e+06)"),
        ("nan-reward", None, "non_finite_reward", None, True, "non-finite reward nan"),
        (
            "negative-forged",
            None,
            "reward_out_of_range",
            None,
            True,
            "reward out of range -1e+35 (max_abs_reward 1e+06)",
        ),
        (
            "poisoned",
            poisoned_span,
            "invalid_behaviour_logprobs",
            4,
            False,
            "4 behaviour logprob(s) masked: 1 NaN, 1 infinite, 1 below -50 (lowest -9999), 1 positive (highest 0.7)",
        ),
    ]
