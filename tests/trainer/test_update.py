"""The update step on the tiny model: micro-batching changes nothing; a step changes the weights."""

import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_otel.trainer.hotswap import model_prompt_logprobs
from lightning_otel.trainer.merge import Sample
from lightning_otel.trainer.objective import rollout_token_weights
from lightning_otel.trainer.rollout_data import RolloutRecord
from lightning_otel.trainer.update import Batch, UpdateConfig, policy_update


def _batch(model) -> Batch:
    torch.manual_seed(1)
    lengths = [(7, [0, 0, 0, 1, 1, 1, 1]), (4, [0, 1, 1, 1]), (9, [0, 0, 1, 1, 0, 0, 1, 1, 1])]
    samples = []
    for length, mask in lengths:
        ids = torch.randint(3, 500, (length,)).tolist()
        lp = [0.0] + model_prompt_logprobs(model, ids)
        # behaviour logprobs a little off the current policy, so ratios are not all 1
        behaviour = [(float(x) + 0.3 * ((i % 3) - 1)) if m else 0.0 for i, (x, m) in enumerate(zip(lp, mask))]
        samples.append(Sample(np.asarray(ids), np.asarray(mask), np.asarray(behaviour)))
    rollout_of_sample = [0, 1, 1]
    weights = rollout_token_weights([s.loss_mask for s in samples], rollout_of_sample)
    rollouts = [RolloutRecord("r0", "t", 1.0), RolloutRecord("r1", "t", 0.0)]
    return Batch(samples, rollout_of_sample, rollouts, [1.0, -1.0, -1.0], weights)


def _grads(model, batch, micro_batch_size, layout="sorted", pack_length=32):
    config = UpdateConfig(micro_batch_size=micro_batch_size, max_grad_norm=1e9, layout=layout, pack_length=pack_length)
    metrics = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, config)
    return metrics, [p.grad.clone() for p in model.parameters()]


def test_micro_batches_give_the_full_batch_gradient(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = _batch(model)
    full_metrics, full = _grads(model, batch, micro_batch_size=8)
    micro_metrics, micro = _grads(model, batch, micro_batch_size=1)
    assert micro_metrics["loss"] == pytest.approx(full_metrics["loss"], abs=1e-6)
    for a, b in zip(full, micro):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in full)


