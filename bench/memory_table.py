"""Per-GPU memory of the trainer's weights, gradients and optimizer state, from bytes per parameter:
prints the Markdown table in docs/deployment.md (so its figures can be checked and recomputed).

    python bench/memory_table.py [--lora-rank 16] [--gpu-gib 80]

Parameter counts are exact for the Qwen2.5 shapes below (their published config.json: hidden size,
layers, MLP width, attention heads, KV heads, vocabulary, tied embeddings), computed the way
transformers' Qwen2 builds its modules. No torch, no download: arithmetic only.

Assumptions, per parameter (state bytes; ACTIVATIONS ARE EXCLUDED, they depend on batch and length):
- full fine-tuning: 2 (bf16 compute weights) + 4 (fp32 master weights) + 4 (fp32 gradients)
  + 8 (AdamW's two fp32 moments) = 18 bytes. Conservative by up to 2 bytes: the unsharded trainer
  keeps no bf16 copy ([model] dtype = "float32": 16 bytes) and FSDP2 makes one only for the layers
  it has gathered.
- LoRA: the frozen base in bf16 ([model] dtype = "bfloat16"): 2 bytes, no gradient, no optimizer
  state; the adapters (rank r on q, k, v, o, gate, up, down of every layer) at 16 bytes (fp32
  weights, gradients, two AdamW moments).
- sharding = "none": data parallel, every GPU holds everything, whatever the number of GPUs.
- sharding = "fsdp": every GPU holds 1/N of the 18 bytes, plus what FSDP2 holds gathered at once:
  the root module (embeddings, LM head, final norm: not resharded between forward and backward) and
  two decoder layers (the running one and the prefetched one) in bf16, and the largest unsharded
  fp32 gradient before its reduce-scatter (the root's or one layer's).
- LoRA with FSDP: the trainer refuses it (sharding.py), so the table says so.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GIB = 1024**3
FULL_BYTES = 2 + 4 + 4 + 8  # bf16 weights + fp32 master + fp32 gradient + AdamW exp_avg, exp_avg_sq
ADAPTER_BYTES = 4 + 4 + 8  # fp32 adapter weights + gradients + AdamW moments
FROZEN_BYTES = 2  # LoRA's base in bf16


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        attention = (h * h + h) + 2 * (h * kv + kv) + h * h  # q, k, v with biases; o without
        return attention + 3 * h * self.intermediate + 2 * h  # gate, up, down; two RMSNorms

    @property
    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden  # embeddings, LM head, norm

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def lora_params(self, rank: int) -> int:
        h, kv, m = self.hidden, self.kv_dim, self.intermediate
        per_layer = rank * ((h + h) + 2 * (h + kv) + (h + h) + 2 * (h + m) + (m + h))  # A (in x r) + B (r x out)
        return self.layers * per_layer


SHAPES = [  # Qwen2.5-{0.5,1.5,7,14,32,72}B config.json
    Shape("0.5B", 896, 24, 4864, 14, 2, 151936, True),
    Shape("1.5B", 1536, 28, 8960, 12, 2, 151936, True),
    Shape("7B", 3584, 28, 18944, 28, 4, 152064, False),
    Shape("14B", 5120, 48, 13824, 40, 8, 152064, False),
    Shape("32B", 5120, 64, 27648, 40, 8, 152064, False),
    Shape("72B", 8192, 80, 29568, 64, 8, 152064, False),
]
GPUS = (1, 8, 16)


def per_gpu_bytes(shape: Shape, method: str, sharding: str, gpus: int, lora_rank: int) -> int | None:
    """State bytes on each GPU; None where the trainer refuses the combination."""
    if method == "lora":
        if sharding == "fsdp":
            return None
        return FROZEN_BYTES * shape.params + ADAPTER_BYTES * shape.lora_params(lora_rank)
    if sharding == "none":
        return FULL_BYTES * shape.params
    gathered = 2 * (shape.root_params + 2 * shape.layer_params)  # bf16, in flight at once
    unsharded_grad = 4 * max(shape.root_params, shape.layer_params)  # fp32, before its reduce-scatter
    return -(-FULL_BYTES * shape.params // gpus) + gathered + unsharded_grad


def table(lora_rank: int, gpu_gib: float) -> str:
    header = ["model", "parameters", "method", "sharding", *(f"{n} GPU{'s' if n > 1 else ''}" for n in GPUS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for shape in SHAPES:
        for method in ("full", "lora"):
            for sharding in ("none", "fsdp"):
                cells = []
                for gpus in GPUS:
                    size = per_gpu_bytes(shape, method, sharding, gpus, lora_rank)
                    if size is None:
                        cells.append("refused")
                    else:
                        fits = size / GIB <= gpu_gib
                        cells.append(f"{size / GIB:,.1f}" + ("" if fits else " ✗"))
                label = f"LoRA r={lora_rank}" if method == "lora" else "full"
                lines.append(
                    f"| {shape.name} | {shape.params / 1e9:.2f} B | {label} | {sharding} | {' | '.join(cells)} |"
                )
    return "\n".join(lines)


def largest_full_fit(gpus: int, gpu_gib: float, reserve_gib: float = 0.0) -> tuple[Shape, float] | None:
    """The largest shape whose sharded full fine-tuning state fits with `reserve_gib` to spare, and
    the GiB left per GPU for activations, the CUDA context and the allocator's slack."""
    left = {s: gpu_gib - per_gpu_bytes(s, "full", "fsdp", gpus, 0) / GIB for s in SHAPES}
    fitting = [(s, spare) for s, spare in left.items() if spare >= reserve_gib]
    return max(fitting, key=lambda pair: pair[0].params) if fitting else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU, GiB (✗: more than this)")
    parser.add_argument(
        "--reserve-gib", type=float, default=10.0, help="left for activations etc. in the 'largest that fits' line"
    )
    args = parser.parse_args()
    print(
        f"GiB per GPU: weights, gradients, optimizer state (full: {FULL_BYTES} B/param; LoRA: {FROZEN_BYTES} "
        f"B/param frozen + {ADAPTER_BYTES} B/adapter param); activations excluded; ✗: over {args.gpu_gib:g} GiB.\n"
    )
    print(table(args.lora_rank, args.gpu_gib))
    print()
    for gpus in (8, 16):
        for reserve in (0.0, args.reserve_gib):
            fit = largest_full_fit(gpus, args.gpu_gib, reserve)
            if fit:
                shape, left = fit
                print(
                    f"Largest full fine-tuning on {gpus} x {args.gpu_gib:g} GiB (fsdp) with >= {reserve:g} GiB "
                    f"to spare: {shape.name} ({shape.params / 1e9:.2f} B parameters), {left:.1f} GiB per GPU "
                    "left for activations."
                )


if __name__ == "__main__":
    main()
