"""Hot-swap from the trainer's side: the swap itself is lightning_otel.core.vllm_admin's (direct) or the
gateway's (coordinated: no failed request, exact versions); here the run's configuration picks the
path (`swap_to`), reads what the replicas serve (`served_versions`), and checks what needs the
trainer's model: does the server now compute what the trainer computes (`probe`)?"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import torch

from lightning_otel.core.gateway_client import GatewayAdminClient
from lightning_otel.core.vllm_admin import (
    SwapError,
    SwapReport,
    VLLMAdmin,
    hot_swap,
    require_finite,
    server_root,
    validate_checkpoint,
)
from lightning_otel.trainer.checkpoints import JobFailed
from lightning_otel.trainer.config import TrainConfig

__all__ = [
    "SwapError",
    "SwapReport",
    "VLLMAdmin",
    "hot_swap",
    "model_prompt_logprobs",
    "probe",
    "probe_max_diff",
    "served_max_diff",
    "served_name",
    "served_versions",
    "swap_to",
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


def served_name(config: TrainConfig, version: str) -> str:
    return (
        f"{config.model.served_model_name}@{version}"
        if config.model.lora_rank and version != "0"
        else config.model.served_model_name
    )


def served_versions(config: TrainConfig) -> set[str | None]:
    """The versions the replicas serve now (full weights: vLLM's weight version; LoRA: the adapters loaded)."""
    if config.model.lora_rank:
        versions = set()
        for replica in config.server.replicas:
            with urllib.request.urlopen(server_root(replica) + "/v1/models", timeout=30) as reply:
                names = [m["id"] for m in json.loads(reply.read())["data"]]
            prefix = config.model.served_model_name + "@"
            loaded = [n[len(prefix) :] for n in names if n.startswith(prefix)]
            versions.add(max(loaded, key=int) if loaded else "0")
        return versions
    return {VLLMAdmin(replica).weight_version() for replica in config.server.replicas}


def swap_to(config: TrainConfig, weights: Path, version: str, rollback: Path) -> float:
    """Swap every replica to `weights` (through the gateway when there is one); returns seconds."""
    began = time.perf_counter()
    if config.server.gateway:
        gateway = GatewayAdminClient(config.server.gateway, config.server.admin_token)
        if config.model.lora_rank:
            gateway.swap_lora(weights, version, config.model.served_model_name)
        else:
            gateway.swap_full(weights, version, rollback)
    else:
        if config.model.lora_rank:
            require_finite(weights)  # hot_swap checks full weights; an adapter is checked here
        for replica in config.server.replicas:
            admin = VLLMAdmin(replica)
            if config.model.lora_rank:
                admin.load_lora(served_name(config, version), weights)
            else:
                hot_swap(admin, weights, version, rollback)
    return time.perf_counter() - began


def probe(config: TrainConfig, ids: Sequence[int], expected: Sequence[float], version: str) -> None:
    """Each replica's logprobs on the probe prompt `ids` must match the trainer's `expected`."""
    for replica in config.server.replicas:
        diff = served_max_diff(VLLMAdmin(replica), served_name(config, version), ids, expected)
        if not diff <= config.server.probe_tolerance:
            raise JobFailed(f"{replica} serves logprobs {diff:.2e} away from the trainer's for version {version}")
