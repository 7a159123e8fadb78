"""Sharded (FSDP2, 2 gloo ranks under torchrun) against unsharded (1 process) full fine-tuning on
CPU, the same batch: tokens/s and what each process holds (bytes of its parameter, gradient and
AdamW shards; peak and final RSS).

    python bench/fsdp_cpu.py [--steps 3] [--prompts 16]

Runs the trainer's own PolicyTrainer.train_on (update.py, sharding.py), not a model of it: the
unsharded side in one process with 2 threads, the sharded side as `torchrun --nproc-per-node 2`
with 1 thread per rank, so both use the machine's 2 cores. A ~28M-parameter Qwen2-shaped model
(hidden 512, 8 layers, vocab 512), PROMPTS prompts x 4 completions (trl_throughput.py's lengths),
shared-prefix rows, float32. Tokens/s counts every sample's real tokens per optimizer step, after
one untimed warm-up step.

On CPU with gloo, sharding costs time (each layer's weights are all-gathered for its forward and
again for its backward, its gradients reduce-scattered, through loopback TCP): the point of the
sharded run is the bytes each rank holds, not speed. Peak RSS includes loading the full model
before it is sharded (every rank loads all weights, then keeps its shard) and torch's own runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GENERATIONS = 4  # completions per prompt, as in trl_throughput.py (prompts 32-128 tokens, completions 16-128)
SHAPE = dict(hidden_size=512, layers=8, heads=8, kv_heads=8, intermediate_size=1536)


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(model_dir: Path, sharding: str, steps: int, prompts: int, out: Path) -> None:
    """One process's run (rank r of a torchrun when sharded); writes its JSON line to out/rank-r.json."""
    import torch
    import torch.distributed as dist

    from lightning_otel.trainer.merge import LLMCall
    from lightning_otel.trainer.policy import PolicyTrainer
    from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
    from lightning_otel.trainer.sharding import local_bytes
    from lightning_otel.trainer.update import UpdateConfig

    if sharding == "fsdp":
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng = np.random.default_rng(0)  # the same batch in every process
    rollouts = []
    for p in range(prompts):
        prompt = rng.integers(3, 500, rng.integers(32, 129)).tolist()
        for g in range(GENERATIONS):
            completion = rng.integers(3, 500, rng.integers(16, 129)).tolist()
            call = LLMCall(f"{p}-{g}", prompt, completion, (-3 * rng.random(len(completion))).tolist())
            rollouts.append(RolloutRecord(f"{p}-{g}", f"task-{p}", float(rng.random()), chains=[[call]]))
    selection = Selection(rollouts, {})
    config = UpdateConfig(learning_rate=1e-5, sharding=sharding, micro_batch_size=4)
    trainer = PolicyTrainer(model_dir, out / f"state-{sharding}-{rank}", config, device="cpu", dtype=torch.float32)
    result = trainer.train_on(selection)  # warm-up: AdamW's state is allocated here
    times = []
    for _ in range(steps):
        if dist.is_initialized():
            dist.barrier()  # time the step, not a rank's wait for the other to arrive
        began = time.perf_counter()
        result = trainer.train_on(selection)
        times.append(time.perf_counter() - began)
    real_tokens = sum(len(s.token_ids) for s in result.batch.samples)
    record = {
        "sharding": sharding,
        "rank": rank,
        "world": dist.get_world_size() if dist.is_initialized() else 1,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),  # DTensor.numel(): the full size
        "real_tokens": real_tokens,
        "step_seconds": times,
        "tokens_per_s": real_tokens * len(times) / sum(times),
        "bytes": local_bytes(trainer.model, trainer.optimizer),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "final_rss_bytes": current_rss_bytes(),
        "loss": result.metrics["loss"],
    }
    (out / f"{sharding}-rank-{rank}.json").write_text(json.dumps(record))
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(model_dir: Path, sharding: str, args, out: Path) -> list[dict]:
    this = [str(Path(__file__).resolve()), "--worker", sharding, "--model", str(model_dir), "--out", str(out)]
    this += ["--steps", str(args.steps), "--prompts", str(args.prompts)]
    env = dict(os.environ)
    if sharding == "fsdp":
        env["OMP_NUM_THREADS"] = "1"
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        command += ["--master-port", str(free_port()), *this]
    else:
        env["OMP_NUM_THREADS"] = "2"
        command = [sys.executable, *this]
    subprocess.run(command, check=True, env=env, timeout=1200)
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{sharding}-rank-*.json"))]


def mib(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--worker", choices=("none", "fsdp"), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model, args.worker, args.steps, args.prompts, args.out)
        return
    from transformers.utils import logging as transformers_logging

    from lightning_otel.testing.tiny_model import build_tiny_model

    transformers_logging.disable_progress_bar()
    out = Path(tempfile.mkdtemp(prefix="fsdp-cpu-"))
    model_dir = build_tiny_model(out / "model", **SHAPE)
    rows = [*launch(model_dir, "none", args, out), *launch(model_dir, "fsdp", args, out)]
    first = rows[0]
    print(
        f"model: {first['parameters'] / 1e6:.1f}M parameters (float32); batch: {args.prompts} prompts x 4 "
        f"completions, {first['real_tokens']:,} real tokens; {args.steps} timed steps after a warm-up\n"
    )
    print(
        "| run | rank | tokens/s | step s | parameters MiB | gradients MiB | AdamW MiB | peak RSS MiB | final RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        label = "1 process, unsharded" if r["sharding"] == "none" else f"{r['world']} gloo ranks, fsdp"
        held = r["bytes"]
        print(
            f"| {label} | {r['rank']} | {r['tokens_per_s']:,.0f} | {sum(r['step_seconds']) / len(r['step_seconds']):.2f} "
            f"| {mib(held['parameters'])} | {mib(held['gradients'])} | {mib(held['optimizer'])} "
            f"| {mib(r['peak_rss_bytes'])} | {mib(r['final_rss_bytes'])} |"
        )
    losses = {r["sharding"]: r["loss"] for r in rows}
    print(f"\nloss after the last step: unsharded {losses['none']:.6g}, fsdp {losses['fsdp']:.6g}")


if __name__ == "__main__":
    main()
