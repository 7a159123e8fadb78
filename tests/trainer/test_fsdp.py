"""Sharded full fine-tuning (FSDP2, `[update] sharding = "fsdp"`) against the one-process unsharded
update: two gloo ranks under torchrun (fsdp_worker.py) make the same AdamW step, layout by layout,
hold half of the bytes each, write the same checkpoint, and resume from either kind of checkpoint.

The reference is the plain one-process step of the same PolicyTrainer (update.py, no process group):
the acceptance is that sharding changes nothing but where the bytes live. No gradient clip
(max_grad_norm 1e9): a clip rescales any gradient to one norm and would hide a doubled or halved
one. AdamW's first step, lr * g / (|g| + eps), is nearly lr * sign(g) and hides a halved gradient
too, so gradients and AdamW's moments (linear in g) are compared as well as the weights.

The cases run in float64: sharding sums the same per-row gradients in another order (pass by pass
across ranks), and in float32 that rounding (~1e-7 of a tensor's largest gradient) becomes up to
~1e-5 in the weights where |g| is near AdamW's eps = 1e-8 (g / (|g| + eps) is steep there). In
float64 it does not, so every weight must agree to 1e-6. One float32 case, the trainer's default
dtype, holds gradients and moments to 1e-6 and the weights to what that amplification allows."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torchrun_helpers import TIMEOUT_S, torchrun, torchrun_env
from transformers import AutoModelForCausalLM

from lightning_otel.trainer.merge import LLMCall
from lightning_otel.trainer.policy import PolicyTrainer
from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
from lightning_otel.trainer.update import UpdateConfig

CLIPPED_NORM = 1e-3  # well under this batch's gradient norm (the test checks): the clip is active
# Every layout; micro-batches of 1 and 2; uneven rows per rank (padding passes); activation
# checkpointing with the KL term against a (sharded) reference model that differs from the policy.
CASES = {
    "sorted": dict(layout="sorted", micro_batch_size=1),
    "packed": dict(layout="packed", pack_length=48, micro_batch_size=2),
    "shared_prefix": dict(layout="shared_prefix", micro_batch_size=1),
    "checkpointed_kl": dict(layout="sorted", micro_batch_size=2, activation_checkpointing=True, kl_coef=0.5),
    "float32": dict(layout="shared_prefix", micro_batch_size=1),
    # The clip on: FSDP's norm must be the full gradient's, taken after the reduce-scatter.
    "clipped": dict(layout="sorted", micro_batch_size=1, max_grad_norm=CLIPPED_NORM),
    # A poisoned group (mean-only, reward 1e35: an infinite float32 gradient norm): both ranks bisect
    # the batch in lockstep, exclude the rollout at fault and step on the rest.
    "isolated": dict(layout="sorted", micro_batch_size=1, scale_by_std=False),
}
FLOAT32_CASES = ("float32", "isolated")
FLOAT32_WEIGHTS_RTOL = 1e-4  # see the module docstring; measured up to ~6e-5 here
RESUMES = ("fsdp_from_fsdp", "fsdp_from_unsharded", "unsharded_from_fsdp")


def update_config(case: str, sharding: str = "none") -> UpdateConfig:
    return UpdateConfig(**{"learning_rate": 1e-3, "max_grad_norm": 1e9, "sharding": sharding, **CASES[case]})


def dtype(case: str) -> torch.dtype:
    return torch.float32 if case in FLOAT32_CASES else torch.float64


def case_selection(case: str) -> Selection:
    """selection(1), and for "isolated" a third task whose first rollout's reward is 1e35. Its calls
    carry behaviour logprobs of -5 (the model's are ~-6): ratios ~0.3, so the PPO clip holds every
    token of the group-mate's negative advantage and only the 1e35 rollout has a gradient."""
    chosen = selection(1)
    if case == "isolated":
        for k, reward in enumerate((1e35, 0.0)):
            call = LLMCall(f"poison-{k}", list(range(30, 50)), [60 + k, 61, 62], np.full(3, -5.0))
            chosen.rollouts.append(RolloutRecord(f"poison-{k}", "task-poisoned", reward, chains=[[call]]))
    return chosen


def selection(seed: int) -> Selection:
    """Two tasks of three rollouts sharing their task's 24-token prompt. A rollout's second call
    extends its first (one sample), except in task 0's third rollout, whose second call rewrites the
    context (two samples: rollout-level weights spread over both). 7 samples: 7 sorted rows, uneven
    across two ranks."""
    rng = np.random.default_rng(seed)
    rollouts = []
    for task in range(2):
        prompt = rng.integers(3, 500, 24).tolist()
        for k in range(3):
            first = rng.integers(3, 500, 3 + 2 * k + task).tolist()
            rewritten = k == 2 and task == 0
            second_prompt = prompt + ([9, 9] if rewritten else first + [7, 8])
            second = rng.integers(3, 500, 4 + k).tolist()
            chain = [
                LLMCall(f"{seed}-{task}-{k}-a", prompt, first, rng.uniform(-7.0, -5.0, len(first))),
                LLMCall(f"{seed}-{task}-{k}-b", second_prompt, second, rng.uniform(-7.0, -5.0, len(second))),
            ]
            rollouts.append(RolloutRecord(f"r{seed}-{task}-{k}", f"task-{task}", float(rng.random()), chains=[chain]))
    return Selection(rollouts, {})


def perturbed_reference(model_dir: Path, out: Path) -> Path:
    """The tiny model with every weight nudged: a KL reference whose gradient is not zero at step 1."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    model.save_pretrained(out, safe_serialization=True)
    return out


def _named_state(trainer: PolicyTrainer) -> dict[str, dict[str, torch.Tensor]]:
    return {
        name: {k: v.clone() for k, v in trainer.optimizer.state[p].items() if k in ("exp_avg", "exp_avg_sq")}
        for name, p in trainer.model.named_parameters()
    }


def _unsharded_step(model_dir: Path, workdir: Path, case: str, reference_dir: Path) -> tuple[PolicyTrainer, dict]:
    trainer = PolicyTrainer(model_dir, workdir, update_config(case), device="cpu", dtype=dtype(case))
    if trainer.reference is not None:
        trainer.reference = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=dtype(case)).eval()
        trainer.reference.requires_grad_(False)
    result = trainer.train_on(case_selection(case))
    named = dict(trainer.model.named_parameters())
    return trainer, {
        "metrics": result.metrics,
        "at_fault": result.at_fault,
        "grads": {n: p.grad.clone() for n, p in named.items()},
        "params": {n: p.detach().clone() for n, p in named.items()},
        "optimizer": _named_state(trainer),
    }


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """The unsharded references (this process), then one torchrun of fsdp_worker.py (2 gloo ranks)."""
    root = tmp_path_factory.mktemp("fsdp")
    reference_dir = perturbed_reference(tiny_model_dir, root / "reference")
    single = {"initial": AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).state_dict()}
    for case in CASES:
        trainer, single[case] = _unsharded_step(tiny_model_dir, root / f"single-{case}", case, reference_dir)
        if case == "sorted":  # one committed step, then a second step in memory: what every resume must give
            single["checkpoint"] = trainer.save_weights().parent
            trainer.train_on(selection(2))
            single["two_steps"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    worker = [str(tiny_model_dir), str(reference_dir), str(single["checkpoint"]), str(root / "sharded")]
    # Its own session: a rank stuck in a collective (the failure mode here) is killed with torchrun.
    process = subprocess.Popen(
        torchrun("fsdp_worker.py", *worker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=torchrun_env(),
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun; its ranks die with it (die_with_parent)
        _, stderr = process.communicate(timeout=60)
        pytest.fail(f"the 2-rank FSDP run hung (a collective one rank never joined):\n{stderr[-3000:]}")
    assert process.returncode == 0, stderr[-8000:]
    sharded = torch.load(root / "sharded" / "results.pt", weights_only=False)
    # The third direction: a plain one-process run resumes from the sharded checkpoint.
    fsdp_checkpoint = root / "sharded" / "state" / "checkpoints" / "step-000001"
    resumed = PolicyTrainer(
        fsdp_checkpoint / "model", root / "resumed", update_config("sorted"), device="cpu", dtype=torch.float64
    )
    resumed.load_optimizer(fsdp_checkpoint)
    resumed.version = 1
    resumed.train_on(selection(2))
    sharded["resumed"]["unsharded_from_fsdp"] = {n: p.detach().clone() for n, p in resumed.model.named_parameters()}
    return single, sharded, fsdp_checkpoint


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-6) -> bool:
    """Within `rtol` of the tensor's largest value (elementwise relative error is ill-posed at zeros)."""
    return a.shape == b.shape and (a - b).abs().max().item() <= rtol * max(b.abs().max().item(), 1e-30)


@pytest.mark.parametrize("case", list(CASES))
def test_one_fsdp_step_equals_the_unsharded_step(runs, case):
    single, sharded, _ = runs
    one, two = single[case], sharded[case]
    assert two["at_fault"] == one["at_fault"]
    if case == "isolated":
        assert list(one["at_fault"]) == ["poison-0"] and one["metrics"]["rollouts"] == 7
    if case == "clipped":
        assert one["metrics"]["grad_norm"] > 10 * CLIPPED_NORM
        assert sum(float((g.double() ** 2).sum()) for g in one["grads"].values()) ** 0.5 == pytest.approx(CLIPPED_NORM)
    assert two["metrics"]["loss"] == pytest.approx(one["metrics"]["loss"], rel=1e-6)
    assert two["metrics"]["grad_norm"] == pytest.approx(one["metrics"]["grad_norm"], rel=1e-6)
    assert one["metrics"]["grad_norm"] > 0
    for name, grad in one["grads"].items():
        assert close(two["grads"][name], grad), f"{case}: gradient of {name}"
        for moment in ("exp_avg", "exp_avg_sq"):
            assert close(two["optimizer"][name][moment], one["optimizer"][name][moment]), f"{case}: {moment} {name}"
        rtol = FLOAT32_WEIGHTS_RTOL if case in FLOAT32_CASES else 1e-6
        assert close(two["params"][name], one["params"][name], rtol), f"{case}: weight {name}"
        assert two["params"][name].dtype == dtype(case)  # float32 / float64 master weights, whatever FSDP does
    initial = single["initial"]
    assert any(not torch.equal(p.double(), initial[n]) for n, p in one["params"].items())  # the step moved them


def test_uneven_rows_make_the_ranks_pad_and_the_cases_cover_it(runs):
    """Rank 0 has more rows than rank 1 in the micro-batch-1 sorted case: rank 1 ran a zero-weight
    pass (else FSDP's collectives would have hung); the metrics count only real rows."""
    single, sharded, _ = runs
    rows = int(single["sorted"]["metrics"]["rows"])
    assert rows % 2 == 1 and sharded["sorted"]["passes"] == [(rows + 1) // 2] * 2
    assert sharded["sorted"]["metrics"]["processed_tokens"] == single["sorted"]["metrics"]["processed_tokens"]


def test_each_rank_holds_half_of_the_parameter_gradient_and_optimizer_bytes(runs):
    _, sharded, _ = runs
    per_rank, total = sharded["bytes"], sharded["full_bytes"]
    assert len(per_rank) == 2 and total["optimizer"] == 2 * total["parameters"] == 2 * total["gradients"]
    for kind in ("parameters", "gradients", "optimizer"):
        assert sum(rank[kind] for rank in per_rank) == total[kind]
        for rank in per_rank:
            assert 0.45 * total[kind] <= rank[kind] <= 0.55 * total[kind], (kind, per_rank, total)


def test_the_gathered_checkpoint_equals_the_unsharded_one(runs):
    single, _, fsdp_checkpoint = runs
    expected = load_file(str(single["checkpoint"] / "model" / "model.safetensors"))
    written = load_file(str(fsdp_checkpoint / "model" / "model.safetensors"))
    assert sorted(written) == sorted(expected)
    for name, tensor in expected.items():
        assert written[name].dtype == tensor.dtype and close(written[name], tensor), name
    assert (fsdp_checkpoint / "optimizer" / ".metadata").exists() and not (fsdp_checkpoint / "optimizer.pt").exists()
    assert sorted(p.name for p in (fsdp_checkpoint / "optimizer").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (fsdp_checkpoint / "model" / "config.json").exists() and (fsdp_checkpoint / "state.json").exists()


@pytest.mark.parametrize("resume", RESUMES)
def test_resuming_across_sharding_continues_the_same_run(runs, resume):
    """Step 2 after loading step 1's checkpoint (weights and AdamW state) equals two unsharded steps in
    one process, whichever way the checkpoint was written and read (a lost optimizer state shows:
    AdamW's second step depends on the first moments)."""
    single, sharded, _ = runs
    resumed = sharded["resumed"][resume]
    for name, param in single["two_steps"].items():
        assert close(resumed[name], param), f"{resume}: {name}"


def test_sharding_refuses_what_it_cannot_do(tiny_model_dir, tmp_path):
    from peft import LoraConfig

    with pytest.raises(ValueError, match="torchrun"):  # no process group: nothing to shard across
        PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(sharding="fsdp"), device="cpu")
    with pytest.raises(ValueError, match="LoRA with FSDP"):
        PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(sharding="fsdp"), lora=LoraConfig(r=4), device="cpu")
    with pytest.raises(ValueError, match="sharding must be one of"):
        PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(sharding="zero3"), device="cpu")
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        PolicyTrainer(tiny_model_dir, tmp_path, UpdateConfig(mixed_precision="fp8"), device="cpu")
