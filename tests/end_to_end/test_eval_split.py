"""Evaluation rollouts: marked by `rollout(split="eval")` (or the gateway's path or header), shown
in the `rollouts` view's `split`, summarised per policy version by `reward_by_version` with 95%
intervals, and never selected for training, whatever the selection's `where` says."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from helpers import local_collector, wait_for
from otlp_helpers import make_spans, post, request_bytes

import lightning_otel
from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.trainer import select_rollouts


def _rollout(tracer, rollout_id: str, task: str, reward: float, version: str, split: str | None) -> None:
    identity = {schema.ROLLOUT_ID: rollout_id, schema.TASK_ID: task}
    if split is not None:
        identity[schema.ROLLOUT_SPLIT] = split
    with tracer.start_as_current_span("rollout", attributes={**identity, schema.ROLLOUT_ROOT: True}):
        attributes = {
            **identity,
            schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
            schema.POLICY_VERSION: version,
            schema.PROMPT_TOKEN_IDS: [1, 2],
            schema.COMPLETION_TOKEN_IDS: [3],
            schema.COMPLETION_LOGPROBS: [-0.5],
        }
        tracer.start_span("call", attributes=attributes).end()
    reward_identity = {k: v for k, v in identity.items() if k != schema.ROLLOUT_SPLIT}  # as reward() writes it
    tracer.start_span(
        "reward", attributes={**reward_identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: reward}
    ).end()


def _wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's score interval, from its textbook form: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    p = successes / n
    centre, spread = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Train and eval rollouts over two versions; eval rewards in {0, 0.5, 1}: solved means reward >= 1."""
    rng = random.Random(7)
    expected: dict[tuple[str, str], list[tuple[str, float]]] = {}

    def build(tracer):
        for number in range(120):
            split = ("eval", "train", None)[number % 3]  # None: a rollout that never says (train)
            version = ("3", "4")[number % 2]
            task = f"task-{number % 9}"
            reward = rng.choice([0.0, 0.5, 1.0, 1.0])
            _rollout(tracer, f"r{number}", task, reward, version, split)
            expected.setdefault((split or "train", version), []).append((task, reward))

    data_dir = tmp_path_factory.mktemp("split") / "data"
    with local_collector(data_dir) as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
    return connect(data_dir), expected


def test_rollouts_say_their_split_and_unmarked_ones_are_train(store):
    conn, _ = store
    splits = dict(conn.execute("SELECT rollout_id, split FROM rollouts").fetchall())
    assert len(splits) == 120
    assert all(splits[f"r{n}"] == ("eval" if n % 3 == 0 else "train") for n in range(120))


def test_reward_by_version_matches_an_independent_computation(store):
    conn, expected = store
    rows = conn.execute(
        """SELECT split, version, tasks, rollouts, mean_reward, reward_low, reward_high, solved, solved_low, solved_high
           FROM reward_by_version ORDER BY split, version"""
    ).fetchall()
    assert [(split, version) for split, version, *_ in rows] == sorted(expected)
    for split, version, tasks, rollouts, mean, low, high, solved, solved_low, solved_high in rows:
        members = expected[(split, version)]
        rewards = [reward for _, reward in members]
        assert tasks == len({task for task, _ in members}) and rollouts == len(members)
        half = 1.959963984540054 * statistics.stdev(rewards) / math.sqrt(len(rewards))
        assert mean == pytest.approx(statistics.fmean(rewards))
        assert (low, high) == pytest.approx((statistics.fmean(rewards) - half, statistics.fmean(rewards) + half))
        successes = sum(reward >= 1 for reward in rewards)
        assert solved == pytest.approx(successes / len(rewards))
        assert (solved_low, solved_high) == pytest.approx(_wilson(successes, len(rewards)))
        assert 0 <= solved_low < solved < solved_high <= 1


def test_the_trainer_never_selects_an_eval_rollout_whatever_where_says(store):
    conn, _ = store
    everything = select_rollouts(conn, where="true")
    chosen = {r.rollout_id for r in everything.rollouts} | set(everything.excluded)
    assert chosen == {f"r{n}" for n in range(120) if n % 3}  # every train rollout, no eval one
    assert select_rollouts(conn, where="split = 'eval'").rollouts == []
    assert select_rollouts(conn, where="rollout_id = 'r0'").rollouts == []  # r0 is eval


def test_rollout_split_marks_every_span_of_an_eval_rollout(instrumented, session_collector):
    with pytest.raises(ValueError, match="split"):
        with lightning_otel.rollout(task_id="t", split="test"):
            pass
    with lightning_otel.rollout(task_id="split-task", split="eval") as evaluated:
        lightning_otel.tool(lambda: 1)()
        evaluated.reward(1.0)
    with lightning_otel.rollout(task_id="split-task") as trained:
        trained.reward(0.0)
    instrumented.flush()
    conn = connect(session_collector.data_dir)
    ids = [evaluated.rollout_id, trained.rollout_id]
    rows = wait_for(
        lambda: conn.execute(
            "SELECT rollout_id, split FROM rollouts WHERE rollout_id IN (?, ?) AND reward IS NOT NULL ORDER BY split",
            ids,
        ).fetchall(),
        lambda rows: len(rows) == 2,
    )
    assert rows == [(evaluated.rollout_id, "eval"), (trained.rollout_id, "train")]
    stamped = conn.execute(
        f"SELECT name, attributes['{schema.ROLLOUT_SPLIT}'] FROM spans WHERE rollout_id = ? AND reward_name IS NULL",
        [evaluated.rollout_id],
    ).fetchall()
    assert sorted(stamped) == [("<lambda>", "eval"), ("rollout", "eval")]
