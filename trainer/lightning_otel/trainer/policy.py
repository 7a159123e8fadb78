"""The trainable policy: the model (full weights, or LoRA adapters), its optimizer, an optional frozen
reference for the KL term, and its checkpoints. `train_on` is one update (training_run.py's steps
3-5: build the batch, the objective's loss, one optimizer step); the algorithm is stated once, in
training_run.py (the run) and objective.py (the math)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from lightning_otel.trainer.checkpoints import CheckpointStore
from lightning_otel.trainer.fault_isolation import update_isolating_faults
from lightning_otel.trainer.hotswap import SwapReport, VLLMAdmin, hot_swap
from lightning_otel.trainer.rollout_data import Selection, SelectionConfig, select_rollouts
from lightning_otel.trainer.sharding import (
    SHARDED_OPTIMIZER,
    check_options,
    full_state_dict,
    load_optimizer,
    non_finite_parameters,
    save_sharded_optimizer,
    shard_model,
)
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
    frozen reference for the KL term; checkpoints go to a CheckpointStore under `workdir`."""

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
        check_options(self.config.sharding, self.config.mixed_precision)
        self.sharded = self.config.sharding == "fsdp"
        if self.sharded and lora is not None:
            raise ValueError("[update] sharding = 'fsdp' trains full weights: LoRA with FSDP is not supported")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # Sharded, the model is loaded on CPU and each rank moves only its shards to the device.
        self.model = self._place(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype), device)
        self.reference = None
        if self.config.kl_coef:
            reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).requires_grad_(False)
            self.reference = self._place(reference, device).eval()
        if gradient_checkpointing or self.config.activation_checkpointing:
            self.model.gradient_checkpointing_enable()
        if lora is not None:
            from peft import get_peft_model

            self.model = get_peft_model(self.model, lora)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=self.config.learning_rate, weight_decay=0.0)
        self.store = CheckpointStore(Path(workdir))
        self.keep = keep
        self.version = 0
        self.serving_dir = Path(model_dir)  # the weights the server serves now: the rollback target

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

    def _place(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        return shard_model(model, device, self.config.mixed_precision) if self.sharded else model.to(device)

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

    def write_checkpoint(self, folder: Path, rollout_ids: list[str] | None = None, adapter_only: bool = False) -> None:
        """One checkpoint's files: `model/` (LoRA merged in) or, with `adapter_only`, `adapter/` (for
        LoRA swaps); `optimizer.pt`; `state.json`; `rollouts.parquet` (the rollouts this step trained on).
        Sharded, every rank calls it (sharding.py): rank 0 writes `model/` from the gathered weights,
        every rank its part of `optimizer/`, rank 0 the rest."""
        if self.sharded:
            weights = full_state_dict(self.model)  # every rank takes part; rank 0 gets the tensors
            if dist.get_rank() == 0:
                self.model.save_pretrained(folder / "model", state_dict=weights, safe_serialization=True)
            del weights
            save_sharded_optimizer(self.model, self.optimizer, folder / SHARDED_OPTIMIZER)
            if dist.get_rank() == 0:
                self._write_state(folder, rollout_ids)
            return
        if adapter_only:
            self.model.save_pretrained(folder / "adapter", safe_serialization=True)
        else:
            model = self.model
            if hasattr(model, "merge_and_unload"):  # LoRA: a full-weight swap needs the merged weights
                import copy

                model = copy.deepcopy(model).merge_and_unload()
            model.save_pretrained(folder / "model", safe_serialization=True)
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
        self._write_state(folder, rollout_ids)

    def _write_state(self, folder: Path, rollout_ids: list[str] | None) -> None:
        ids = list(rollout_ids or [])
        pq.write_table(pa.table({"rollout_id": pa.array(ids, pa.string())}), folder / "rollouts.parquet")
        state = {"step": self.version, "version": str(self.version), "rollouts": len(ids), "created": time.time()}
        (folder / "state.json").write_text(json.dumps(state))

    def commit(self, store: CheckpointStore, rollout_ids: list[str] | None = None, adapter_only: bool = False) -> Path:
        """Write this version's checkpoint and commit it through `store`; returns the committed folder.
        Sharded, every rank calls it: all write into rank 0's temporary folder, rank 0 alone renames it
        (once every rank's files are written), so the commit stays a single rename."""
        if not self.sharded:
            return store.commit(self.version, lambda tmp: self.write_checkpoint(tmp, rollout_ids, adapter_only))
        lead = dist.get_rank() == 0
        tmp = _from_rank0(store.begin(self.version) if lead else None)
        self.write_checkpoint(tmp, rollout_ids, adapter_only)
        dist.barrier()  # every rank's optimizer shard is on disk
        return _from_rank0(store.finish(self.version, tmp) if lead else None)

    def load_optimizer(self, checkpoint: Path) -> None:
        """The optimizer state of a committed checkpoint, sharded or not (sharding.load_optimizer)."""
        load_optimizer(self.model, self.optimizer, checkpoint)

    def non_finite_parameters(self) -> list[str]:
        """Names of parameters holding a NaN or an infinity (sharded: every rank calls it)."""
        return non_finite_parameters(self.model)

    def save_weights(self) -> Path:
        """Commit the current weights as this version's checkpoint (keeping the newest `keep`); returns
        its model folder, which vLLM loads. Sharded, every rank calls it."""
        checkpoint = self.commit(self.store)
        if not self.sharded or dist.get_rank() == 0:
            self.store.retire(self.keep)
        return checkpoint / "model"

    def swap_into(self, admin: VLLMAdmin) -> SwapReport:
        """Save the current weights and hot-swap them in as version str(self.version)."""
        weights = self.save_weights()
        report = hot_swap(admin, weights, version=str(self.version), rollback_dir=self.serving_dir)
        self.serving_dir = weights
        return report


def _from_rank0(value):
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
