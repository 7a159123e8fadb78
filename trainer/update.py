"""One policy update: samples + rollout advantages -> micro-batched forward/backward -> one step.

The loss is `objective.py`'s: PPO clip against the behaviour logprobs recorded from vLLM,
weighted by rollout-level token-mean weights computed for the whole batch up front, so summing
micro-batch losses gives the full-batch loss and gradient exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_otel.trainer.merge import Sample, merge_calls
from lightning_otel.trainer.objective import group_advantages, ppo_clip_token_loss, rollout_token_weights, weighted_loss
from lightning_otel.trainer.rollout_data import Selection


@dataclass
class UpdateConfig:
    learning_rate: float = 1e-4
    eps_low: float = 0.2
    eps_high: float = 0.28
    scale_by_std: bool = True  # z-score advantages within a task (False: mean-only, Dr. GRPO)
    micro_batch_size: int = 8
    max_grad_norm: float = 1.0


@dataclass
class Batch:
    samples: list[Sample]
    rollout_of_sample: list[int]  # index into rollout_ids
    rollout_ids: list[str]
    advantages: list[float]  # one per rollout
    token_weights: list[list[float]]  # w_t per sample token, summing to 1 over the batch

    @property
    def samples_per_rollout(self) -> float:
        return len(self.samples) / max(1, len(self.rollout_ids))


def build_batch(selection: Selection, scale_by_std: bool = True) -> Batch:
    """Merge each rollout's calls into samples; one GRPO advantage per rollout, grouped by task."""
    samples, rollout_of_sample = [], []
    for index, rollout in enumerate(selection.rollouts):
        for sample in merge_calls(rollout.calls):
            samples.append(sample)
            rollout_of_sample.append(index)
    advantages = group_advantages(
        [r.reward for r in selection.rollouts], [r.task_id for r in selection.rollouts], scale_by_std
    )
    weights = rollout_token_weights([s.loss_mask for s in samples], rollout_of_sample)
    return Batch(samples, rollout_of_sample, [r.rollout_id for r in selection.rollouts], advantages, weights)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """logp(token_t | tokens_<t) for t >= 1, shape [B, L]; position 0 (never generated) is 0."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logprobs, (1, 0))


def _pad(rows: list[list], value, dtype: torch.dtype) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)


def policy_update(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, config: UpdateConfig
) -> dict[str, float]:
    """Accumulate the loss over micro-batches, clip the gradient norm, take one optimizer step."""
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total_loss, clipped_weight, generated = 0.0, 0.0, 0
    for start in range(0, len(batch.samples), config.micro_batch_size):
        chunk = range(start, min(start + config.micro_batch_size, len(batch.samples)))
        samples = [batch.samples[i] for i in chunk]
        input_ids = _pad([s.token_ids for s in samples], 0, torch.long).to(device)
        attention = _pad([[1] * len(s.token_ids) for s in samples], 0, torch.long).to(device)
        behaviour = _pad([s.behaviour_logprobs for s in samples], 0.0, torch.float32).to(device)
        weights = _pad([batch.token_weights[i] for i in chunk], 0.0, torch.float32).to(device)
        advantages = torch.tensor(
            [batch.advantages[batch.rollout_of_sample[i]] for i in chunk], dtype=torch.float32, device=device
        )[:, None]
        logprobs = token_logprobs(model, input_ids, attention)
        token_loss, clipped = ppo_clip_token_loss(logprobs, behaviour, advantages, config.eps_low, config.eps_high)
        loss = weighted_loss(token_loss, weights)
        loss.backward()
        total_loss += loss.item()
        clipped_weight += (weights * clipped).sum().item()
        generated += sum(s.generated_tokens for s in samples)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm).item()
    optimizer.step()
    return {
        "loss": total_loss,
        "clip_fraction": clipped_weight,  # rollout-weighted share of clipped tokens
        "grad_norm": grad_norm,
        "generated_tokens": float(generated),
        "samples": float(len(batch.samples)),
        "rollouts": float(len(batch.rollout_ids)),
    }
