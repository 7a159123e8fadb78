"""Training throughput on CPU: our update against TRL GRPOTrainer on the same samples.

    python bench/trl_throughput.py --steps 3

A ~6M-parameter Qwen2-shaped model (hidden 256, 6 layers, vocab 512), 64 prompts x 4 completions
per step (prompts 32-128 tokens, completions 16-128), the same token ids, logprobs and rewards for
both: TRL gets them from an offline `rollout_func`. Reports real tokens/s per optimizer
step (the tokens of every sample's sequence, as TRL counts them, divided by the step's time) for each
of our row layouts, and their padding fraction (shared prefixes are computed once, so that layout
processes fewer tokens than it is credited with: that is its point).

Both sides are timed alike: a step starts from the stored samples, so it includes building the batch
(ours: `build_batch` -- merge, advantages, weights -- then `policy_update`, which lays out rows; TRL:
its whole optimizer step, `rollout_func`, padding and rewards included). The first step of each is a
warm-up and not timed. TRL's padding share is what its model is fed: masked positions / positions,
over every forward pass.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PROMPTS, GENERATIONS, MAX_COMPLETION = 64, 4, 128


def make_samples(seed: int = 0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 500, rng.integers(32, 129)).tolist() for _ in range(PROMPTS)]
    completions = [
        [rng.integers(3, 500, rng.integers(16, MAX_COMPLETION + 1)).tolist() for _ in range(GENERATIONS)]
        for _ in prompts
    ]
    logprobs = [[(-rng.random(len(c)) * 3).tolist() for c in group] for group in completions]
    rewards = rng.random((PROMPTS, GENERATIONS)).tolist()
    return prompts, completions, logprobs, rewards


def ours(model_dir: Path, steps: int, layout: str) -> tuple[float, float]:
    from transformers import AutoModelForCausalLM

    from lightning_otel.trainer.merge import LLMCall
    from lightning_otel.trainer.rollout_data import RolloutRecord, Selection
    from lightning_otel.trainer.update import UpdateConfig, build_batch, policy_update

    prompts, completions, logprobs, rewards = make_samples()
    rollouts = [
        RolloutRecord(
            f"{p}-{g}",
            f"task-{p}",
            rewards[p][g],
            chains=[[LLMCall(f"{p}-{g}", prompts[p], completions[p][g], logprobs[p][g])]],
        )
        for p in range(PROMPTS)
        for g in range(GENERATIONS)
    ]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = UpdateConfig(learning_rate=1e-5, layout=layout, pack_length=512 if layout == "packed" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    policy_update(model, optimizer, build_batch(Selection(rollouts, {}), config=config), config)  # warm-up
    begin = time.perf_counter()
    for _ in range(steps):
        batch = build_batch(Selection(rollouts, {}), config=config)
        metrics = policy_update(model, optimizer, batch, config)
    real = sum(len(s.token_ids) for s in batch.samples)
    return real * steps / (time.perf_counter() - begin), metrics["padding_fraction"]


def trl(model_dir: Path, steps: int) -> tuple[float, float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    prompts, completions, logprobs, rewards = make_samples()
    index = {f"p{i}": i for i in range(PROMPTS)}

    def rollout_func(batch_prompts, trainer):
        # TRL passes each prompt num_generations times: the k-th copy gets the k-th completion
        out, seen = {"prompt_ids": [], "completion_ids": [], "logprobs": []}, {}
        for prompt in batch_prompts:
            i = index[prompt]
            g = seen[i] = seen.get(i, -1) + 1
            out["prompt_ids"].append(prompts[i])
            out["completion_ids"].append(completions[i][g % GENERATIONS])
            out["logprobs"].append(logprobs[i][g % GENERATIONS])
        return out

    reward_of = {tuple(c): rewards[p][g] for p in range(PROMPTS) for g, c in enumerate(completions[p])}

    def reward_func(completions, completion_ids, **kwargs):
        return [reward_of.get(tuple(ids), 0.0) for ids in completion_ids]

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=32,
        gradient_accumulation_steps=8,
        num_generations=GENERATIONS,
        max_completion_length=MAX_COMPLETION,
        max_steps=steps + 1,
        learning_rate=1e-5,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        loss_type="dapo",
        beta=0.0,
        dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    fed = {"positions": 0, "real": 0}

    def count_padding(_module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is not None:
            fed["positions"] += mask.numel()
            fed["real"] += int(mask.sum())

    model.register_forward_pre_hook(count_padding, with_kwargs=True)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_func,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in index]),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    times = []

    class Timer:  # a transformers callback: time each optimizer step
        def __getattr__(self, name):
            return lambda *a, **k: None

        def on_step_begin(self, *a, **k):
            times.append(time.perf_counter())

    trainer.add_callback(Timer())
    trainer.train()
    times.append(time.perf_counter())
    real = sum(len(p) + len(c) for p, group in zip(prompts, completions) for c in group)
    step_times = np.diff(times)[1:]  # skip the first (warm-up) step
    if not fed["positions"]:
        raise RuntimeError("TRL called the model without an attention_mask keyword: its padding was not seen")
    return real / float(np.mean(step_times)), 1 - fed["real"] / fed["positions"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    from transformers.utils import logging as transformers_logging

    from lightning_otel.testing.tiny_model import build_tiny_model

    transformers_logging.disable_progress_bar()
    model_dir = build_tiny_model(
        Path(tempfile.mkdtemp()) / "m6", hidden_size=256, layers=6, heads=8, kv_heads=8, intermediate_size=1024
    )
    params = sum(
        p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(model_dir).parameters()
    )
    print(f"model: {params / 1e6:.1f}M parameters; {PROMPTS} prompts x {GENERATIONS} completions per step")
    results = {layout: ours(model_dir, args.steps, layout) for layout in ("shared_prefix", "sorted", "packed")}
    theirs, their_padding = trl(model_dir, args.steps)
    for layout, (rate, padding) in results.items():
        print(f"ours, {layout:>13} rows: {rate:,.0f} real tokens/s, padding {100 * padding:.1f}%")
    print(f"TRL GRPOTrainer (padded):  {theirs:,.0f} real tokens/s, padding {100 * their_padding:.1f}%")
    print(f"ours (shared_prefix, the default) / TRL = {results['shared_prefix'][0] / theirs:.2f}x")


if __name__ == "__main__":
    main()
