"""GPU training throughput and MFU for our update's forward/backward, standalone (torch and
transformers only, as on the lent H200): a random-init model of Qwen2.5-0.5B or -1.5B shape, bf16,
GRPO-like batches (prompts shared by groups of completions, laid out with shared prefixes as
trainer/lightning_otel/trainer/layout.py does), the same per-token weighted PPO loss.

    python bench/gpu_train.py --shape 0.5b --seconds 90
    python bench/gpu_train.py --shape tiny --device cpu --seconds 10      # a dry run here
    torchrun --nproc-per-node N bench/gpu_train.py --shape 1.5b --fsdp    # sharded, N GPUs

MFU = 6 * parameters * tokens/s / peak; tokens are the tokens actually computed (a shared prompt
once). Peak defaults to 790e12 (H200 bf16 dense, as measured for this workplace's device).

--fsdp: the trainer's own sharding (trainer/lightning_otel/trainer/sharding.py's shard_model, imported
from this checkout): float32 master weights, one fully_shard per decoder layer and one for the root,
bf16 compute with float32 gradient reduction (mixed_precision "auto" on CUDA), AdamW on the shards.
Every rank runs its own micro-batch (data parallel, as update.py splits rows): tokens/s is the sum
over ranks, MFU is per GPU (divided by N), peak memory is the largest rank's. On one GPU it is
still FSDP2 (a mesh of one), so the float32 master weights and the bf16 compute copies show in
its peak memory beside the plain bf16 run's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

SHAPES = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
}


def grouped_rows(groups: int, group_size: int, prompt: int, completion: int, vocab: int, device: str):
    """Rows of [prompt, completion_1 .. completion_G] with a block mask: each completion attends to the
    prompt and to itself; the first completion token is scored from the prompt's last position."""
    length = prompt + group_size * completion
    ids = torch.randint(3, vocab, (groups, length), device=device)
    positions = torch.cat([torch.arange(prompt)] + [torch.arange(prompt, prompt + completion)] * group_size).to(device)
    mask = torch.zeros(length, length, dtype=torch.bool, device=device)
    mask[:prompt, :prompt] = torch.tril(torch.ones(prompt, prompt, dtype=torch.bool, device=device))
    source = torch.arange(-1, length - 1, device=device)
    for g in range(group_size):
        a = prompt + g * completion
        mask[a : a + completion, :prompt] = True
        mask[a : a + completion, a : a + completion] = torch.tril(
            torch.ones(completion, completion, dtype=torch.bool, device=device)
        )
        source[a] = prompt - 1
    generated = torch.zeros(length, dtype=torch.bool, device=device)
    generated[prompt:] = True
    return (
        ids,
        positions.expand(groups, -1),
        mask.expand(groups, 1, -1, -1),
        source.clamp(min=0).expand(groups, -1),
        generated,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="0.5b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--groups", type=int, default=8, help="rows per micro-batch (one task group each)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--completion", type=int, default=512)
    parser.add_argument("--peak", type=float, default=790e12)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--fsdp", action="store_true", help="shard with FSDP2 across torchrun's ranks")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    world, rank = 1, 0
    if args.fsdp:
        dist.init_process_group("nccl" if cuda else "gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
        if cuda:
            args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            torch.cuda.set_device(args.device)
        torch.manual_seed(rank)  # each rank its own rows, as the trainer splits a batch
    # Sharded: float32 master weights, bf16 compute through FSDP's mixed precision (as the trainer).
    dtype = torch.bfloat16 if cuda and not args.fsdp else torch.float32
    config = Qwen2Config(
        **SHAPES[args.shape],
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        torch_dtype=dtype,
    )
    model = Qwen2ForCausalLM(config).to(args.device, dtype)
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    params = sum(p.numel() for p in model.parameters())
    if args.fsdp:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "trainer"))
        from lightning_otel.trainer.sharding import shard_model

        model = shard_model(model, torch.device(args.device), "auto")
    # Fused AdamW on DTensor shards depends on the torch version; foreach is the default either way.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda and not args.fsdp)
    ids, positions, mask, source, generated = grouped_rows(
        args.groups, args.group_size, args.prompt, args.completion, config.vocab_size, args.device
    )
    behaviour = torch.full(ids.shape, -1.0, device=args.device)
    advantages = torch.randn(args.groups, 1, device=args.device).expand(-1, ids.shape[1])
    weights = generated.float() / (args.groups * args.group_size * args.completion)
    tokens_per_step = ids.numel()

    def step() -> None:
        logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False).logits
        scoring = torch.log_softmax(logits.float().gather(1, source[:, :, None].expand(-1, -1, logits.size(-1))), -1)
        logprobs = scoring.gather(-1, ids[:, :, None]).squeeze(-1)
        ratio = torch.exp(logprobs - behaviour)
        loss = (-torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.28) * advantages) * weights).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # the timed steps' peak, AdamW's state allocated by now
    steps, begin = 0, time.perf_counter()
    # Ranks must run the same number of steps (each is a collective): rank 0's clock decides.
    while not _stop(time.perf_counter() - begin >= args.seconds, args.fsdp):
        step()
        steps += 1
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - begin
    tokens_per_s = world * steps * tokens_per_step / elapsed
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    if args.fsdp:
        peaks = [None] * world
        dist.all_gather_object(peaks, peak)
        peak = max(peaks) if cuda else None
    result = {
        "shape": args.shape,
        "sharding": f"fsdp x {world}" if args.fsdp else "none",
        "parameters": params,
        "tokens_per_step": world * tokens_per_step,
        "steps": steps,
        "tokens_per_s": tokens_per_s,
        "mfu": 6 * params * tokens_per_s / (args.peak * world),
        "peak_memory_gib": peak,  # per GPU (sharded: the largest rank's)
    }
    if rank == 0:
        print(json.dumps(result))
    if args.fsdp:
        dist.destroy_process_group()


def _stop(done: bool, sharded: bool) -> bool:
    """Whether to stop timing; sharded, rank 0's answer on every rank."""
    if not sharded:
        return done
    flag = torch.tensor([int(done)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.broadcast(flag, src=0)
    return bool(flag.item())


if __name__ == "__main__":
    main()
