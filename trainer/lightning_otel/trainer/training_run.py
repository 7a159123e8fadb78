"""One run of the scheduled training job: the training algorithm, stated once, in the order it runs.
objective.py holds the math (advantages, the clipped surrogate, the token weights).

 1. Select (rollout_data.py): SQL over the collector's `rollouts` view picks rewarded rollouts, quiet
    for `min_age_s`, not trained on or excluded before (a non-finite reward, or |reward| past
    `max_abs_reward`, excludes it); each is rebuilt from its span tree into chains of LLM calls that
    did not overlap in time.
 2. Build (update.build_batch): generated tokens whose behaviour logprob is NaN, infinite, below
    the floor or positive are masked (input_hygiene.py); each chain's calls merge into samples by the exact
    token-prefix rule (merge.py); GRPO advantage per rollout within its task; per-token weights
    1 / (R * T_r), fixed for the whole batch before it is cut into micro-batches or shared out.
 3. Update (update.policy_update): the PPO-clip surrogate against vLLM's behaviour logprobs,
    log-ratio clamped and dual-clipped; gradients accumulated over micro-batches (and summed across
    torchrun ranks); one AdamW step. When the loss or gradient norm is not finite, the rollouts at
    fault are found (fault_isolation.py) and the step is made without them.
 4. Checkpoint (checkpoints.py): model or adapter, optimizer, step and the rollout ids it trained on,
    renamed into place together: the commit of exactly-once.
 5. Swap (replicas.py): every replica (through the gateway when there is one) loads it, validated
    and finite, with rollback.
 6. Probe: each replica's logprobs on a fixed prompt must match the trainer's; else the servers go
    back to the previous checkpoint and this one is rejected (its rollouts return to the pool).

Around them: the lock, recovery of what a crash left, a catch-up swap when the servers do not serve
the latest commit, retention, and a report (train_step, merge and input diagnostic spans).
`on_stage(name)`, if given, is called as each stage ends.

The run talks to two objects, one call per stage: the PolicyTrainer (policy.py; where its tensors
live, one process or FSDP shards, is its placement.py placement's business) and the Replicas
(replicas.py: the servers, through the gateway or direct). Each gets its configuration sections once.

Poison is never committed: rollouts no run can train on go to the excluded ledger as soon as they
are found; when a step's loss or gradient is not finite, the rollouts at fault are found by
bisecting the batch (fault_isolation.py), excluded, and the step is made on the others; if none is
left the step is skipped (status "skipped: non-finite gradient"), nothing committed or swapped; a
step that left a non-finite weight fails the run before anything is committed; every swap path
refuses a checkpoint holding a NaN or an infinity.

Under torchrun (WORLD_SIZE > 1) every rank loads the model and takes part in the update; rank 0
alone holds the lock, selects (and broadcasts the selection), checkpoints, swaps and reports. With
`[update] sharding = "fsdp"` (sharding.py) each rank holds a shard of the model, so every rank also
takes part in the checkpoint (weights gathered to rank 0, optimizer shards written by each; rank 0
alone renames) and in the probe's forward pass; rank 0 alone swaps and compares.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lightning_otel.collector import connect
from lightning_otel.collector.query import retry_vanished_files
from lightning_otel.core import schema
from lightning_otel.trainer.checkpoints import CheckpointStore, JobFailed, run_lock
from lightning_otel.trainer.config import TrainConfig
from lightning_otel.trainer.diagnostics import InputRecord, diagnose, input_records, publish, publish_inputs
from lightning_otel.trainer.policy import PolicyTrainer, StepResult, policy_tokenizer
from lightning_otel.trainer.replicas import Replicas
from lightning_otel.trainer.rollout_data import Selection, SelectionConfig, exclusion_cause, select_rollouts
from lightning_otel.trainer.run_summary import RunSummary, Stages
from lightning_otel.trainer.selection_window import from_epoch_us, next_watermark, to_epoch_us, window
from lightning_otel.trainer.update import NonFiniteUpdate, UntrainableBatch


def run_once(config: TrainConfig, progress: bool = False, on_stage: Callable[[str], None] | None = None) -> RunSummary:
    """One scheduled run; `progress` prints stages and a micro-batch progress bar on stderr."""
    rank, device = _distributed(sharded=_check_options(config))
    lead = rank == 0
    progress = progress and lead
    state_dir = Path(config.checkpoints.dir)
    summary = RunSummary("nothing to do")
    stages = Stages(summary, progress, on_stage)
    with run_lock(state_dir) if lead else contextlib.nullcontext():
        store = CheckpointStore(state_dir)
        replicas = Replicas(config.server, config.model, lead)
        with stages("load model"):
            if lead:
                store.recover()
            latest = _everyone(rank, store.latest())
            previous = store.committed()[-2] if lead and len(store.committed()) > 1 else None
            trainer = PolicyTrainer.resume(config.model, config.update, state_dir, latest, device)
        if replicas.behind(latest, trainer):  # a crash after a commit, before its swap
            with stages("catch-up swap"):
                replicas.swap_in(trainer, latest, rollback=previous)
        if lead:
            store.retire(config.checkpoints.keep)  # also finishes what a crash after a swap left undone

        selection, selected, inputs = None, None, []
        if lead:
            with stages("select rollouts"):
                selected = select_in_window(config, store)
            selection = selected.selection
            inputs = _exclude_for_good(store, selection)
        selection = _everyone(rank, selection)
        summary.excluded = dict(selection.excluded)
        summary.eval_rollouts = selected.evaluations if selected is not None else 0
        if len(selection.rollouts) < config.selection.min_rollouts:
            if selected is not None:
                store.save_watermark(selected.watermark_after(config, trained=False))
                if inputs:
                    _report(config, inputs)
            return summary

        try:
            with stages("update"):
                result = trainer.train_on(selection, config.selection.max_staleness, progress=progress)
        except UntrainableBatch as failed:  # nothing stepped: exclude the rollouts at fault, commit nothing
            summary.status = f"skipped: {failed.headline}"
            inputs = _exclude_at_fault(store if lead else None, summary, failed.cause, failed.reasons, inputs)
            if lead:
                _report(config, inputs)
            return summary
        # The step trained on the others: those at fault are excluded for good, before the commit.
        inputs = _exclude_at_fault(store if lead else None, summary, NonFiniteUpdate.cause, result.at_fault, inputs)
        if not lead and not trainer.sharded:
            dist.barrier()  # wait for rank 0's checkpoint and swap, so torchrun reports one outcome
            summary.status = "trained (worker)"
            return summary
        try:  # sharded, every rank takes part: the weights are gathered, the optimizer written by all
            with stages("checkpoint"):
                rollout_ids = [r.rollout_id for r in result.selection.rollouts]
                starts = [r.start_us for r in result.selection.rollouts]
                checkpoint = trainer.commit(store, rollout_ids, config.model.lora_rank > 0, starts)
            try:
                with stages("swap + probe"):
                    swap_seconds = replicas.swap_in(trainer, checkpoint, rollback=latest)
            except Exception as failure:
                if not lead:
                    raise
                store.reject(checkpoint)  # forget this step: its rollouts return to the pool
                raise replicas.roll_back(str(trainer.version), latest, failure) from failure
        except JobFailed:
            if inputs:  # what this run excluded is in the ledger: say so in SQL too
                _report(config, inputs)
            raise
        finally:
            if dist.is_initialized():
                dist.barrier()
        if not lead:
            summary.status = "trained (worker)"
            return summary
        store.retire(config.checkpoints.keep)
        if selected is not None:
            store.save_watermark(selected.watermark_after(config, trained=True))
        _report(config, inputs, (trainer, result, swap_seconds))
        summary.status, summary.step, summary.version = "trained", trainer.version, str(trainer.version)
        summary.rollouts, summary.samples = len(result.selection.rollouts), len(result.batch.samples)
        summary.samples_histogram = result.batch.samples_per_rollout_histogram()
        summary.mean_reward, summary.loss = result.mean_reward, result.metrics["loss"]
        summary.swap_seconds = swap_seconds
        return summary


def _check_options(config: TrainConfig) -> bool:
    """ValueError for option combinations no path implements; returns whether the model is sharded."""
    if config.server.weight_push not in ("files", "nccl"):
        raise ValueError(f"[server] weight_push must be 'files' or 'nccl', not {config.server.weight_push!r}")
    if config.server.weight_push == "nccl" and (config.server.gateway or config.model.lora_rank):
        raise ValueError(
            "[server] weight_push = 'nccl' pushes full weights to the replicas directly: no gateway, no LoRA"
        )
    sharded = config.update.sharding == "fsdp"
    if sharded and (config.model.lora_rank or config.server.weight_push != "files"):
        raise ValueError(
            "[update] sharding = 'fsdp' trains full weights and swaps them as files: not with [model] lora_rank "
            "or [server] weight_push = 'nccl'"
        )
    return sharded


def _distributed(sharded: bool = False) -> tuple[int, str | None]:
    """Join torchrun's process group when there is one: (rank, device). Sharded, a single torchrun
    rank joins one too (FSDP needs a process group)."""
    torchrun = "MASTER_ADDR" in os.environ and "RANK" in os.environ
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 and not (sharded and torchrun):
        return 0, None
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if not torch.cuda.is_available():
        return dist.get_rank(), "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)  # NCCL's and FSDP's current device
    return dist.get_rank(), f"cuda:{local_rank}"


def _everyone(rank: int, value):
    """Rank 0's value on every rank (identity without a process group)."""
    if not dist.is_initialized():
        return value
    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@dataclass
