"""The trainable policy: the model (full weights, or LoRA adapters), its optimizer, an optional frozen
reference for the KL term, and its checkpoints. Where those tensors live (one process, or FSDP shards
across torchrun ranks) is one placement.py object's business; here is what the policy does with them.
`train_on` is one update (training_run.py's steps 2-3: build the batch, the objective's loss, one
optimizer step); the algorithm is stated once, in training_run.py (the run) and objective.py (the math)."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lightning_otel.trainer.checkpoints import CheckpointStore, JobFailed, checkpoint_version
from lightning_otel.trainer.config import ModelSection
from lightning_otel.trainer.fault_isolation import update_isolating_faults
from lightning_otel.trainer.hotswap import SwapReport, VLLMAdmin, hot_swap
from lightning_otel.trainer.placement import Placement, place_policy
from lightning_otel.trainer.rollout_data import Selection, SelectionConfig, select_rollouts
from lightning_otel.trainer.update import Batch, UpdateConfig, build_batch, learning_rate_at


@dataclass
class StepResult:
    selection: Selection  # the rollouts the step trained on (those at fault left out)
    batch: Batch
    metrics: dict[str, float]
    at_fault: dict[str, str] = field(default_factory=dict)  # rollout id -> why its gradient was not finite

    @property
    def mean_reward(self) -> float:
        rewards = [r.reward for r in self.selection.rollouts]
        return sum(rewards) / len(rewards) if rewards else float("nan")


class PolicyTrainer:
    """The trainable model (full weights, or LoRA adapters with `lora`), its optimizer, an optional
    frozen reference for the KL term (all three held by a placement.py placement: one process, or FSDP
    shards); checkpoints go to a CheckpointStore under `workdir`."""

    def __init__(
        self,
        model_dir: str | Path,
        workdir: str | Path,
        config: UpdateConfig | None = None,
        keep: int = 2,
        lora=None,
        dtype: torch.dtype = torch.float32,
        device: str | None = None,
        gradient_checkpointing: bool = False,
    ):
        self.config = config or UpdateConfig()
        self.placement: Placement = place_policy(
            model_dir,
            sharding=self.config.sharding,
            mixed_precision=self.config.mixed_precision,
            dtype=dtype,
            device=device,
            learning_rate=self.config.learning_rate,
            with_reference=bool(self.config.kl_coef),
            checkpointing=gradient_checkpointing or self.config.activation_checkpointing,
            lora=lora,
        )
        self.store = CheckpointStore(Path(workdir))
        self.keep = keep
        self.version = 0
        self.serving_dir = Path(model_dir)  # the weights the server serves now: the rollback target

    @classmethod
    def resume(
        cls, model: ModelSection, update: UpdateConfig, workdir: str | Path, latest: Path | None, device: str | None
    ) -> PolicyTrainer:
        """The scheduled job's trainer: `[model]`'s base weights, or those of the `latest` committed
        checkpoint with its optimizer and step. Refuses a model holding a NaN or an infinity: every loss
        would be NaN and every batch excluded as "at fault"."""
        lora = None
        if model.lora_rank:
            from peft import LoraConfig

            lora = LoraConfig(
                r=model.lora_rank,
                lora_alpha=model.lora_alpha,
                init_lora_weights=True,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            )
        # LoRA checkpoints hold the adapter only: the base weights are always [model] base's.
        model_dir = latest / "model" if latest is not None and not model.lora_rank else Path(model.base)
        trainer = cls(model_dir, workdir, update, lora=lora, device=device, dtype=getattr(torch, model.dtype))
        if latest is not None:
            trainer.placement.restore(latest)
            trainer.version = int(checkpoint_version(latest))
        if trainer.non_finite_parameters():
            raise JobFailed(f"the model loaded from {latest or model_dir} holds non-finite weights")
        return trainer

    @property
    def sharded(self) -> bool:
        return self.placement.sharded

    @property
    def model(self) -> torch.nn.Module:
        return self.placement.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.placement.optimizer

    @property
    def reference(self) -> torch.nn.Module | None:
        return self.placement.reference

    @reference.setter
    def reference(self, model: torch.nn.Module | None) -> None:
        """Another frozen reference than the starting weights (placed as the policy is)."""
        self.placement.reference = model

    def step(
        self,
        conn: duckdb.DuckDBPyConnection,
        where: str = "true",
        selection_config: SelectionConfig | None = None,
        max_staleness: int | None = None,
    ) -> StepResult:
        selection = select_rollouts(conn, where, selection_config)
        if not selection.rollouts:
            raise ValueError(f"no trainable rollouts for WHERE {where!r}; excluded: {selection.excluded}")
        return self.train_on(selection, max_staleness)

    def train_on(self, selection: Selection, max_staleness: int | None = None, progress: bool = False) -> StepResult:
        """Steps 3-5 on rollouts already selected (e.g. built in memory). Rollouts whose gradient is not
        finite are left out (fault_isolation.py) and named in `StepResult.at_fault`; NonFiniteUpdate
        when that leaves nothing, UntrainableBatch when no token can train."""
        # Set every step: a checkpoint's optimizer state carries the learning rate it was saved with.
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate_at(self.version, self.config)

        def build(chosen: Selection) -> Batch:
            return build_batch(chosen, max_staleness=max_staleness, current_version=self.version, config=self.config)

        trained, batch, metrics, at_fault = update_isolating_faults(
            self.model, self.optimizer, selection, build, self.config, self.reference, progress
        )
        self.version += 1
        return StepResult(trained, batch, metrics, at_fault)

    def commit(
        self,
        store: CheckpointStore,
        rollout_ids: list[str] | None = None,
        adapter_only: bool = False,
        rollout_starts_us: list[int | None] | None = None,
    ) -> Path:
        """Commit this version's checkpoint through `store`; returns the committed folder. It holds
        `model/` (LoRA merged in) or, with `adapter_only`, `adapter/` (for LoRA swaps); the optimizer;
        `state.json`; `rollouts.parquet` (the rollouts this step trained on, with their start times:
        the ledger's window): renamed into place together, the commit of exactly-once. Sharded, every
        rank calls it.

        Weights holding a NaN or an infinity are never committed (JobFailed): with finite gradients
        that is the configuration's doing (an overflowing step), not the rollouts'."""
        poisoned = self.non_finite_parameters()
        if poisoned:
            raise JobFailed(
                f"the step left non-finite weights in {len(poisoned)} tensor(s), e.g. {poisoned[0]}: "
                "nothing committed or swapped (check [update] learning_rate and [model] dtype)"
            )
        ids = list(rollout_ids or [])
        starts = list(rollout_starts_us) if rollout_starts_us is not None else [None] * len(ids)

        def write_state(folder: Path) -> None:
            ledger = pa.table({"rollout_id": pa.array(ids, pa.string()), "start_us": pa.array(starts, pa.int64())})
            pq.write_table(ledger, folder / "rollouts.parquet")
            state = {"step": self.version, "version": str(self.version), "rollouts": len(ids), "created": time.time()}
            (folder / "state.json").write_text(json.dumps(state))

        return self.placement.commit(store, self.version, write_state, adapter_only)

    def load_optimizer(self, checkpoint: Path) -> None:
        """The optimizer state of a committed checkpoint, sharded or not."""
        self.placement.load_optimizer(checkpoint)

    def non_finite_parameters(self) -> list[str]:
        """Names of parameters holding a NaN or an infinity (sharded: every rank calls it)."""
        return self.placement.non_finite_parameters()

    def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """The model's logprobs on `token_ids` (a probe's reference; sharded: every rank calls it)."""
        return self.placement.prompt_logprobs(token_ids)

    def share(self, value):
        """Rank 0's `value` on every rank that holds part of the model (unsharded: `value`)."""
        return self.placement.share(value)

    def save_weights(self) -> Path:
        """Commit the current weights as this version's checkpoint (keeping the newest `keep`); returns
        its model folder, which vLLM loads. Sharded, every rank calls it."""
        checkpoint = self.commit(self.store)
        if self.placement.lead:
            self.store.retire(self.keep)
        return checkpoint / "model"

    def swap_into(self, admin: VLLMAdmin) -> SwapReport:
        """Save the current weights and hot-swap them in as version str(self.version)."""
        weights = self.save_weights()
        report = hot_swap(admin, weights, version=str(self.version), rollback_dir=self.serving_dir)
        self.serving_dir = weights
        return report


@functools.lru_cache(maxsize=1)
def policy_tokenizer(model_dir: str):
    """The policy's tokenizer, loaded once per process (the probe, selection's rebuilt calls and the
    merge diagnosis share it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
