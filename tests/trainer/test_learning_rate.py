"""The RL step's learning rate: a linear warm-up, and the configured rate used even after an
optimizer state saved with another rate is loaded (torch restores a saved state's rate with it)."""

from __future__ import annotations

import torch

from lightning_otel.trainer.merge import LLMCall
from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
from lightning_otel.trainer.update import UpdateConfig, learning_rate_at


def test_the_warm_up_rises_linearly_then_holds():
    config = UpdateConfig(learning_rate=0.4, warmup_steps=4)
    assert [learning_rate_at(step, config) for step in range(6)] == [0.1, 0.2, 0.30000000000000004, 0.4, 0.4, 0.4]
    assert [learning_rate_at(step, UpdateConfig(learning_rate=0.4)) for step in range(3)] == [0.4] * 3


def _selection() -> Selection:
    calls = [[[LLMCall(f"c{i}", [5, 6, 7, 8], [40 + i, 41, 42], [-6.0, -6.0, -6.0])]] for i in range(4)]
    rewards = [1.0, 0.0, 1.0, 0.0]
    return Selection([RolloutRecord(f"r{i}", f"t{i // 2}", rewards[i], calls[i]) for i in range(4)], {})


def test_the_first_step_moves_weights_by_the_warmed_up_rate_and_a_loaded_state_keeps_the_configured_one(
    tiny_model_dir, tmp_path
):
    from lightning_otel.trainer.policy import PolicyTrainer

    config = UpdateConfig(learning_rate=1e-2, warmup_steps=4)
    first = PolicyTrainer(tiny_model_dir, tmp_path / "a", config)
    before = {name: p.detach().clone() for name, p in first.model.named_parameters()}
    first.train_on(_selection())
    # AdamW's first step moves each weight with a gradient well above eps by the rate itself
    moved = max((p.detach() - before[name]).abs().max().item() for name, p in first.model.named_parameters())
    assert abs(moved - 1e-2 / 4) < 1e-2 / 40
    saved = first.optimizer.state_dict()
    resumed = PolicyTrainer(tiny_model_dir, tmp_path / "b", UpdateConfig(learning_rate=3e-3))
    resumed.optimizer.load_state_dict(saved)
    assert resumed.optimizer.param_groups[0]["lr"] == 1e-2 / 4  # what torch restored
    resumed.version = 1
    resumed.train_on(_selection())
    assert resumed.optimizer.param_groups[0]["lr"] == 3e-3
    assert torch.isfinite(next(resumed.model.parameters())).all()