class SelectedRollouts:
    """What step 1 found, and what the watermark needs from it (selection_window.py)."""

    selection: Selection
    began: datetime  # the selection's "now": the completeness cutoff is min_age_s before it
    oldest_open: datetime | None  # the start of the oldest rollout in the window not complete yet
    evaluations: int = 0  # evaluation rollouts in the window: never candidates

    def watermark_after(self, config: TrainConfig, trained: bool) -> datetime:
        selection, section = self.selection, config.selection
        if not trained:  # they were selected and wait for a later run
            held = from_epoch_us(selection.oldest_start_us)
        elif len(selection.rollouts) + len(selection.excluded) >= section.max_rollouts:
            held = from_epoch_us(selection.newest_start_us)  # max_rollouts cut it: later ones not considered
        else:
            held = None
        return next_watermark(self.began, section.min_age_s, self.oldest_open, held)


def select_in_window(config: TrainConfig, store: CheckpointStore) -> SelectedRollouts:
    """Step 1: the rewarded rollouts quiet for `min_age_s` that no committed step trained on and no
    run excluded, among those that started inside the window behind the watermark."""
    section, began = config.selection, datetime.now(UTC)
    span = window(store.watermark(), section.lookback_s, section.max_rollout_s, section.backfill)
    cutoff = (began - timedelta(seconds=section.min_age_s)).isoformat()
    untrainable = store.untrainable_ids(None if span.select_from is None else to_epoch_us(span.select_from))
    wanted = SelectionConfig(
        where=f"({section.where}) AND end_time < TIMESTAMPTZ '{cutoff}'",
        since=None if span.select_from is None else span.select_from.isoformat(),
        reward=section.reward,
        limit=section.max_rollouts,
        exclude="lightning_trained",
        only_rewarded=True,
        allow_reconstructed=section.allow_reconstructed,
        max_abs_reward=section.max_abs_reward,
        tokenizer=policy_tokenizer(config.model.base) if section.allow_reconstructed else None,
    )
    in_window = "" if span.select_from is None else f" AND start_time >= TIMESTAMPTZ '{wanted.since}'"

    def run() -> SelectedRollouts:  # the window's files are listed at connect: a vanished one, listed again
        conn = connect(config.store.data_dir, since=span.read_from)
        conn.register("lightning_trained", untrainable)
        selection = select_rollouts(conn, config=wanted)
        evaluation = f"split = '{schema.SPLIT_EVAL}'"
        oldest_open, evaluations = conn.execute(
            f"SELECT min(start_time) FILTER (WHERE end_time >= TIMESTAMPTZ '{cutoff}' AND NOT {evaluation}),"
            f" count(*) FILTER (WHERE {evaluation}) FROM rollouts WHERE start_time IS NOT NULL{in_window}"
        ).fetchall()[0]
        return SelectedRollouts(selection, began, oldest_open, evaluations)

    return retry_vanished_files(run)


