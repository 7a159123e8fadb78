"""Trainer: SQL-selected rollouts -> exact merged samples -> rollout-level GRPO update -> hot-swap."""

from lightning_otel.trainer.hotswap import SwapError, VLLMAdmin, hot_swap, probe_max_diff, validate_checkpoint
from lightning_otel.trainer.merge import LLMCall, Sample, merge_calls
from lightning_otel.trainer.objective import group_advantages, ppo_clip_token_loss, rollout_token_weights
from lightning_otel.trainer.policy import PolicyTrainer, StepResult
from lightning_otel.trainer.rollout_data import RolloutRecord, Selection, SelectionConfig, select_rollouts
from lightning_otel.trainer.update import Batch, UpdateConfig, build_batch, policy_update

__all__ = [
    "Batch", "LLMCall", "PolicyTrainer", "RolloutRecord", "Sample", "Selection", "SelectionConfig", "StepResult", "SwapError",
    "UpdateConfig", "VLLMAdmin", "build_batch", "validate_checkpoint", "group_advantages", "hot_swap", "merge_calls", "policy_update",
    "ppo_clip_token_loss", "probe_max_diff", "rollout_token_weights", "select_rollouts",
]  # fmt: skip
