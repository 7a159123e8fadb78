"""A step whose loss or gradient is not finite is never taken. The rollouts at fault are found
(fault_isolation.py: by bisecting the batch) and excluded for good with the reason; the step is then
made on the others. A step with nothing left commits nothing and swaps nothing.

The non-finite gradients come from real inputs, not a fault hook, under mean-only advantages
(scale_by_std = false) with [selection] max_abs_reward raised (its default, 1e6, excludes such
rewards at selection): a reward of 1e35 gives advantages of +-5e34, finite in float32, a finite loss
and an infinite gradient norm (the norm squares ~1e34-sized gradients); a reward of 1e300 gives an
advantage that is infinite once cast to float32, so the token losses are not finite either.
test_training_job.py runs a refused step through the CLI against a real vLLM server (no swap, the
served weights unchanged)."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest
import torch
from helpers import local_collector
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.trainer.merge import LLMCall
from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
from lightning_otel.trainer.update import NonFiniteUpdate, UpdateConfig, build_batch, policy_update


def _rollouts(model_dir, poison: float) -> list[RolloutRecord]:
    """Eight rollouts of four tasks; task b (the 3rd and 4th) holds the poisoned reward. Behaviour
    logprobs are the model's own (ratio 1, no clip active), so every token has a gradient."""
    from transformers import AutoModelForCausalLM

    from lightning_otel.trainer.hotswap import model_prompt_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rewards = [("a", 1.0), ("a", 0.0), ("b", poison), ("b", 0.0), ("c", 0.5), ("c", 1.0), ("d", 0.0), ("d", 0.25)]
    names = ["a-1", "a-2", "huge", "zero", "c-1", "c-2", "d-1", "d-2"]
    rollouts = []
    for index, (name, (task, reward)) in enumerate(zip(names, rewards)):
        prompt, completion = [5, 6, 7, 8], [40 + index, 41, 42]
        with torch.no_grad():
            logprobs = model_prompt_logprobs(model, prompt + completion)[len(prompt) - 1 :]
        rollouts.append(RolloutRecord(name, task, reward, [[LLMCall(f"c{index}", prompt, completion, logprobs)]]))
    return rollouts


def _snapshot(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def test_a_finite_loss_with_an_infinite_gradient_norm_takes_no_step(tiny_model_dir, tmp_path):
    """The loss alone is not enough to check: here it is finite and the gradient norm is not."""
    from lightning_otel.trainer.policy import PolicyTrainer

    trainer = PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(learning_rate=1e-2, scale_by_std=False))
    batch = build_batch(Selection(_rollouts(tiny_model_dir, 1e35), {}), config=trainer.config)
    assert max(abs(a) for a in batch.advantages) == pytest.approx(5e34)  # finite in float32 (max 3.4e38)
    before = _snapshot(trainer)
    with pytest.raises(NonFiniteUpdate, match="non-finite gradient") as failure:
        policy_update(trainer.model, trainer.optimizer, batch, trainer.config)
    assert math.isfinite(failure.value.metrics["loss"]) and failure.value.metrics["grad_norm"] == math.inf
    assert not failure.value.traced and failure.value.rollout_ids == batch.rollout_ids  # no token loss to blame
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())  # bit for bit
    assert trainer.optimizer.state_dict()["state"] == {}  # AdamW never stepped
    assert all(p.grad is None for p in trainer.model.parameters())


