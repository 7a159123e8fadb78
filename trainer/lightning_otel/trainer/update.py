"""One policy update: samples + advantages -> packed micro-batches -> forward/backward -> one step.

The loss is objective.py's. Everything that normalizes it (advantages, per-token weights) is fixed
for the whole batch before the batch is cut into micro-batches or shared out across processes, so
gradient accumulation and data parallelism give the full-batch gradient exactly: each process sums
its rows' weighted losses, and the gradients are summed (not averaged) across processes: by an
all-reduce, or sharded (sharding.py, FSDP2) by a reduce-scatter whose divide factor is 1.

Nothing poisoned is stepped on: behaviour logprobs the loss cannot use are masked before the batch is
built (input_hygiene.py, reported in `Batch.masked_calls`); if the loss or the gradient norm is
still not finite, no optimizer step is taken and NonFiniteUpdate names the rollouts whose token
losses were not finite (fault_isolation.py then finds the rollouts at fault by bisection, and the
step is made on the others). `gradient_check` measures a batch's loss and gradient norm without a
step, for that search.

How samples become rows (sorted, packed, shared prefixes) is layout.py's; BENCHMARKS.md has the
measurements on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from lightning_otel.trainer.config import UpdateConfig
from lightning_otel.trainer.input_hygiene import MaskedCall, screen_call
from lightning_otel.trainer.layout import Row, plan_rows, row_tensors, scored_logprobs
from lightning_otel.trainer.merge import Boundary, Sample, merge_calls
from lightning_otel.trainer.objective import (
    ADVANTAGE_LEVELS,
    group_advantages_with_report,
    k3_kl,
    ppo_clip_token_loss,
    token_weights,
    truncated_importance_weights,
    weighted_loss,
)
from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
from lightning_otel.trainer.sharding import is_sharded


class UntrainableBatch(ValueError):
    """No update was made from these rollouts: `reason` says why, `rollout_ids` which are at fault,
    `reasons` each one's own reason (the same `reason` unless given)."""

    cause = "no_trainable_token"
    headline = "no trainable token"

    def __init__(
        self,
        reason: str,
        rollout_ids: list[str],
        metrics: dict[str, float] | None = None,
        reasons: dict[str, str] | None = None,
    ) -> None:
        shown = ", ".join(rollout_ids[:5]) + (f" and {len(rollout_ids) - 5} more" if len(rollout_ids) > 5 else "")
        super().__init__(f"{reason}; rollouts: {shown}")
        self.reason, self.rollout_ids, self.metrics = reason, list(rollout_ids), metrics or {}
        self.reasons = {rid: (reasons or {}).get(rid, reason) for rid in self.rollout_ids}


