"""A step refused for a non-finite gradient: find the rollouts at fault, exclude only those, train on
the rest.

The batch gradient is a sum of per-rollout terms, each with the weights and advantages fixed for the
whole batch (update.py), so the gradient of a subset of rollouts is the same sum restricted to their
samples. The search (adaptive group testing, a bisection):
  1. rollouts whose token losses were not finite (NonFiniteUpdate.traced) are at fault outright;
     if the rest's gradient is finite, they are all there is;
  2. otherwise the rest is split in halves and each half whose gradient is not finite is split
     again, down to single rollouts. If two halves are finite but their union is not (each term
     finite, only the sum overflows), the union is narrowed to a smallest part still not finite by
     dropping one rollout at a time (up to MINIMIZE_AT_MOST rollouts; a larger union is blamed
     whole: a sum overflowing float32 from finite terms each near the limit is rare).
Each level runs at most one batch worth of forward/backward passes (the halves tested are
disjoint), so one bad rollout among R costs about 2 batches more, not R.

Lockstep across torchrun ranks: every rank holds the same batch, tests the same subsets in the same
order, and acts on a verdict agreed by an all-reduce (update.gradient_check); under FSDP each test
pads to the same number of forward passes on every rank, like any update.

Then the batch is built again without the rollouts at fault (their rewards leave the group means,
their tokens the weights: as if they had been excluded at selection) and the step is retried; a
rollout at fault under the new batch is found the same way. Nothing at all to train on: the
NonFiniteUpdate names them all, and the caller commits nothing.

Who is blamed: the rollouts whose own gradient term is not finite. A reward that overflows the
advantages (possible only with [selection] max_abs_reward raised: 1e6 excludes it at selection)
shifts its whole group's mean, so its group-mates' advantages overflow too: each is blamed with it
when its tokens have a gradient, not when the PPO clip holds them all (then its term is 0). A
rollout whose tokens overflow the model (a numerics fault) is blamed alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightning_otel.trainer.config import UpdateConfig
from lightning_otel.trainer.rollout_data import Selection
from lightning_otel.trainer.update import (
    Batch,
    NonFiniteUpdate,
    UntrainableBatch,
    gradient_check,
    policy_update,
)

MINIMIZE_AT_MOST = 8  # a set non-finite only as a whole: narrowed down when this small, else blamed whole


def sub_batch(batch: Batch, rollouts: list[int]) -> Batch:
    """The samples of `rollouts` (indices into batch.rollouts), with the batch's own advantages and
    token weights: the batch gradient restricted to them."""
    chosen = set(rollouts)
    keep = [i for i, r in enumerate(batch.rollout_of_sample) if r in chosen]
    return Batch(
        [batch.samples[i] for i in keep],
        [batch.rollout_of_sample[i] for i in keep],
        batch.rollouts,
        [batch.advantages[i] for i in keep],
        [batch.token_weights[i] for i in keep],
    )


def rollouts_at_fault(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    config: UpdateConfig,
    refused: NonFiniteUpdate,
    reference_model: torch.nn.Module | None = None,
) -> dict[int, str]:
    """Index into batch.rollouts -> why, for the rollouts at fault in a batch policy_update refused
    (never empty). No step is taken; gradients are left cleared."""

    def check(subset: list[int]) -> tuple[float, float, bool]:
        return gradient_check(model, optimizer, sub_batch(batch, subset), config, reference_model)

    def search(subset: list[int], loss: float, norm: float) -> dict[int, str]:
        """The culprits in `subset`, whose gradient (loss, norm) is not finite."""
        if len(subset) == 1:
            return {subset[0]: f"{refused.reason}; on its own: loss {loss:.3g}, gradient norm {norm:.3g}"}
        found: dict[int, str] = {}
        for half in (subset[: len(subset) // 2], subset[len(subset) // 2 :]):
            half_loss, half_norm, finite = check(half)
            if not finite:
                found.update(search(half, half_loss, half_norm))
        if found:
            return found
        together = _minimal(subset, check) if len(subset) <= MINIMIZE_AT_MOST else subset
        why = (
            f"{refused.reason}; not finite only with {len(together) - 1} other rollout(s) "
            f"(loss {loss:.3g}, gradient norm {norm:.3g})"
        )
        return dict.fromkeys(together, why)

    present = sorted(set(batch.rollout_of_sample))  # rollouts left without a sample have no gradient
    traced = {i for i, r in enumerate(batch.rollouts) if refused.traced and r.rollout_id in refused.rollout_ids}
    culprits = {i: f"{refused.reason}; its token losses are not finite" for i in sorted(traced)}
    rest = [i for i in present if i not in traced]
    if not rest:
        return culprits
    if not traced:  # the refused batch is the rest
        return search(rest, refused.metrics.get("loss", float("nan")), refused.metrics.get("grad_norm", float("nan")))
    loss, norm, finite = check(rest)
    return culprits if finite else {**culprits, **search(rest, loss, norm)}


def _minimal(subset: list[int], check) -> list[int]:
    """A smallest part of `subset` (non-finite only as a whole) that is still not finite: each rollout
    whose absence keeps it so is dropped. |subset| checks, so only for small sets."""
    kept = list(subset)
    for index in subset:
        trial = [i for i in kept if i != index]
        if trial and not check(trial)[2]:
            kept = trial
    return kept


def update_isolating_faults(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    selection: Selection,
    build: Callable[[Selection], Batch],
    config: UpdateConfig,
    reference_model: torch.nn.Module | None = None,
    progress: bool = False,
) -> tuple[Selection, Batch, dict[str, float], dict[str, str]]:
    """One optimizer step on `selection` less the rollouts at fault: (the rollouts trained on, their
    batch, the step's metrics, rollout id -> reason for each rollout at fault). `build` makes a
    batch from a selection (update.build_batch with the run's settings). NonFiniteUpdate, naming
    only the rollouts at fault, when nothing is left to step on; UntrainableBatch as build raises it."""
    at_fault: dict[str, str] = {}
    while True:
        try:
            batch = build(selection)
        except UntrainableBatch as untrainable:
            if not at_fault:
                raise
            # What is left cannot train (every token masked, or stale): not their fault, back to the pool.
            first = next(iter(at_fault.values()))
            raise NonFiniteUpdate(first, list(at_fault), reasons=at_fault) from untrainable
        try:
            return selection, batch, policy_update(model, optimizer, batch, config, reference_model, progress), at_fault
        except NonFiniteUpdate as refused:
            found = rollouts_at_fault(model, optimizer, batch, config, refused, reference_model)
            at_fault.update({batch.rollouts[i].rollout_id: why for i, why in found.items()})
            selection = Selection([r for r in selection.rollouts if r.rollout_id not in at_fault], selection.excluded)
            if not selection.rollouts:
                raise NonFiniteUpdate(refused.reason, list(at_fault), refused.metrics, reasons=at_fault) from refused