@pytest.mark.parametrize("poison", [1e35, 1e300], ids=["infinite-gradient-norm", "non-finite-token-losses"])
def test_the_rollouts_at_fault_are_found_and_the_step_is_made_on_the_others(tiny_model_dir, tmp_path, poison):
    """1e35: only the gradient norm overflows, so the batch is bisected; 1e300: the token losses name
    the rollouts, and the rest is checked once. Either way task b's two rollouts (the poisoned
    reward, and its group-mate whose advantage it made -5e34) are at fault, and the step equals a
    step on the six others alone, bit for bit."""
    from lightning_otel.trainer.policy import PolicyTrainer

    config = UpdateConfig(learning_rate=1e-2, scale_by_std=False)
    trainer = PolicyTrainer(tiny_model_dir, tmp_path / "isolated", config)
    result = trainer.train_on(Selection(_rollouts(tiny_model_dir, poison), {}))
    assert sorted(result.at_fault) == ["huge", "zero"] and trainer.version == 1
    assert [r.rollout_id for r in result.selection.rollouts] == ["a-1", "a-2", "c-1", "c-2", "d-1", "d-2"]
    assert all(reason.startswith("non-finite gradient (loss ") for reason in result.at_fault.values())
    how = "on its own: loss" if poison == 1e35 else "its token losses are not finite"
    assert all(how in reason for reason in result.at_fault.values()), result.at_fault
    assert math.isfinite(result.metrics["grad_norm"]) and result.metrics["rollouts"] == 6

    clean = PolicyTrainer(tiny_model_dir, tmp_path / "clean", config)
    expected = clean.train_on(Selection([r for r in _rollouts(tiny_model_dir, poison) if r.task_id != "b"], {}))
    assert expected.at_fault == {} and expected.metrics["loss"] == result.metrics["loss"]
    assert all(torch.equal(p, q) for p, q in zip(clean.model.parameters(), trainer.model.parameters()))


def test_nothing_left_after_the_rollouts_at_fault_takes_no_step(tiny_model_dir, tmp_path):
    from lightning_otel.trainer.policy import PolicyTrainer

    trainer = PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(learning_rate=1e-2, scale_by_std=False))
    before = _snapshot(trainer)
    with pytest.raises(NonFiniteUpdate, match="non-finite gradient") as failure:
        trainer.train_on(Selection(_rollouts(tiny_model_dir, 1e35)[2:4], {}))
    assert failure.value.rollout_ids == ["huge", "zero"] and set(failure.value.reasons) == {"huge", "zero"}
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    assert trainer.optimizer.state_dict()["state"] == {} and trainer.version == 0
    assert all(p.grad is None for p in trainer.model.parameters())


def test_when_the_rest_cannot_train_only_the_rollouts_at_fault_are_named(tiny_model_dir, tmp_path):
    """Left without the rollouts at fault, the batch has no token to train on (the third rollout's are
    all masked): no step; the NonFiniteUpdate names only those at fault, the other is not to blame."""
    from lightning_otel.trainer.policy import PolicyTrainer

    trainer = PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(learning_rate=1e-2, scale_by_std=False))
    masked = RolloutRecord("all-masked", "c", 1.0, [[LLMCall("m", [5, 6, 7, 8], [50, 51], [math.nan, 0.5])]])
    before = _snapshot(trainer)
    with pytest.raises(NonFiniteUpdate) as failure:
        trainer.train_on(Selection([*_rollouts(tiny_model_dir, 1e35)[2:4], masked], {}))
    assert failure.value.rollout_ids == ["huge", "zero"] and trainer.version == 0
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    assert trainer.optimizer.state_dict()["state"] == {}


