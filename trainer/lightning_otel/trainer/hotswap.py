"""Hot-swap from the trainer's side, for library use (PolicyTrainer.swap_into, a probe of one server):
the swap itself is lightning_otel.core.vllm_admin's, re-exported here; what needs the trainer's model
is here: does the server compute what the trainer computes? The scheduled run's servers (gateway or
direct, full weights or LoRA, catch-up, probe, rollback) are one replicas.Replicas object."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_otel.core.vllm_admin import (
    SwapError,
    SwapReport,
    VLLMAdmin,
    hot_swap,
    validate_checkpoint,
)

__all__ = [
    "SwapError",
    "SwapReport",
    "VLLMAdmin",
    "hot_swap",
    "model_prompt_logprobs",
    "probe_max_diff",
    "served_max_diff",
    "validate_checkpoint",
]


@torch.no_grad()
def model_prompt_logprobs(model: torch.nn.Module, token_ids: Sequence[int]) -> list[float]:
    """The trainer model's logprob of each token given the ones before (from position 1)."""
    model.eval()
    device = next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], device=device)
    logprobs = torch.log_softmax(model(input_ids=ids, use_cache=False).logits.float()[0, :-1], dim=-1)
    return logprobs.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()


def probe_max_diff(admin: VLLMAdmin, served_model: str, model: torch.nn.Module, token_ids: Sequence[int]) -> float:
    """Largest |server - trainer| logprob difference on a probe sequence."""
    return served_max_diff(admin, served_model, token_ids, model_prompt_logprobs(model, token_ids))


def served_max_diff(admin: VLLMAdmin, served_model: str, token_ids: Sequence[int], expected: Sequence[float]) -> float:
    """Largest |server - expected| logprob difference, `expected` being the trainer's
    model_prompt_logprobs (computed beforehand: a sharded model computes it on every rank)."""
    served = admin.prompt_logprobs(served_model, token_ids)
    return max(abs(a - b) for a, b in zip(served, expected, strict=True))
