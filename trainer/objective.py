"""The training objective: rollout-level GRPO advantages, rollout-level token-mean loss, PPO clip.

Notation: a batch holds R rollouts; rollout r has reward x_r, task (group) g(r), and is split
into samples whose generated (loss-masked) tokens number T_r in total.

Advantage (per rollout, shared by all its samples and tokens):
    A_r = (x_r - mean_{g(r)}) / (std_{g(r)} + eps)      with scale_by_std (z-score)
    A_r =  x_r - mean_{g(r)}                            without (Dr. GRPO style)
mean and std are over the rollouts of the same task in the batch (population std). A group
whose rewards are all equal gets A_r = 0 for every member: it carries no signal.

Per-token PPO-clip term, with rho_t = exp(logp_theta(t) - logp_behaviour(t)) and the behaviour
logprobs recorded from vLLM at sampling time:
    l_t = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A)

Normalization (rollout-level token mean; the paper's, so every rollout weighs the same however
many samples it was split into):
    L = (1/R) * sum_r (1/T_r) * sum_{t in rollout r} l_t
implemented as fixed per-token weights w_t = 1 / (R * T_r), computed over the whole batch before
any micro-batching, so gradient accumulation gives the full-batch gradient exactly.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import numpy as np
import torch


def group_advantages(
    rewards: Sequence[float], groups: Sequence[str], scale_by_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """GRPO advantages, one per rollout, normalized within each group (task id)."""
    if len(rewards) != len(groups):
        raise ValueError("rewards and groups must have the same length")
    for value in rewards:
        if not math.isfinite(value):
            raise ValueError(f"non-finite reward {value}: exclude such rollouts before computing advantages")
    members: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    advantages = [0.0] * len(rewards)
    for indices in members.values():
        values = [rewards[i] for i in indices]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        if std == 0.0:
            continue  # zero-variance group: no signal, advantages stay 0
        for i in indices:
            centered = rewards[i] - mean
            advantages[i] = centered / (std + eps) if scale_by_std else centered
    return advantages


def rollout_token_weights(masks: Sequence[Sequence[int]], rollout_of_sample: Sequence[int]) -> list[np.ndarray]:
    """w_t = 1 / (R * T_r) on generated tokens, 0 elsewhere; R counts rollouts with T_r > 0.
    The weights of the whole batch sum to 1."""
    masks = [np.asarray(mask, dtype=np.float64) for mask in masks]
    totals: dict[int, float] = defaultdict(float)
    for mask, rollout in zip(masks, rollout_of_sample, strict=True):
        totals[rollout] += mask.sum()
    n_rollouts = sum(1 for tokens in totals.values() if tokens > 0)
    return [
        mask / (n_rollouts * totals[rollout]) if totals[rollout] > 0 else np.zeros_like(mask)
        for mask, rollout in zip(masks, rollout_of_sample, strict=True)
    ]


def ppo_clip_token_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss l_t and a bool tensor marking clipped tokens."""
    ratio = torch.exp(logprobs - behaviour_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, clipped < unclipped


def weighted_loss(token_loss: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_t w_t * l_t: with rollout_token_weights this is the rollout-level token mean."""
    return (token_loss * weights).sum()