def _exclude_for_good(store: CheckpointStore, selection: Selection) -> list[InputRecord]:
    """Selection's exclusions into the excluded ledger, so no later run selects them again (a missing
    reward may still come: not those); returns their input diagnostics."""
    exclusions = {
        rid: (exclusion_cause(reason), reason)
        for rid, reason in selection.excluded.items()
        if exclusion_cause(reason) != "no_reward"
    }
    store.exclude(exclusions)
    return input_records([], exclusions)


def _exclude_at_fault(
    store: CheckpointStore | None, summary: RunSummary, cause: str, reasons: dict[str, str], inputs: list
) -> list[InputRecord]:
    """Rollouts at fault (id -> reason) into the summary and, on rank 0 (`store`), the excluded
    ledger; returns `inputs` with their input diagnostics added."""
    summary.at_fault = list(reasons)
    summary.excluded.update(reasons)
    if store is None or not reasons:
        return inputs
    exclusions = {rid: (cause, reason) for rid, reason in reasons.items()}
    store.exclude(exclusions)
    return inputs + input_records([], exclusions)


def _report(
    config: TrainConfig, inputs: list[InputRecord], step: tuple[PolicyTrainer, StepResult, float] | None = None
) -> None:
    """The input diagnostics, and for a committed step (trainer, result, swap seconds) a train_step
    span and the merge diagnostics, into the same store as the traces."""
    from lightning_otel.core.otlp import server_tracer_provider

    provider = server_tracer_provider("lightning-trainer", config.store.otlp_endpoint)
    tracer = provider.get_tracer("lightning_otel.trainer")
    publish_inputs(inputs, tracer)
    if step is not None:
        _report_step(tracer, config, *step)
    provider.shutdown()