@pytest.mark.parametrize("traced", [False, True])
def test_the_search_finds_single_rollouts_and_sets_that_overflow_only_together(monkeypatch, traced):
    """The bisection alone, its gradient check replaced by a rule: rollout 5's gradient is not finite,
    2 and 3 are finite each but not summed; with `traced`, 7's token losses were not finite."""
    from lightning_otel.trainer import fault_isolation
    from lightning_otel.trainer.update import Batch

    checked = []

    def rule(model, optimizer, batch, config, reference_model=None):
        present = set(batch.rollout_of_sample)
        checked.append(sorted(present))
        bad = bool(present & {5, 7}) or {2, 3} <= present
        return 0.0, math.inf if bad else 1.0, not bad

    monkeypatch.setattr(fault_isolation, "gradient_check", rule)
    rollouts = [RolloutRecord(f"r{i}", "t", 0.0) for i in range(8)]
    batch = Batch([None] * 8, list(range(8)), rollouts, [0.0] * 8, [None] * 8)
    ids = ["r7"] if traced else batch.rollout_ids
    refused = NonFiniteUpdate("non-finite gradient (batch)", ids, {"loss": 0.0, "grad_norm": math.inf}, traced=traced)
    found = fault_isolation.rollouts_at_fault(None, None, batch, UpdateConfig(), refused)
    assert found[5].startswith("non-finite gradient (batch); on its own: loss 0, gradient norm inf")
    assert len(checked) <= 2 * 3 * 3 + 1  # about 2 checks per level per culprit, not one per subset
    if traced:  # 7 is not checked again; the rest [0..6] halves as [0, 1, 2] | [3, 4, 5, 6], where 5
        # explains the rest: 2 and 3, split apart, are left to the retry without 5 and 7
        assert sorted(found) == [5, 7] and found[7].endswith("its token losses are not finite")
        assert all(7 not in c for c in checked)
        rest = fault_isolation.sub_batch(batch, [0, 1, 2, 3, 4, 6])
        refused = NonFiniteUpdate("non-finite gradient (retry)", rest.rollout_ids, {"loss": 0.0, "grad_norm": math.inf})
        found = fault_isolation.rollouts_at_fault(None, None, rest, UpdateConfig(), refused)
        assert sorted(found) == [2, 3]
    else:
        assert sorted(found) == [2, 3, 5, 7]
    assert "only with 1 other rollout(s)" in found[2] and "only with 1 other rollout(s)" in found[3]


@pytest.fixture
def collector(tmp_path):
    """Ten rollouts, oldest first: task-0's two make non-finite token losses (rewards 1e300 and 0);
    task-4's 'huge-b' (1e35) a non-finite gradient norm, while its group-mate 'zero-b' has no gradient
    at all: its behaviour logprobs (-5, the model's are ~-6) make ratios ~0.3 with a negative
    advantage, so the PPO clip holds every token. task-2's second has a NaN and a positive behaviour
    logprob; 'nan' has a NaN reward, 'big' one past the default max_abs_reward. A real collector
    stores them."""

    def build(tracer):
        for index, (rollout_id, task, reward) in enumerate(
            [
                ("huge", "task-0", 1e300),
                ("zero", "task-0", 0.0),
                ("fine-1", "task-1", 1.0),
                ("fine-2", "task-1", 0.0),
                ("huge-b", "task-4", 1e35),
                ("zero-b", "task-4", 0.0),
                ("late-1", "task-2", 0.25),
                ("late-2", "task-2", 0.75),
                ("nan", "task-3", float("nan")),
                ("big", "task-5", 2e6),
            ]
        ):
            identity = {schema.ROLLOUT_ID: rollout_id, schema.TASK_ID: task}
            logprobs = {"late-2": [-6.0, float("nan"), 0.5], "huge-b": [-5.0] * 3, "zero-b": [-5.0] * 3}.get(
                rollout_id, [-6.0] * 3
            )
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


