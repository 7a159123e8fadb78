"""A step whose loss or gradient is not finite is never taken, never committed, never swapped; its
rollouts are excluded for good with the reason, and the next run trains on the others.

The non-finite gradient comes from a real input, not a fault hook: a finite reward of 1e300 under
mean-only advantages (scale_by_std = false) passes hygiene (it is finite) but its advantage, 5e299,
is infinite once cast to float32, so the loss is inf - inf = NaN. test_training_job.py runs the same
through the CLI against a real vLLM server (no swap, the served weights unchanged)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.trainer.merge import LLMCall
from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
from lightning_otel.trainer.update import NonFiniteUpdate, UpdateConfig


def _calls(index: int) -> list[list[LLMCall]]:
    return [[LLMCall(f"c{index}", [5, 6, 7, 8], [40 + index, 41, 42], [-6.0, -6.0, -6.0])]]


def test_a_non_finite_gradient_takes_no_step_and_names_the_rollouts_at_fault(tiny_model_dir, tmp_path):
    from lightning_otel.trainer.policy import PolicyTrainer

    trainer = PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(learning_rate=1e-2, scale_by_std=False))
    rollouts = [
        RolloutRecord("huge", "a", 1e300, _calls(0)),
        RolloutRecord("zero", "a", 0.0, _calls(1)),
        RolloutRecord("fine-1", "b", 1.0, _calls(2)),
        RolloutRecord("fine-2", "b", 0.0, _calls(3)),
    ]
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with pytest.raises(NonFiniteUpdate, match="non-finite gradient") as failure:
        trainer.train_on(Selection(rollouts, {}))
    assert failure.value.rollout_ids == ["huge", "zero"]  # task b's tokens had finite losses
    assert failure.value.cause == "non_finite_gradient"
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())  # bit for bit
    assert trainer.optimizer.state_dict()["state"] == {}  # AdamW never stepped
    assert all(p.grad is None for p in trainer.model.parameters()) and trainer.version == 0
    trainer.train_on(Selection(rollouts[2:], {}))  # the same trainer goes on with the others
    assert trainer.version == 1 and all(torch.isfinite(p).all() for p in trainer.model.parameters())


@pytest.fixture
def collector(tmp_path):
    """Six rollouts, oldest first: task-0's two make a non-finite gradient, task-2's second has a NaN
    behaviour logprob; rollout 'nan' has a NaN reward. A real collector stores them."""

    def build(tracer):
        for index, (rollout_id, task, reward) in enumerate(
            [
                ("huge", "task-0", 1e300),
                ("zero", "task-0", 0.0),
                ("fine-1", "task-1", 1.0),
                ("fine-2", "task-1", 0.0),
                ("late-1", "task-2", 0.25),
                ("late-2", "task-2", 0.75),
                ("nan", "task-3", float("nan")),
            ]
        ):
            identity = {schema.ROLLOUT_ID: rollout_id, schema.TASK_ID: task}
            logprobs = [-6.0, float("nan"), -6.0] if rollout_id == "late-2" else [-6.0] * 3
            tracer.start_span(
                "ChatCompletion",
                attributes={
                    **identity,
                    schema.OPENINFERENCE_SPAN_KIND: schema.KIND_LLM,
                    schema.PROMPT_TOKEN_IDS: [5, 6, 7, 8],
                    schema.COMPLETION_TOKEN_IDS: [40 + index, 41, 42],
                    schema.COMPLETION_LOGPROBS: logprobs,
                },
            ).end()
            tracer.start_span(
                "reward", attributes={**identity, schema.REWARD_NAME: "reward", schema.REWARD_VALUE: reward}
            ).end()

    with local_collector(tmp_path / "traces") as running:
        assert post(running.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        running.flush()
        yield running


def test_a_skipped_step_commits_nothing_excludes_its_rollouts_and_the_next_run_trains(
    collector, tiny_model_dir, tmp_path
):
    from lightning_otel.trainer.checkpoints import CheckpointStore
    from lightning_otel.trainer.config import TrainConfig
    from lightning_otel.trainer.training_run import run_once

    config = TrainConfig()
    config.store.data_dir, config.store.otlp_endpoint = str(collector.data_dir), collector.http_endpoint + "/v1/traces"
    config.model.base, config.checkpoints.dir = str(tiny_model_dir), str(tmp_path / "state")
    config.selection.min_age_s, config.selection.max_rollouts = 0.0, 4
    config.update.scale_by_std, config.update.learning_rate = False, 1e-3
    store = CheckpointStore(tmp_path / "state")

    skipped = run_once(config)  # the four oldest: huge, zero, fine-1, fine-2
    assert skipped.status == "skipped: non-finite gradient" and skipped.at_fault == ["huge", "zero"]
    assert skipped.excluded["huge"].startswith("non-finite gradient (loss nan")
    assert store.committed() == [] and store.trained_ids().num_rows == 0  # no checkpoint: nothing to swap
    excluded = lambda: sorted(zip(*store.excluded().select(["rollout_id", "cause"]).to_pydict().values()))  # noqa: E731
    assert excluded() == [("huge", "non_finite_gradient"), ("zero", "non_finite_gradient")]

    trained = run_once(config)  # the next run: fine-1, fine-2, late-1, late-2; never huge or zero again
    assert trained.status == "trained" and trained.rollouts == 4 and trained.step == 1
    [checkpoint] = store.committed()
    ids = pq.read_table(checkpoint / "rollouts.parquet").column("rollout_id").to_pylist()
    assert sorted(ids) == ["fine-1", "fine-2", "late-1", "late-2"]
    last = run_once(config)  # only the NaN reward is left: excluded for good, not selected again
    assert last.status == "nothing to do" and last.excluded == {"nan": "non-finite reward nan"}
    assert ("nan", "non_finite_reward") in excluded() and run_once(config).excluded == {}

    collector.flush()
    conn = connect(collector.data_dir)
    rows = conn.execute(
        "SELECT rollout_id, cause, tokens, excluded FROM input_diagnostics ORDER BY rollout_id"
    ).fetchall()
    assert rows == [
        ("huge", "non_finite_gradient", None, True),
        ("late-2", "invalid_behaviour_logprobs", 1, False),
        ("nan", "non_finite_reward", None, True),
        ("zero", "non_finite_gradient", None, True),
    ]
    assert conn.execute("SELECT step, masked_calls, masked_tokens FROM train_steps").fetchall() == [(1, 1, 1)]


def _model_copy(source, out, dtype, poison: float | None = None):
    """The tiny model's folder in `dtype`, with one value of one tensor replaced by `poison`."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    tensors = {
        name: tensor.to(dtype).contiguous() for name, tensor in load_file(str(out / "model.safetensors")).items()
    }
    if poison is not None:
        tensors[sorted(tensors)[3]].view(-1)[11] = poison
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_the_swap_path_refuses_a_checkpoint_holding_a_nan_or_an_infinity(tiny_model_dir, tmp_path, dtype, poison):
    from lightning_otel.core.vllm_admin import SwapError, VLLMAdmin, hot_swap, non_finite_tensors, validate_checkpoint

    clean = _model_copy(tiny_model_dir, tmp_path / "clean", dtype)
    poisoned = _model_copy(tiny_model_dir, tmp_path / "poisoned", dtype, poison)
    validate_checkpoint(clean, clean)
    assert non_finite_tensors(clean) == [] and len(non_finite_tensors(poisoned)) == 1
    with pytest.raises(SwapError, match="non-finite values in 1 tensor"):
        validate_checkpoint(poisoned, clean)
    # hot_swap checks before it touches the server: nothing listens at this address, and the error is
    # about the values, not the connection
    with pytest.raises(SwapError, match="non-finite"):
        hot_swap(VLLMAdmin("http://127.0.0.1:9"), poisoned, "1", rollback_dir=clean)


