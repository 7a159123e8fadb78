"""The training objective: GRPO advantages, PPO clip, and how the loss is normalized.

Notation: a batch holds R rollouts split into S samples; rollout r has reward x_r and task g(r);
sample s has T_s generated (loss-masked) tokens, rollout r has T_r = sum of its samples' T_s, and
T = sum over the batch. A generated token whose behaviour logprob is unusable (NaN, infinite,
below a floor, or positive; input_hygiene.py) is masked before any of this: it counts in no T and has no loss.
Advantages are normalized within a task group G:

    A = (x - mean_G) / (std_G + eps)   z-score            A = x - mean_G   mean-only (Dr. GRPO)

with population std and eps = 1e-6. A group whose std is 0 within ZERO_STD_ATOL (isclose, as TRL
does; this includes a group of one rollout) gets A = 0 for every member (no signal; such groups
are reported). Advantage level:
    rollout (default)  one A_r per rollout, groups of rollouts; all samples and tokens of r share it
    sample (ablation)  every sample is a unit of its own with its rollout's reward, groups of samples
                       (a rollout split in 3 counts 3 times in its group's mean and std)

Per generated token t, with the log-ratio clamped to [-Lc, Lc] before it is exponentiated:
    rho_t = exp(clamp(logp_theta(t) - logp_old(t), -Lc, Lc))
    u_t   = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A)      (PPO clip)
    l_t   = u_t                   if A >= 0
    l_t   = min(u_t, -c * A)      if A < 0                                 (dual-clip, c > 1)
    [+ beta * KL_t]
So d l_t / d logp_theta(t) is 0 wherever a clip is active and at most max(1 + eps_high, c) * |A| in
size otherwise (times at most C with TIS; the KL term aside): no single token can dominate the
update, whatever its behaviour logprob. The clamp
keeps exp() finite (an inf ratio times a zero gradient would be NaN). Lc = inf or c = inf turns
either off; defaults Lc = 20, c = 3 (verl's).
logp_old is the behaviour logprob vLLM returned at sampling time, or, with truncated importance
sampling (TIS), the trainer's own logprob before the update, with l_t multiplied by
min(exp(logp_old - logp_behaviour), C) (detached) to correct for vLLM/trainer mismatch.
KL_t = exp(delta) - delta - 1 with delta = clamp(ref - logp, -Lc, Lc) (the k3 estimator) against a
frozen reference.

The loss is sum_t w_t * l_t with weights fixed for the whole batch before any micro-batching (so
accumulation and data-parallel sharding give the full-batch gradient exactly):
    rollout       w = 1 / (R * T_r)      token mean per rollout, then mean over rollouts (default;
                                         a rollout weighs 1/R however many samples it became)
    sample        w = 1 / (S * T_s)      token mean per sample, then mean over samples (TRL "grpo")
    batch_token   w = 1 / T              token mean over the batch (TRL "dapo")
    fixed_length  w = 1 / (S * L)        token sum over S samples, divided by a constant L that the
                                         caller sets (TRL "dr_grpo" with L = max_completion_length)
(R counts only rollouts left with a generated token.) A batch without any generated token has no
loss: token_weights raises ValueError.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import ArrayLike

ADVANTAGE_LEVELS = ("rollout", "sample")
NORMALIZATIONS = ("rollout", "sample", "batch_token", "fixed_length")
ZERO_STD_ATOL = 1e-8  # a group's std at most this is zero: torch.isclose(std, 0)'s default, as TRL tests it


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
        mean = sum(v / len(values) for v in values)
        # Scaled by the largest deviation: squares of rewards past ~1e154 would overflow float64.
        scale = max(abs(v - mean) for v in values)
        std = scale * math.sqrt(sum(((v - mean) / scale) ** 2 for v in values) / len(values)) if scale > 0 else 0.0
        if math.isclose(std, 0.0, abs_tol=ZERO_STD_ATOL):  # 0.1 + 0.2 vs 0.3 is no signal either
            flat.append(group)
            continue
        for i in indices:
            centered = rewards[i] - mean
            advantages[i] = centered / (std + eps) if scale_by_std else centered
    return advantages, flat


def token_weights(
    masks: Sequence[ArrayLike],
    rollout_of_sample: Sequence[int],
    normalization: str = "rollout",
    fixed_length: int | None = None,
) -> list[np.ndarray]:
    """Per-token loss weights for every sample (see the module docstring); they sum to 1 except
    for fixed_length, whose sum is T / (S * L). ValueError when no token is generated."""
    arrays = [np.asarray(mask, dtype=np.float64) for mask in masks]
    tokens = [float(mask.sum()) for mask in arrays]
    n_samples = len(arrays)
    if sum(tokens) == 0:
        raise ValueError(f"no generated token to train on in {n_samples} sample(s): every token is masked")
    if normalization == "rollout":
        totals: dict[int, float] = defaultdict(float)
        for count, rollout in zip(tokens, rollout_of_sample, strict=True):
            totals[rollout] += count
        n_rollouts = sum(1 for total in totals.values() if total > 0)
        scales = [1.0 / (n_rollouts * totals[r]) if totals[r] > 0 else 0.0 for r in rollout_of_sample]
    elif normalization == "sample":
        scales = [1.0 / (n_samples * max(count, 1.0)) for count in tokens]
    elif normalization == "batch_token":
        scales = [1.0 / sum(tokens)] * n_samples
    elif normalization == "fixed_length":
        if not fixed_length or fixed_length <= 0:
            raise ValueError("normalization 'fixed_length' needs fixed_length = L > 0 (TRL: max_completion_length)")
        scales = [1.0 / (n_samples * fixed_length)] * n_samples
    else:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    return [mask * scale for mask, scale in zip(arrays, scales)]


def rollout_token_weights(masks: Sequence[Sequence[int]], rollout_of_sample: Sequence[int]) -> list[np.ndarray]:
    """w_t = 1 / (R * T_r) on generated tokens: the default normalization."""
    return token_weights(masks, rollout_of_sample, "rollout")


def ppo_clip_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    log_ratio_clamp: float | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss l_t (module docstring; None or inf turns the clamp or the dual-clip off) and a
    bool tensor marking the tokens where a clip is active (their loss does not depend on the ratio)."""
    log_ratio = logprobs - old_logprobs
    if log_ratio_clamp is not None and math.isfinite(log_ratio_clamp):
        log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    active = clipped > unclipped
    if dual_clip is not None and math.isfinite(dual_clip):
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        cap = -dual_clip * advantages
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        active = active | dual
    return loss, active


def truncated_importance_weights(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """min(pi_old / pi_behaviour, cap), detached: corrects for the sampler's numerics differing from the trainer's."""
    return torch.clamp(torch.exp(old_logprobs - behaviour_logprobs), max=cap).detach()


def k3_kl(
    logprobs: torch.Tensor, reference_logprobs: torch.Tensor, log_ratio_clamp: float | None = None
) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate exp(delta) - delta - 1 (>= 0), delta = ref - logp
    (clamped to +-log_ratio_clamp when given)."""
    delta = reference_logprobs - logprobs
    if log_ratio_clamp is not None and math.isfinite(log_ratio_clamp):
        delta = torch.clamp(delta, -log_ratio_clamp, log_ratio_clamp)
    return torch.exp(delta) - delta - 1.0


def weighted_loss(token_loss: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_t w_t * l_t."""
    return (token_loss * weights).sum()