def test_rollouts_at_fault_are_excluded_the_others_trained_exactly_once_and_a_step_with_none_left_commits_nothing(
    collector, tiny_model_dir, tmp_path
):
    from lightning_otel.trainer.checkpoints import CheckpointStore
    from lightning_otel.trainer.config import TrainConfig
    from lightning_otel.trainer.training_run import run_once

    config = TrainConfig()
    config.store.data_dir, config.store.otlp_endpoint = str(collector.data_dir), collector.http_endpoint + "/v1/traces"
    config.model.base, config.checkpoints.dir = str(tiny_model_dir), str(tmp_path / "state")
    config.selection.min_age_s, config.selection.max_rollouts = 0.0, 4
    config.selection.max_abs_reward = math.inf  # let 1e300 and 1e35 through to the update
    config.update.scale_by_std, config.update.learning_rate = False, 1e-3
    store = CheckpointStore(tmp_path / "state")

    def trained_ids(checkpoint):
        return sorted(pq.read_table(checkpoint / "rollouts.parquet").column("rollout_id").to_pylist())

    excluded = lambda: sorted(zip(*store.excluded().select(["rollout_id", "cause"]).to_pydict().values()))  # noqa: E731

    config.selection.where = "task_id = 'task-0'"
    skipped = run_once(config)  # only huge and zero: nothing left to train on
    assert skipped.status == "skipped: non-finite gradient" and skipped.at_fault == ["huge", "zero"]
    assert skipped.excluded["huge"].startswith("non-finite gradient (loss nan")
    assert store.committed() == [] and store.trained_ids().num_rows == 0  # no checkpoint: nothing to swap
    assert excluded() == [("huge", "non_finite_gradient"), ("zero", "non_finite_gradient")]

    config.selection.where = "true"
    mixed = run_once(config)  # fine-1, fine-2, huge-b, zero-b: bisection finds huge-b alone
    assert mixed.status == "trained" and mixed.step == 1 and mixed.rollouts == 3, mixed
    assert mixed.at_fault == ["huge-b"] and "on its own: loss" in mixed.excluded["huge-b"]
    [checkpoint] = store.committed()
    assert trained_ids(checkpoint) == ["fine-1", "fine-2", "zero-b"]  # the committed ids are what was trained

    config.selection.max_abs_reward = 1e6  # the default: 'big' is excluded at selection
    trained = run_once(config)  # late-1, late-2; nan and big excluded; never huge, zero, huge-b again
    assert trained.status == "trained" and trained.rollouts == 2 and trained.step == 2 and trained.at_fault == []
    assert trained_ids(store.committed()[-1]) == ["late-1", "late-2"]
    assert trained.excluded == {
        "nan": "non-finite reward nan",
        "big": "reward out of range 2e+06 (max_abs_reward 1e+06)",
    }
    assert run_once(config).status == "nothing to do" and run_once(config).excluded == {}
    assert excluded() == sorted(
        [(rid, "non_finite_gradient") for rid in ("huge", "zero", "huge-b")]
        + [("nan", "non_finite_reward"), ("big", "reward_out_of_range")]
    )

    collector.flush()
    conn = connect(collector.data_dir)
    rows = conn.execute(
        "SELECT rollout_id, cause, tokens, excluded FROM input_diagnostics ORDER BY rollout_id"
    ).fetchall()
    assert rows == [
        ("big", "reward_out_of_range", None, True),
        ("huge", "non_finite_gradient", None, True),
        ("huge-b", "non_finite_gradient", None, True),
        ("late-2", "invalid_behaviour_logprobs", 2, False),
        ("nan", "non_finite_reward", None, True),
        ("zero", "non_finite_gradient", None, True),
    ]
    assert conn.execute("SELECT step, masked_calls, masked_tokens FROM train_steps ORDER BY step").fetchall() == [
        (1, 0, 0),
        (2, 1, 2),
    ]


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
    """Without a gateway the trainer loads adapters itself (replicas.Replicas.swap): checked first too."""
    from safetensors.torch import save_file

    from lightning_otel.core.vllm_admin import SwapError
    from lightning_otel.trainer.config import TrainConfig
    from lightning_otel.trainer.replicas import Replicas

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file(
        {"lora_B": torch.tensor([float("-inf"), 0.5], dtype=torch.bfloat16)}, str(adapter / "adapter_model.safetensors")
    )
    config = TrainConfig()
    config.model.lora_rank, config.server.replicas = 8, ["http://127.0.0.1:9"]  # nothing listens there
    with pytest.raises(SwapError, match="non-finite"):
        Replicas(config.server, config.model).swap(adapter, "1", tmp_path / "previous")


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
