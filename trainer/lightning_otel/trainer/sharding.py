"""Sharded full fine-tuning on torch's own engine: FSDP2 (`torch.distributed.fsdp.fully_shard`).

With `[update] sharding = "fsdp"` under torchrun, each of N ranks holds 1/N of every parameter, of
its gradient and of AdamW's two moments (dim-0 shards, as DTensors). One `fully_shard` per decoder
layer and one for the root (embeddings, final norm, LM head): a layer's full weights exist only
while it runs (all-gathered for its forward and again for its backward), and its gradients are
reduce-scattered as its backward ends.

The update stays update.py's data-parallel one: every row's token weights are fixed for the whole
batch, so the batch gradient is the SUM of the ranks' gradients. FSDP averages by default; here the
divide factor is 1 and the reduction a plain sum. An FSDP forward is a collective, so every rank
runs the same number of forward/backward passes (update.py pads with zero-weight micro-batches) and
whatever runs the model (the logprob probe, the reference model for the KL term) runs on every rank.

Mixed precision ("auto" on GPU, or "bfloat16"): layers compute in bfloat16 from the master weights
(the loaded dtype: keep `[model] dtype = "float32"`), gradients are reduced and kept in float32.

Checkpoints: the full model is gathered to rank 0's CPU and written as a Hugging Face safetensors
folder (what vLLM loads); AdamW's state is written sharded with torch.distributed.checkpoint (each
rank its shard, in parallel), and a later run with any number of ranks reads it back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

SHARDINGS = ("none", "fsdp")
MIXED_PRECISION = ("auto", "bfloat16", "none")
SHARDED_OPTIMIZER = "optimizer"  # the checkpoint's folder of AdamW shards (unsharded runs: optimizer.pt)


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly sharded) tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def check_options(sharding: str, mixed_precision: str) -> None:
    if sharding not in SHARDINGS:
        raise ValueError(f"[update] sharding must be one of {SHARDINGS}, not {sharding!r}")
    if mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"[update] mixed_precision must be one of {MIXED_PRECISION}, not {mixed_precision!r}")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the classes transformers marks as never to be split across devices."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules): cannot shard it")
    return layers


def shard_model(model: torch.nn.Module, device: torch.device, mixed_precision: str = "auto") -> torch.nn.Module:
    """Shard `model` (in place) across the default process group; its parameters move to `device`."""
    if not dist.is_initialized():
        raise ValueError(
            "[update] sharding = 'fsdp' shares the model across processes: launch with torchrun "
            "(torchrun --nproc-per-node N -m lightning_otel train ...)"
        )
    from torch.distributed.device_mesh import init_device_mesh

    bf16 = mixed_precision == "bfloat16" or (mixed_precision == "auto" and device.type == "cuda")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    options: dict[str, Any] = {"mesh": mesh, **({"mp_policy": policy} if policy else {})}
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # The update's weights are global (1 / (R * T_r) over the whole batch): sum, never average.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of parameters holding a NaN or an infinity; sharded: the same answer on every rank."""
    named = list(model.named_parameters())
    flags = torch.tensor([not bool(torch.isfinite(local(p)).all()) for _, p in named], dtype=torch.int32)
    if is_sharded(model):
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [name for (name, _), bad in zip(named, flags.tolist(), strict=True) if bad]


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """Every rank calls it; rank 0 gets the whole model's tensors on CPU, the others an empty dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every rank writes its shard of AdamW's state into `folder` (torch.distributed.checkpoint)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(folder))


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Path) -> None:
    """Restore the optimizer from a checkpoint written sharded (optimizer/) or not (optimizer.pt), into
    a sharded or an unsharded model: sharding may change between runs, and so may the number of ranks."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    if (checkpoint / SHARDED_OPTIMIZER).is_dir():
        import torch.distributed.checkpoint as dcp

        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the layout to read into
        dcp.load(state, checkpoint_id=str(checkpoint / SHARDED_OPTIMIZER))
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
        return
    saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    if not is_sharded(model):
        optimizer.load_state_dict(saved)
        return
    # optimizer.pt numbers the parameters in model order: name them, and each rank keeps its shard.
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    by_name: dict[str, Any] = {
        "state": {names[index]: value for index, value in saved["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in saved["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def local_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (sharded: its shards only)."""
    params = list(model.parameters())
    state = [v for p in params for v in optimizer.state.get(p, {}).values() if torch.is_tensor(v) and v.dim() > 0]
    grads = [p.grad for p in params if p.grad is not None]
    return {"parameters": _bytes(params), "gradients": _bytes(grads), "optimizer": _bytes(state)}


def _bytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors)
