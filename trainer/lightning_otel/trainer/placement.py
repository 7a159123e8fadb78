"""Where the policy's tensors live, and everything that depends on it: the model (LoRA adapters
applied), the frozen reference for the KL term, AdamW, their checkpoint files, the finite check and
the probe's forward pass. PolicyTrainer holds one placement and never asks which kind it is.

Two kinds. `Placement`: this process holds the whole model on one device (under torchrun without
sharding every rank holds a copy and update.py sums the gradients; only rank 0 writes checkpoints).
`ShardedPlacement`: FSDP2 across the torchrun ranks (sharding.py holds the mechanics); every rank
holds a shard, so every rank takes part in the checkpoint, the finite check and the probe's forward,
and rank 0 (`lead`) alone writes the files that are not per-rank and renames the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from lightning_otel.trainer.checkpoints import CheckpointStore
from lightning_otel.trainer.hotswap import model_prompt_logprobs
from lightning_otel.trainer.sharding import (
    SHARDED_OPTIMIZER,
    check_options,
    full_state_dict,
    load_optimizer,
    non_finite_parameters,
    save_sharded_optimizer,
    shard_model,
)

ADAPTER_FILE = "adapter_model.safetensors"  # peft's name for a saved adapter's weights


class Placement:
    """The whole model in this process, on `device` (default: CUDA when there is one)."""

    sharded = False

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: torch.dtype,
        device: str | None,
        learning_rate: float,
        with_reference: bool,
        checkpointing: bool,
        lora=None,
    ) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # Any: a Hugging Face model (or its PEFT wrapper), whose methods torch's Module type does not know
        self.model: Any = self._place(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype))
        self.reference = None
        if with_reference:
            reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).requires_grad_(False)
            self.reference = self._place(reference).eval()
        if checkpointing:
            self.model.gradient_checkpointing_enable()  # type: ignore[operator]  # a transformers method torch.nn.Module does not declare
        if lora is not None:
            from peft import get_peft_model

            self.model = get_peft_model(self.model, lora)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=learning_rate, weight_decay=0.0)

    @property
    def lead(self) -> bool:
        """Whether this process writes the checkpoint files every placement shares (state, ids)."""
        return True

    def _place(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def share(self, value):
        """The lead's `value` on every process of the placement (here there is one)."""
        return value

    def commit(
        self, store: CheckpointStore, step: int, write_rest: Callable[[Path], None], adapter_only: bool = False
    ) -> Path:
        """Write this placement's files (weights, optimizer) and, on the lead, `write_rest(folder)`'s,
        into one folder committed through `store`; returns the committed folder."""

        def write(folder: Path) -> None:
            self.write_weights(folder, adapter_only)
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
            write_rest(folder)

        return store.commit(step, write)

    def write_weights(self, folder: Path, adapter_only: bool) -> None:
        """`model/` (LoRA merged in: a full-weight swap needs it) or, with `adapter_only`, `adapter/`."""
        if adapter_only:
            self.model.save_pretrained(folder / "adapter", safe_serialization=True)
            return
        model = self.model
        if hasattr(model, "merge_and_unload"):
            import copy

            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(folder / "model", safe_serialization=True)

    def restore(self, checkpoint: Path) -> None:
        """What a committed checkpoint holds beyond the weights loaded at construction: a LoRA model's
        adapter, and the optimizer state."""
        if hasattr(self.model, "peft_config"):  # LoRA: the base weights are the model's, the adapter the step's
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.model, load_file(str(checkpoint / "adapter" / ADAPTER_FILE)))
        self.load_optimizer(checkpoint)

    def load_optimizer(self, checkpoint: Path) -> None:
        """The optimizer state of a checkpoint written sharded or not (sharding.load_optimizer)."""
        load_optimizer(self.model, self.optimizer, checkpoint)

    def non_finite_parameters(self) -> list[str]:
        """Names of parameters holding a NaN or an infinity."""
        return non_finite_parameters(self.model)

    def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """The model's logprob of each token of `token_ids` given those before (the probe's reference)."""
        return model_prompt_logprobs(self.model, token_ids)


class ShardedPlacement(Placement):
    """FSDP2 shards across the torchrun ranks (sharding.py). The model is loaded on CPU and each rank
    moves only its shards to `device`. Every method is called on every rank: each is collective."""

    sharded = True

    def __init__(self, model_dir: str | Path, *, mixed_precision: str, **options) -> None:
        self.mixed_precision = mixed_precision
        super().__init__(model_dir, **options)

    @property
    def lead(self) -> bool:
        return dist.get_rank() == 0

    def _place(self, model: torch.nn.Module) -> torch.nn.Module:
        return shard_model(model, self.device, self.mixed_precision)

    def share(self, value):
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def commit(
        self, store: CheckpointStore, step: int, write_rest: Callable[[Path], None], adapter_only: bool = False
    ) -> Path:
        """Every rank writes into the lead's temporary folder: the weights gathered to the lead, each
        rank its optimizer shard; the lead alone renames it, once every rank's files are on disk, so
        the commit stays a single rename."""
        tmp = self.share(store.begin(step) if self.lead else None)
        weights = full_state_dict(self.model)  # every rank takes part; the lead gets the tensors
        if self.lead:
            self.model.save_pretrained(tmp / "model", state_dict=weights, safe_serialization=True)
        del weights
        save_sharded_optimizer(self.model, self.optimizer, tmp / SHARDED_OPTIMIZER)
        if self.lead:
            write_rest(tmp)
        dist.barrier()  # every rank's optimizer shard is on disk
        return self.share(store.finish(step, tmp) if self.lead else None)


def place_policy(
    model_dir: str | Path,
    *,
    sharding: str,
    mixed_precision: str,
    dtype: torch.dtype,
    device: str | None,
    learning_rate: float,
    with_reference: bool,
    checkpointing: bool,
    lora=None,
) -> Placement:
    """The placement `[update] sharding` asks for ("none" or "fsdp"), loaded from `model_dir`."""
    check_options(sharding, mixed_precision)
    options = dict(
        dtype=dtype,
        device=device,
        learning_rate=learning_rate,
        with_reference=with_reference,
        checkpointing=checkpointing,
        lora=lora,
    )
    if sharding != "fsdp":
        return Placement(model_dir, **options)
    if lora is not None:
        raise ValueError("[update] sharding = 'fsdp' trains full weights: LoRA with FSDP is not supported")
    return ShardedPlacement(model_dir, mixed_precision=mixed_precision, **options)