def test_the_gateway_refuses_a_lora_adapter_holding_a_nan(tmp_path):
    import asyncio
    from types import SimpleNamespace

    from safetensors.torch import save_file

    from lightning_otel.core.vllm_admin import SwapError
    from lightning_otel.gateway.admin import swap_lora

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file({"lora_A": torch.tensor([[0.1, float("nan")]])}, str(adapter / "adapter_model.safetensors"))
    gateway = SimpleNamespace(upstreams=[SimpleNamespace(url="http://127.0.0.1:9")], served={})
    with pytest.raises(SwapError, match="non-finite"):
        asyncio.run(swap_lora(gateway, {"model": "policy", "version": "1", "adapter_path": str(adapter)}))
    assert gateway.served == {}  # nothing pointed at it


def test_a_direct_lora_swap_refuses_an_adapter_holding_an_infinity(tmp_path):
    """Without a gateway the trainer loads adapters itself (hotswap.swap_to): checked first too."""
    from safetensors.torch import save_file

    from lightning_otel.core.vllm_admin import SwapError
    from lightning_otel.trainer.config import TrainConfig
    from lightning_otel.trainer.hotswap import swap_to

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file(
        {"lora_B": torch.tensor([float("-inf"), 0.5], dtype=torch.bfloat16)}, str(adapter / "adapter_model.safetensors")
    )
    config = TrainConfig()
    config.model.lora_rank, config.server.replicas = 8, ["http://127.0.0.1:9"]  # nothing listens there
    with pytest.raises(SwapError, match="non-finite"):
        swap_to(config, adapter, "1", tmp_path / "previous")


def test_a_step_that_leaves_non_finite_weights_or_a_non_finite_model_fails_the_run_and_commits_nothing(
    collector, tiny_model_dir, tmp_path
):
    """Finite gradients, yet an infinite learning rate (a public option) makes the weights non-finite:
    the run fails before its checkpoint (the rollouts are not at fault, so none is excluded). A model
    that loads with a NaN is refused the same way, before any rollout is looked at."""
    from lightning_otel.trainer.checkpoints import CheckpointStore, JobFailed
    from lightning_otel.trainer.config import TrainConfig
    from lightning_otel.trainer.training_run import run_once

    config = TrainConfig()
    config.store.data_dir, config.store.otlp_endpoint = str(collector.data_dir), collector.http_endpoint + "/v1/traces"
    config.model.base, config.checkpoints.dir = str(tiny_model_dir), str(tmp_path / "state")
    config.selection.min_age_s, config.selection.max_rollouts, config.selection.where = 0.0, 2, "task_id = 'task-1'"
    config.update.learning_rate = float("inf")
    with pytest.raises(JobFailed, match="non-finite weights in .* nothing committed"):
        run_once(config)
    store = CheckpointStore(tmp_path / "state")
    assert store.committed() == [] and store.excluded().num_rows == 0

    broken = _model_copy(tiny_model_dir, tmp_path / "broken", torch.float32, float("nan"))
    config.model.base, config.update.learning_rate = str(broken), 1e-3
    with pytest.raises(JobFailed, match="holds non-finite weights"):
        run_once(config)
    assert store.committed() == [] and store.excluded().num_rows == 0
