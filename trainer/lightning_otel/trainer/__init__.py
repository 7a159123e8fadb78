"""Trainer: SQL-selected rollouts -> exact merged samples -> rollout-level GRPO update -> hot-swap.

Names load lazily, so `lightning_otel.trainer.config` (and the CLI's --help) works without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SwapError": "hotswap",
    "VLLMAdmin": "hotswap",
    "hot_swap": "hotswap",
    "probe_max_diff": "hotswap",
    "validate_checkpoint": "hotswap",
    "LLMCall": "merge",
    "Sample": "merge",
    "merge_calls": "merge",
    "group_advantages": "objective",
    "ppo_clip_token_loss": "objective",
    "rollout_token_weights": "objective",
    "token_weights": "objective",
    "PolicyTrainer": "policy",
    "StepResult": "policy",
    "RolloutRecord": "rollout_data",
    "Selection": "rollout_data",
    "SelectionConfig": "rollout_data",
    "select_rollouts": "rollout_data",
    "Batch": "update",
    "build_batch": "update",
    "policy_update": "update",
    "UpdateConfig": "config",
    "TrainConfig": "config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"lightning_otel.trainer.{_EXPORTS[name]}"), name)
