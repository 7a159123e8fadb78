"""The training objective: GRPO advantages, PPO clip, and how the loss is normalized.

Notation: a batch holds R rollouts split into S samples; rollout r has reward x_r and task g(r);
sample s has T_s generated (loss-masked) tokens, rollout r has T_r = sum of its samples' T_s, and
T = sum over the batch. Advantages are normalized within a task group G:

    A = (x - mean_G) / (std_G + eps)   z-score            A = x - mean_G   mean-only (Dr. GRPO)

with population std. A group whose rewards are all equal gets A = 0 for every member (no signal;
such groups are reported). Advantage level:
    rollout (default)  one A_r per rollout, groups of rollouts; all samples and tokens of r share it
    sample (ablation)  every sample is a unit of its own with its rollout's reward, groups of samples
                       (a rollout split in 3 counts 3 times in its group's mean and std)

Per generated token t, with rho_t = exp(logp_theta(t) - logp_old(t)):
    l_t = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A)  [+ beta * KL_t]
logp_old is the behaviour logprob vLLM returned at sampling time, or, with truncated importance
sampling (TIS), the trainer's own logprob before the update, with l_t multiplied by
min(exp(logp_old - logp_behaviour), C) (detached) to correct for vLLM/trainer mismatch.
KL_t = exp(ref - logp) - (ref - logp) - 1 (the k3 estimator) against a frozen reference.

The loss is sum_t w_t * l_t with weights fixed for the whole batch before any micro-batching (so
accumulation and data-parallel sharding give the full-batch gradient exactly):
    rollout       w = 1 / (R * T_r)      token mean per rollout, then mean over rollouts (default;
                                         a rollout weighs 1/R however many samples it became)
    sample        w = 1 / (S * T_s)      token mean per sample, then mean over samples (TRL "grpo")
    batch_token   w = 1 / T              token mean over the batch (TRL "dapo")
    fixed_length  w = 1 / (S * L)        token sum over S samples of a fixed length L (TRL "dr_grpo")
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import numpy as np
import torch

ADVANTAGE_LEVELS = ("rollout", "sample")
NORMALIZATIONS = ("rollout", "sample", "batch_token", "fixed_length")


def group_advantages(
    rewards: Sequence[float], groups: Sequence[str], scale_by_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """GRPO advantages, one per unit (rollout or sample), normalized within each group."""
    return group_advantages_with_report(rewards, groups, scale_by_std, eps)[0]


def group_advantages_with_report(
    rewards: Sequence[float], groups: Sequence[str], scale_by_std: bool = True, eps: float = 1e-6
) -> tuple[list[float], list[str]]:
    """Advantages, and the groups whose rewards had no variance (they contribute nothing)."""
    if len(rewards) != len(groups):
        raise ValueError("rewards and groups must have the same length")
    for value in rewards:
        if not math.isfinite(value):
            raise ValueError(f"non-finite reward {value}: exclude such rollouts before computing advantages")
    members: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    advantages, flat = [0.0] * len(rewards), []
    for group, indices in members.items():
        values = [rewards[i] for i in indices]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        if std == 0.0:
            flat.append(group)
            continue
        for i in indices:
            centered = rewards[i] - mean
            advantages[i] = centered / (std + eps) if scale_by_std else centered
    return advantages, flat


def token_weights(
    masks: Sequence[Sequence[int]],
    rollout_of_sample: Sequence[int],
    normalization: str = "rollout",
    fixed_length: int | None = None,
) -> list[np.ndarray]:
    """Per-token loss weights for every sample (see the module docstring); they sum to 1 except
    for fixed_length, whose sum is T / (S * L)."""
    masks = [np.asarray(mask, dtype=np.float64) for mask in masks]
    tokens = [mask.sum() for mask in masks]
    n_samples = len(masks)
    if normalization == "rollout":
        totals: dict[int, float] = defaultdict(float)
        for count, rollout in zip(tokens, rollout_of_sample, strict=True):
            totals[rollout] += count
        n_rollouts = sum(1 for total in totals.values() if total > 0)
        scales = [1.0 / (n_rollouts * totals[r]) if totals[r] > 0 else 0.0 for r in rollout_of_sample]
    elif normalization == "sample":
        scales = [1.0 / (n_samples * max(count, 1.0)) for count in tokens]
    elif normalization == "batch_token":
        scales = [1.0 / max(sum(tokens), 1.0)] * n_samples
    elif normalization == "fixed_length":
        length = fixed_length or int(max(tokens, default=1))
        scales = [1.0 / (n_samples * length)] * n_samples
    else:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    return [mask * scale for mask, scale in zip(masks, scales)]


def rollout_token_weights(masks: Sequence[Sequence[int]], rollout_of_sample: Sequence[int]) -> list[np.ndarray]:
    """w_t = 1 / (R * T_r) on generated tokens: the default normalization."""
    return token_weights(masks, rollout_of_sample, "rollout")


def ppo_clip_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss l_t and a bool tensor marking clipped tokens."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, clipped < unclipped


def truncated_importance_weights(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """min(pi_old / pi_behaviour, cap), detached: corrects for the sampler's numerics differing from the trainer's."""
    return torch.clamp(torch.exp(old_logprobs - behaviour_logprobs), max=cap).detach()


def k3_kl(logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    delta = reference_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def weighted_loss(token_loss: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_t w_t * l_t."""
    return (token_loss * weights).sum()
