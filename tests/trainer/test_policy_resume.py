"""The scheduled job's trainer from a committed checkpoint (PolicyTrainer.resume and its placement): a
resumed trainer computes what the committed one computed and carries its optimizer state and step,
for full weights and for LoRA (where the checkpoint holds the adapter only); weights holding a NaN or
an infinity are never committed."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_otel.trainer.checkpoints import CheckpointStore, JobFailed
from lightning_otel.trainer.config import ModelSection
from lightning_otel.trainer.merge import LLMCall
from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
from lightning_otel.trainer.update import UpdateConfig

PROBE = [1, 20, 30, 40, 50, 60]


def _selection() -> Selection:
    calls = [[[LLMCall(f"c{i}", [5, 6, 7, 8], [40 + i, 41, 42], [-6.0, -6.0, -6.0])]] for i in range(4)]
    rewards = [1.0, 0.0, 1.0, 0.0]
    return Selection([RolloutRecord(f"r{i}", f"t{i // 2}", rewards[i], calls[i]) for i in range(4)], {})


def _moments(trainer) -> list[torch.Tensor]:
    """AdamW's first moments in parameter order (what a resumed step continues from)."""
    state = trainer.optimizer.state_dict()["state"]
    return [state[index]["exp_avg"] for index in sorted(state)]


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_resumed_trainer_computes_what_the_committed_one_did_with_its_optimizer_and_step(
    tiny_model_dir, tmp_path, lora_rank
):
    from lightning_otel.trainer.policy import PolicyTrainer

    model = ModelSection(base=str(tiny_model_dir), lora_rank=lora_rank)
    update = UpdateConfig(learning_rate=1e-2)
    store = CheckpointStore(tmp_path / "state")
    trained = PolicyTrainer.resume(model, update, tmp_path / "state", None, "cpu")
    base = trained.prompt_logprobs(PROBE)
    result = trained.train_on(_selection())
    checkpoint = trained.commit(store, [r.rollout_id for r in result.selection.rollouts], adapter_only=lora_rank > 0)
    assert (checkpoint / ("adapter" if lora_rank else "model")).is_dir()

    resumed = PolicyTrainer.resume(model, update, tmp_path / "state", checkpoint, "cpu")
    after = trained.prompt_logprobs(PROBE)
    assert max(abs(a - b) for a, b in zip(after, base)) > 1e-4  # the step moved the model: a real check
    assert resumed.prompt_logprobs(PROBE) == pytest.approx(after, abs=1e-6)
    assert resumed.version == 1
    saved, loaded = _moments(trained), _moments(resumed)
    assert len(saved) == len(loaded) > 0 and any(m.abs().max() > 0 for m in saved)
    for a, b in zip(saved, loaded):
        assert torch.equal(a, b)


def test_weights_holding_a_nan_are_never_committed_and_a_model_loaded_with_one_is_refused(tiny_model_dir, tmp_path):
    from lightning_otel.trainer.policy import PolicyTrainer

    store = CheckpointStore(tmp_path / "state")
    trainer = PolicyTrainer(tiny_model_dir, tmp_path / "state")
    trainer.version = 1
    checkpoint = trainer.commit(store, ["clean"])
    name, parameter = next(iter(trainer.model.named_parameters()))
    with torch.no_grad():
        parameter.view(-1)[3] = math.nan
    trainer.version = 2
    with pytest.raises(JobFailed, match=f"non-finite weights in 1 tensor.*{name}.*nothing committed"):
        trainer.commit(store, ["poisoned"])
    assert store.committed() == [checkpoint]  # and no half-written folder left behind
    assert not list(store.checkpoints.glob(".tmp-*"))

    trainer.placement.write_weights(tmp_path / "poisoned", adapter_only=False)  # as a crash could leave it
    model = ModelSection(base=str(tmp_path / "poisoned" / "model"))
    with pytest.raises(JobFailed, match="holds non-finite weights"):
        PolicyTrainer.resume(model, UpdateConfig(), tmp_path / "other", None, "cpu")
