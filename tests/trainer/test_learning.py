"""The RL update learns: after a short SFT warm-up (TRL's SFTTrainer), the rollout-level GRPO loop
raises the mean reward on held-out sums (never trained on) by a clear margin, in well under a minute
on CPU. Samples come from the model in process (digit_sum.LocalSampler, exact behaviour logprobs)
and go through the trainer's own build_batch and policy_update."""

from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_otel.testing import digit_sum
from lightning_otel.testing.tiny_model import build_tiny_model
from lightning_otel.trainer.update import UpdateConfig


def test_rl_raises_held_out_reward_after_sft_warmup(tmp_path):
    torch.manual_seed(0)
    base = build_tiny_model(tmp_path / "base")
    warm = digit_sum.sft_warmup(base, tmp_path / "sft", steps=40, learning_rate=2e-3)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    sampler = digit_sum.LocalSampler(model, tokenizer)
    before = digit_sum.evaluate(sampler, digit_sum.HELD_OUT)
    config = UpdateConfig(learning_rate=1e-3, micro_batch_size=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    rng = random.Random(0)
    for iteration in range(100):
        digit_sum.rl_iteration(model, optimizer, sampler, rng.sample(digit_sum.TRAIN, 8), 8, config, seed=iteration)
    after = digit_sum.evaluate(sampler, digit_sum.HELD_OUT)
    assert after >= before + 0.1, (before, after)


def test_held_out_sums_are_disjoint_from_training_even_mirrored():
    """No held-out question is a training question, nor its mirror ("b + a"); the warm-up reads the
    training pairs only (digit_sum.sft_warmup); every held-out sum is reachable from training."""
    held_out, train = set(digit_sum.HELD_OUT), set(digit_sum.TRAIN)
    assert held_out and not held_out & train and held_out | train == set(digit_sum.PAIRS)
    assert not {(b, a) for a, b in held_out} & train
    assert {a + b for a, b in held_out} <= {a + b for a, b in train}
