"""One RL step on stored traces, read top to bottom.

Algorithm (what runs, exactly):
 1. Select rollouts by SQL over the collector's `rollouts` view (`where`); rebuild each from
    its span tree; order its LLM calls causally (rollout_data.py).
 2. Merge each rollout's calls into samples by the exact token-prefix rule; a failed prefix
    check starts a new sample; only generated tokens carry loss (merge.py).
 3. GRPO advantage per *rollout*, normalized within its task id; every sample and token of a
    rollout shares it (objective.group_advantages).
 4. PPO-clip surrogate against the behaviour logprobs vLLM returned at sampling time, with
    rollout-level token-mean normalization: each rollout weighs 1/R whatever its number of
    samples (objective.rollout_token_weights).
 5. One AdamW step (gradient accumulated over micro-batches; grad-norm clipped).
 6. Save the weights and hot-swap them into vLLM, validated, with rollback (hotswap.py).

How it departs from textbook GRPO: advantages and normalization are per rollout, not per
sample (a rollout split into 3 samples weighs the same as one kept whole); the ratio's
denominator is the sampler's own logprob (no recomputation), so off-policy drift between
vLLM and the trainer is corrected by the ratio; no KL term; one gradient step per batch.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import duckdb
import torch
from transformers import AutoModelForCausalLM

from lightning_otel.trainer.hotswap import SwapReport, VLLMAdmin, hot_swap
from lightning_otel.trainer.rollout_data import Selection, SelectionConfig, select_rollouts
from lightning_otel.trainer.update import Batch, UpdateConfig, build_batch, policy_update


@dataclass
class StepResult:
    selection: Selection
    batch: Batch
    metrics: dict[str, float]

    @property
    def mean_reward(self) -> float:
        rewards = [r.reward for r in self.selection.rollouts]
        return sum(rewards) / len(rewards) if rewards else float("nan")


class PolicyTrainer:
    """The trainable model (full weights, or LoRA adapters with `lora`), its optimizer, an optional
    frozen reference for the KL term, and where its weight versions are saved."""

    def __init__(
        self,
        model_dir: str | Path,
        workdir: str | Path,
        config: UpdateConfig | None = None,
        keep: int = 2,
        lora=None,
        dtype: torch.dtype = torch.float32,
        device: str | None = None,  # noqa: ANN001
        gradient_checkpointing: bool = False,
    ):
        self.config = config or UpdateConfig()
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        self.reference = None
        if self.config.kl_coef:
            self.reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
            self.reference.requires_grad_(False)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        if lora is not None:
            from peft import get_peft_model

            self.model = get_peft_model(self.model, lora)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=self.config.learning_rate, weight_decay=0.0)
        self.weights_root = Path(workdir) / "weights"
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

    def train_on(self, selection: Selection, max_staleness: int | None = None, progress: bool = False) -> StepResult:
        """Steps 3-5 on rollouts already selected (e.g. built in memory)."""
        batch = build_batch(selection, max_staleness=max_staleness, current_version=self.version, config=self.config)
        metrics = policy_update(self.model, self.optimizer, batch, self.config, self.reference, progress=progress)
        self.version += 1
        return StepResult(selection, batch, metrics)

    def save_weights(self) -> Path:
        """Write the current weights as `weights/v<version>` (safetensors + config); keep the newest few."""
        out = self.weights_root / f"v{self.version}"
        model = self.model
        if hasattr(model, "merge_and_unload"):  # LoRA: a full-weight swap needs the merged weights
            import copy

            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(out, safe_serialization=True)
        old = sorted(self.weights_root.glob("v*"), key=lambda p: int(p.name[1:]))[: -self.keep]
        for path in old:
            if path != self.serving_dir:
                shutil.rmtree(path, ignore_errors=True)
        return out

    def swap_into(self, admin: VLLMAdmin) -> SwapReport:
        """Save the current weights and hot-swap them in as version str(self.version)."""
        weights = self.save_weights()
        report = hot_swap(admin, weights, version=str(self.version), rollback_dir=self.serving_dir)
        self.serving_dir = weights
        return report