def _report_step(tracer, config: TrainConfig, trainer: PolicyTrainer, result: StepResult, swap_seconds: float) -> None:
    # The tokenizer lets the diagnosis name text-level causes (retokenized, completion_rewritten).
    records = diagnose(result.batch, policy_tokenizer(config.model.base))
    metrics = result.metrics
    attributes = {
        schema.TRAIN_STEP: trainer.version,
        schema.TRAIN_VERSION: str(trainer.version),
        schema.TRAIN_ROLLOUTS: len(result.selection.rollouts),
        schema.TRAIN_SAMPLES: len(result.batch.samples),
        schema.TRAIN_MEAN_REWARD: result.mean_reward,
        schema.TRAIN_LOSS: metrics["loss"],
        schema.TRAIN_CLIP_FRACTION: metrics["clip_fraction"],
        schema.TRAIN_ENTROPY: metrics["entropy"],
        schema.TRAIN_KL: metrics["kl"],
        schema.TRAIN_GRAD_NORM: metrics["grad_norm"],
        schema.TRAIN_SWAP_SECONDS: swap_seconds,
        schema.TRAIN_MERGE_RATE: sum(r.merged for r in records) / len(records) if records else 1.0,
        schema.TRAIN_SAMPLES_PER_ROLLOUT: result.batch.samples_per_rollout_histogram(),
        schema.TRAIN_MASKED_CALLS: len(result.batch.masked_calls),
        schema.TRAIN_MASKED_TOKENS: sum(m.tokens for m in result.batch.masked_calls),
    }
    tracer.start_span(schema.SPAN_TRAIN_STEP, attributes=attributes).end()
    publish(records, tracer)
    publish_inputs(input_records(result.batch.masked_calls, {}), tracer)
