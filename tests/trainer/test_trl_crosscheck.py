"""Our sample-level, batch token-mean and fixed-length normalizations against TRL GRPOTrainer's
`grpo`, `dapo` and `dr_grpo` losses: TRL's own `_compute_loss` runs on the same logits, masks, old
logprobs and advantages; losses and gradients (w.r.t. the logits) agree within 1e-6."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from lightning_otel.trainer.objective import ppo_clip_token_loss, token_weights, weighted_loss

B, PROMPT, COMPLETION, VOCAB, MAX_COMPLETION = 4, 3, 6, 11, 8


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def _inputs(seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, COMPLETION, VOCAB, generator=generator, dtype=torch.float64).requires_grad_()
    completion_ids = torch.randint(0, VOCAB, (B, COMPLETION), generator=generator)
    lengths = torch.tensor([6, 3, 5, 1])
    mask = (torch.arange(COMPLETION)[None] < lengths[:, None]).long()
    with torch.no_grad():
        current = selective_log_softmax(logits, completion_ids)
    old = current + 0.3 * torch.randn(B, COMPLETION, generator=generator, dtype=torch.float64)  # ratios off 1: clipping
    advantages = torch.tensor([1.5, -0.5, 0.8, -1.2], dtype=torch.float64)
    return logits, completion_ids, mask, old, advantages


def _trl_loss(loss_type: str, logits, completion_ids, mask, old, advantages):
    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return selective_log_softmax(logits, completion_ids), entropy_from_logits(logits), None

    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=per_token_logps_and_entropies,
        top_entropy_quantile=1.0,
        aux_loss_enabled=False,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        args=SimpleNamespace(delta=None, steps_per_generation=1),
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_COMPLETION,
        accelerator=_Accelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _entropy_bonus_enabled=False,
        use_adaptive_entropy=False,
        _step=0,
    )
    inputs = {
        "prompt_ids": torch.zeros(B, PROMPT, dtype=torch.long),
        "prompt_mask": torch.ones(B, PROMPT, dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    return GRPOTrainer._compute_loss(trainer, None, inputs)


@pytest.mark.parametrize("ours,trls", [("sample", "grpo"), ("batch_token", "dapo"), ("fixed_length", "dr_grpo")])
def test_our_normalizations_equal_trl_losses_and_gradients(ours, trls):
    for seed in range(3):
        logits, completion_ids, mask, old, advantages = _inputs(seed)
        trl_loss = _trl_loss(trls, logits, completion_ids, mask, old, advantages)
        (trl_grad,) = torch.autograd.grad(trl_loss, logits)

        logprobs = selective_log_softmax(logits, completion_ids)
        token_loss, _ = ppo_clip_token_loss(logprobs, old, advantages[:, None], eps_low=0.2, eps_high=0.28)
        weights = torch.tensor(
            [w.tolist() for w in token_weights(mask.tolist(), list(range(B)), ours, fixed_length=MAX_COMPLETION)],
            dtype=torch.float64,
        )
        our_loss = weighted_loss(token_loss, weights)
        (our_grad,) = torch.autograd.grad(our_loss, logits)
        assert our_loss.item() == pytest.approx(trl_loss.item(), abs=1e-6)
        assert torch.allclose(our_grad, trl_grad, atol=1e-6)
        assert our_grad.abs().sum() > 0