class NonFiniteUpdate(UntrainableBatch):
    """The loss or the gradient norm was not finite: no optimizer step was taken, gradients cleared.
    The rollouts are those with a non-finite token loss (`traced`), or the whole batch when only the
    backward pass overflowed (`traced` False: fault_isolation.py bisects the batch to find them)."""

    cause = "non_finite_gradient"
    headline = "non-finite gradient"

    def __init__(self, *args, traced: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.traced = traced


@dataclass(frozen=True)
class ChainBoundary:
    rollout_index: int
    chain: int
    boundary: Boundary


@dataclass
class Batch:
    samples: list[Sample]
    rollout_of_sample: list[int]  # index into rollouts
    rollouts: list[RolloutRecord]
    advantages: list[float]  # one per sample
    token_weights: list[np.ndarray]  # w_t per sample token, fixed for the whole batch
    boundaries: list[ChainBoundary] = field(default_factory=list)
    stale_samples: int = 0  # dropped by the staleness filter
    zero_variance_groups: list[str] = field(default_factory=list)  # tasks whose rewards were all equal
    masked_calls: list[MaskedCall] = field(default_factory=list)  # calls with behaviour logprobs masked out

    @property
    def rollout_ids(self) -> list[str]:
        return [r.rollout_id for r in self.rollouts]

    @property
    def samples_per_rollout(self) -> float:
        return len(self.samples) / max(1, len(self.rollouts))

    def samples_per_rollout_histogram(self) -> list[int]:
        """Element k: how many rollouts became k + 1 samples (rollouts left with none not counted)."""
        counts = (
            np.bincount(self.rollout_of_sample, minlength=len(self.rollouts)) if self.rollouts else np.zeros(0, int)
        )
        counts = counts[counts > 0]
        return np.bincount(counts - 1).tolist() if counts.size else []


def learning_rate_at(step: int, config: UpdateConfig) -> float:
    """The learning rate of step `step` (0 for the first): linear warm-up over `warmup_steps`
    (step k takes (k + 1) / warmup_steps of it), then constant. The first steps of AdamW move every
    weight by about the learning rate whatever the gradient's size (its moment estimates start empty)."""
    if config.warmup_steps <= 0:
        return config.learning_rate
    return config.learning_rate * min(1.0, (step + 1) / config.warmup_steps)


def _staleness(sample: Sample, current_version: int) -> int | None:
    versions = [int(v) for v in sample.policy_versions if v is not None and str(v).lstrip("-").isdigit()]
    return current_version - min(versions) if versions else None


def build_batch(
    selection: Selection,
    scale_by_std: bool = True,
    max_staleness: int | None = None,
    current_version: int | None = None,
    config: UpdateConfig | None = None,
) -> Batch:
    """Merge each rollout's chains into samples, then advantages and token weights (objective.py).

    With `max_staleness`, samples generated by a policy more than that many versions older than
    `current_version` are dropped (a sample's version is its oldest call's). Calls are screened first
    (input_hygiene.screen_call). UntrainableBatch when no generated token is left."""
    config = config or UpdateConfig(scale_by_std=scale_by_std)
    if config.advantage_level not in ADVANTAGE_LEVELS:
        raise ValueError(f"advantage_level must be one of {ADVANTAGE_LEVELS}, got {config.advantage_level!r}")
    samples, rollout_of_sample, boundaries, stale, masked_calls = [], [], [], 0, []
    for index, rollout in enumerate(selection.rollouts):
        for chain_index, chain in enumerate(rollout.chains):
            screened = []
            for call in chain:
                call, report = screen_call(call, rollout.rollout_id, rollout.task_id, config.behaviour_logprob_floor)
                screened.append(call)
                if report is not None:
                    masked_calls.append(report)
            chain_samples, chain_boundaries = merge_calls(screened)
            boundaries += [ChainBoundary(index, chain_index, b) for b in chain_boundaries]
            for sample in chain_samples:
                age = (
                    _staleness(sample, current_version)
                    if max_staleness is not None and current_version is not None
                    else None
                )
                if age is not None and max_staleness is not None and age > max_staleness:
                    stale += 1
                    continue
                samples.append(sample)
                rollout_of_sample.append(index)
    rollouts = list(selection.rollouts)
    if not any(s.loss_mask.any() for s in samples):
        why = f"{stale} sample(s) staler than max_staleness" if stale else "every generated token is masked"
        raise UntrainableBatch(f"no generated token to train on ({why})", [r.rollout_id for r in rollouts])
    if config.advantage_level == "rollout":
        per_rollout, flat = group_advantages_with_report(
            [r.reward for r in rollouts], [r.task_id for r in rollouts], config.scale_by_std
        )
        advantages = [per_rollout[r] for r in rollout_of_sample]
    else:
        advantages, flat = group_advantages_with_report(
            [rollouts[r].reward for r in rollout_of_sample],
            [rollouts[r].task_id for r in rollout_of_sample],
            config.scale_by_std,
        )
    weights = token_weights(
        [s.loss_mask for s in samples], rollout_of_sample, config.normalization, config.fixed_length
    )
    return Batch(samples, rollout_of_sample, rollouts, advantages, weights, boundaries, stale, flat, masked_calls)


def _my_rows(rows: list[Row]) -> list[Row]:
    if dist.is_available() and dist.is_initialized():
        return rows[dist.get_rank() :: dist.get_world_size()]
    return rows


def _micro_batches(rows: list[Row], size: int, sharded: bool) -> list[list[Row] | None]:
    """This process's micro-batches. Sharded, every FSDP forward is a collective: each rank makes as
    many passes as the busiest rank (rank 0, with ceil(rows / world) rows), None marking an extra one."""
    mine = _my_rows(rows)
    chunks: list[list[Row] | None] = [mine[start : start + size] for start in range(0, len(mine), size)]
    if sharded:
        passes = math.ceil(math.ceil(len(rows) / dist.get_world_size()) / size)
        chunks += [None] * (passes - len(chunks))
    return chunks


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    config: UpdateConfig,
    reference_model: torch.nn.Module | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Accumulate the weighted loss over (this process's) micro-batches, sum gradients across
    processes, clip the gradient norm, take one optimizer step. Returns batch-wide metrics.
    NonFiniteUpdate, with no step taken, when the loss or the gradient norm is not finite.
    `progress`: a progress bar over micro-batches on stderr."""
    optimizer.zero_grad(set_to_none=True)
    rows, totals, at_fault = _accumulate(model, batch, config, reference_model, progress)
    # Clipped after the cross-process sum: the norm is the whole batch's, on every rank the same.
    grad_norm = _grad_norm(model, config.max_grad_norm)
    loss, clipped, entropy, kl, generated, processed, real = totals.tolist()
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)  # and no step: the weights stay as they were
        traced = at_fault.nonzero().flatten().tolist()
        ids = [batch.rollouts[i].rollout_id for i in traced] or batch.rollout_ids
        raise NonFiniteUpdate(
            f"non-finite gradient (loss {loss:.3g}, gradient norm {grad_norm:.3g})",
            ids,
            {"loss": loss, "grad_norm": grad_norm},
            traced=bool(traced),
        )
    optimizer.step()
    return {
        "loss": loss,
        "clip_fraction": clipped,  # weighted share of clipped tokens
        "entropy": entropy / max(generated, 1.0),
        "kl": kl / max(generated, 1.0),
        "grad_norm": grad_norm,
        "generated_tokens": generated,
        "padding_fraction": 1.0 - real / max(processed, 1.0),
        "processed_tokens": real,  # tokens in rows, padding excluded (shared prefixes counted once)
        "rows": float(len(rows)),
        "samples": float(len(batch.samples)),
        "rollouts": float(len(batch.rollouts)),
        "zero_variance_groups": float(len(batch.zero_variance_groups)),
        "masked_calls": float(len(batch.masked_calls)),
        "masked_tokens": float(sum(m.tokens for m in batch.masked_calls)),
    }


def gradient_check(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    config: UpdateConfig,
    reference_model: torch.nn.Module | None = None,
) -> tuple[float, float, bool]:
    """(loss, gradient norm, finite) of `batch` summed over every process, without a step or a clip;
    gradients cleared after. Every rank calls it with the same batch and gets the same answer (the
    verdict is agreed by an all-reduce), so a search built on it keeps the ranks in lockstep."""
    optimizer.zero_grad(set_to_none=True)
    _, totals, _ = _accumulate(model, batch, config, reference_model)
    grad_norm = _grad_norm(model, math.inf)  # inf: measured, never rescaled
    optimizer.zero_grad(set_to_none=True)
    loss = totals[0].item()
    bad = torch.tensor([0.0 if math.isfinite(loss) and math.isfinite(grad_norm) else 1.0], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return loss, grad_norm, not bad.item()


def _grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """The total gradient norm (sharded: of the full gradients), clipping to `max_norm`."""
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_norm)
    return (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()


def _accumulate(
    model: torch.nn.Module,
    batch: Batch,
    config: UpdateConfig,
    reference_model: torch.nn.Module | None = None,
    progress: bool = False,
) -> tuple[list[Row], torch.Tensor, torch.Tensor]:
    """Forward and backward over this process's micro-batches, gradients then summed across
    processes: (rows, totals over every process, rollouts with a non-finite token loss)."""
    device = next(model.parameters()).device
    groups = [batch.rollouts[r].task_id for r in batch.rollout_of_sample]
    rows = plan_rows(batch.samples, groups, config.layout, config.pack_length)
    chunks = _micro_batches(rows, config.micro_batch_size, is_sharded(model))
    model.train()
    totals = torch.zeros(
        7, dtype=torch.float64
    )  # loss, clipped weight, entropy sum, kl sum, generated, processed, real
    at_fault = torch.zeros(len(batch.rollouts), dtype=torch.float64)  # rollouts with a non-finite token loss
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="update", unit="micro-batch", leave=False)
    for chunk in chunks:
        padding = chunk is None  # a sharded rank's extra pass: a real row, no weight, no metric
        chunk_rows = [min(rows, key=lambda row: row.length)] if chunk is None else chunk
        t = row_tensors(batch.samples, batch.token_weights, batch.advantages, chunk_rows, device)
        if padding:
            t["weights"] = torch.zeros_like(t["weights"])
        logprobs, entropy = scored_logprobs(model, t, with_entropy=True)
        # Reconstructed calls have no behaviour logprobs (NaN): treat them as on-policy.
        behaviour = torch.where(torch.isnan(t["behaviour"]), logprobs.detach(), t["behaviour"])
        old = behaviour
        if config.tis_cap is not None:
            with torch.no_grad():
                old = logprobs.detach()  # the trainer's own logprobs before this update
        token_loss, clipped = ppo_clip_token_loss(
            logprobs, old, t["advantages"], config.eps_low, config.eps_high, config.log_ratio_clamp, config.dual_clip
        )
        if config.tis_cap is not None:
            token_loss = token_loss * truncated_importance_weights(old, behaviour, config.tis_cap)
        kl = torch.zeros_like(logprobs)
        if config.kl_coef and reference_model is not None:
            with torch.no_grad():
                reference, _ = scored_logprobs(reference_model, t)
            kl = k3_kl(logprobs, reference, config.log_ratio_clamp)
            token_loss = token_loss + config.kl_coef * kl
        weights = t["weights"] * t["generated"]
        loss = weighted_loss(token_loss, weights)
        loss.backward()
        if padding:
            continue
        bad = ~torch.isfinite(token_loss.detach()) & (weights > 0)
        if bad.any():
            for sample in t["sample"][bad].unique().tolist():
                at_fault[batch.rollout_of_sample[sample]] = 1.0
        generated = t["generated"].float()
        totals += torch.tensor(
            [
                loss.item(),
                (weights * clipped).sum().item(),
                (entropy * generated).sum().item(),
                (kl.detach() * generated).sum().item(),
                generated.sum().item(),
                t["input_ids"].numel(),
                sum(row.length for row in chunk_rows),
            ],
            dtype=torch.float64,
        )
    if dist.is_available() and dist.is_initialized():
        for parameter in model.parameters() if not is_sharded(model) else ():  # FSDP has summed them
            if parameter.requires_grad:
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
                dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        dist.all_reduce(at_fault, op=dist.ReduceOp.SUM)
    return rows, totals, at_fault
