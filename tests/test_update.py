"""The update step on the tiny model: micro-batching changes nothing; a step changes the weights."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import numpy as np

from lightning_otel.trainer.merge import Sample
from lightning_otel.trainer.objective import rollout_token_weights
from lightning_otel.trainer.rollout_data import RolloutRecord
from lightning_otel.trainer.update import Batch, UpdateConfig, policy_update, token_logprobs


def _batch(model) -> Batch:
    torch.manual_seed(1)
    lengths = [(7, [0, 0, 0, 1, 1, 1, 1]), (4, [0, 1, 1, 1]), (9, [0, 0, 1, 1, 0, 0, 1, 1, 1])]
    samples = []
    for length, mask in lengths:
        ids = torch.randint(3, 500, (length,)).tolist()
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([ids]), torch.ones(1, length, dtype=torch.long))[0]
        # behaviour logprobs a little off the current policy, so ratios are not all 1
        behaviour = [(float(x) + 0.3 * ((i % 3) - 1)) if m else 0.0 for i, (x, m) in enumerate(zip(lp, mask))]
        samples.append(Sample(np.asarray(ids), np.asarray(mask), np.asarray(behaviour)))
    rollout_of_sample = [0, 1, 1]
    weights = rollout_token_weights([s.loss_mask for s in samples], rollout_of_sample)
    rollouts = [RolloutRecord("r0", "t", 1.0), RolloutRecord("r1", "t", 0.0)]
    return Batch(samples, rollout_of_sample, rollouts, [1.0, -1.0], weights)


def _grads(model, batch, micro_batch_size):
    config = UpdateConfig(micro_batch_size=micro_batch_size, max_grad_norm=1e9)
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