def test_reconstructed_calls_without_behaviour_logprobs_train_as_on_policy(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = _batch(model)
    for sample in batch.samples:
        sample.behaviour_logprobs[:] = np.nan  # no recorded logprobs: the ratio is 1
    metrics = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, UpdateConfig(max_grad_norm=1e9))
    assert np.isfinite(metrics["loss"]) and metrics["clip_fraction"] == 0.0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_one_step_moves_the_weights(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = policy_update(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _batch(model), UpdateConfig())
    assert metrics["rollouts"] == 2 and metrics["samples"] == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_packed_and_unpacked_batches_give_the_same_loss_and_gradient(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = _batch(model)
    unpacked_metrics, unpacked = _grads(model, batch, micro_batch_size=8, layout="sorted")
    packed_metrics, packed = _grads(model, batch, micro_batch_size=8, layout="packed")
    assert packed_metrics["rows"] == 1 and unpacked_metrics["rows"] == 3  # all three samples in one row
    assert packed_metrics["padding_fraction"] < unpacked_metrics["padding_fraction"]
    assert packed_metrics["loss"] == pytest.approx(unpacked_metrics["loss"], abs=1e-6)
    for a, b in zip(unpacked, packed):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_shared_prefix_rows_give_the_same_loss_and_gradient(tiny_model_dir):
    """Four samples of one task share a 20-token prompt: computed once, scored exactly as if whole."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(3)
    prompt = torch.randint(3, 500, (20,)).tolist()
    samples, rollouts = [], []
    for g in range(4):
        completion = torch.randint(3, 500, (3 + 2 * g,)).tolist()
        ids = prompt + completion
        behaviour = [0.0] * len(prompt) + [x + 0.1 for x in model_prompt_logprobs(model, ids)[len(prompt) - 1 :]]
        mask = [0] * len(prompt) + [1] * len(completion)
        samples.append(Sample(np.asarray(ids), np.asarray(mask), np.asarray(behaviour)))
        rollouts.append(RolloutRecord(f"r{g}", "same-task", float(g)))
    weights = rollout_token_weights([s.loss_mask for s in samples], [0, 1, 2, 3])
    batch = Batch(samples, [0, 1, 2, 3], rollouts, [1.0, -0.5, 0.5, -1.0], weights)
    plain_metrics, plain = _grads(model, batch, micro_batch_size=8, layout="sorted")
    shared_metrics, shared = _grads(model, batch, micro_batch_size=8, layout="shared_prefix", pack_length=None)
    assert shared_metrics["rows"] == 1  # one row: the prompt once, then the four completions
    assert shared_metrics["processed_tokens"] == 20 + 3 + 5 + 7 + 9
    assert shared_metrics["loss"] == pytest.approx(plain_metrics["loss"], abs=1e-6)
    for a, b in zip(plain, shared):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def one_update(model, max_grad_norm: float = float("inf")):
    """The update both the 1-process and the 2-process runs make (also used by dist_update_worker.py).
    SGD, so the update is linear in the gradient: Adam's first step is lr * sign(g), which would turn
    float-rounding noise in near-zero gradients into lr-sized differences. No gradient clipping by
    default: a clip scales any gradient to the same norm, so averaging instead of summing across
    processes would give the same step. With a clip, it must come after the cross-process sum."""
    batch = _batch(model)
    config = UpdateConfig(micro_batch_size=1, layout="sorted", max_grad_norm=max_grad_norm)
    return policy_update(model, torch.optim.SGD(model.parameters(), lr=LEARNING_RATE), batch, config)


LEARNING_RATE = 0.1


def _run_two_gloo_processes(model_dir, out, *extra) -> dict:
    import subprocess

    from torchrun_helpers import TIMEOUT_S, torchrun, torchrun_env

    command = torchrun("dist_update_worker.py", model_dir, out, *extra)
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=torchrun_env())
    assert result.returncode == 0, result.stderr[-6000:]
    return torch.load(out, weights_only=False)


def test_two_gloo_processes_make_the_same_update_as_one(tiny_model_dir, tmp_path):
    distributed = _run_two_gloo_processes(tiny_model_dir, tmp_path / "params.pt")["params"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    one_update(model)
    single = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.allclose(single, before)  # the update moved the weights
    assert torch.allclose(distributed, single, atol=1e-6)


def _reference_gradient(model, batch) -> tuple[list[torch.Tensor], float]:
    """The batch gradient from the definitions, one whole sample at a time in one process: PPO clip
    (0.2, 0.28) on exp(clamp(logp - behaviour, -20, 20)), dual-clip 3, the batch's fixed advantages
    and token weights. Returns the gradients and their total norm."""
    total = torch.zeros(())
    for sample, advantage, weights in zip(batch.samples, batch.advantages, batch.token_weights):
        ids = torch.tensor(sample.token_ids.tolist())
        logits = model(input_ids=ids[None]).logits[0].float()
        logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None])[:, 0]
        for position in range(1, len(ids)):
            if not sample.loss_mask[position]:
                continue
            log_ratio = logprobs[position - 1] - float(sample.behaviour_logprobs[position])
            ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
            loss = torch.maximum(-ratio * advantage, -torch.clamp(ratio, 0.8, 1.28) * advantage)
            if advantage < 0:
                loss = torch.minimum(loss, torch.tensor(-3.0 * advantage))
            total = total + float(weights[position]) * loss
    grads = torch.autograd.grad(total, list(model.parameters()), allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(model.parameters(), grads)]
    return grads, math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))


def test_two_gloo_processes_clip_the_summed_gradient_like_one_process_would(tiny_model_dir, tmp_path):
    """With the clip on (to a quarter of the gradient's norm), 2 ranks must clip the SUM of their
    gradients: clipping each rank's part before the sum gives another direction and size. The
    reference is computed here, in one process, from the definitions."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = _batch(model)
    grads, norm = _reference_gradient(model, batch)
    max_grad_norm = norm / 4
    scale = max_grad_norm / (norm + 1e-6)  # torch's clip_grad_norm_ coefficient
    want = torch.cat([(p.detach() - LEARNING_RATE * scale * g).flatten() for p, g in zip(model.parameters(), grads)])

    result = _run_two_gloo_processes(tiny_model_dir, tmp_path / "params.pt", repr(max_grad_norm))
    assert result["metrics"]["grad_norm"] == pytest.approx(norm, rel=1e-5)  # the norm before the clip
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (want - before).norm().item() == pytest.approx(LEARNING_RATE * max_grad_norm, rel=1e-4)
    assert torch.allclose(result["params"], want, atol=1e-7, rtol=1e-5), (result["params"] - want).abs().max()


def test_lora_trains_adapters_only_and_saves_merged_weights(tiny_model_dir, tmp_path):
    from peft import LoraConfig
    from safetensors.torch import load_file

    from lightning_otel.trainer.merge import LLMCall
    from lightning_otel.trainer.policy import PolicyTrainer
    from lightning_otel.trainer.rollout_data import Selection

    trainer = PolicyTrainer(
        tiny_model_dir,
        tmp_path,
        UpdateConfig(learning_rate=1e-2),
        lora=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    rollouts = [
        RolloutRecord(f"r{i}", "t", float(i), chains=[[LLMCall(f"c{i}", [1, 2, 3], [4 + i, 5], [-1.0, -1.0])]])
        for i in range(2)
    ]
    result = trainer.train_on(Selection(rollouts, {}))
    assert result.metrics["grad_norm"] > 0
    assert all(torch.equal(frozen[n], p) for n, p in trainer.model.named_parameters() if n in frozen)
    saved = load_file(str(trainer.save_weights() / "model.safetensors"))
    assert not any("lora" in name for name in saved)  # merged: a plain checkpoint vLLM can reload
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(saved[n], base[n]) for n in saved if "q_proj" in n)
