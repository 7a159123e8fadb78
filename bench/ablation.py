"""Ablation on the digit-sum task (the paper's comparison): a harness that splits rollouts into a
varying number of samples, trained three ways.

    python bench/ablation.py --iterations 80 --seeds 3
    python bench/ablation.py --harness single --variants ours --iterations 100   # the learning-test curve

The harness asks again, in a rewritten context (a new sample), while the answer is not in the format,
up to 3 calls; the reward scores the last answer. So rollouts of the same task become 1 to 3 samples,
and the rollouts that failed more become more samples. Variants:
  rollout adv + rollout norm   one advantage per rollout, token mean per rollout (ours, the paper's)
  sample adv                   every sample its own unit: advantage and normalization per sample
  rollout adv alone            one advantage per rollout, but token mean per sample
Reports held-out mean reward (the same harness on held-out sums) every 10 iterations, mean of seeds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = {
    "ours": dict(advantage_level="rollout", normalization="rollout"),  # rollout adv + rollout norm
    "sample adv": dict(advantage_level="sample", normalization="sample"),
    "rollout adv alone": dict(advantage_level="rollout", normalization="sample"),
}


def held_out_reward(digit_sum, sampler, again, seed: int) -> float:
    rollouts = digit_sum.run_rollouts(sampler, digit_sum.HELD_OUT, 4, again, seed=seed)
    return float(np.mean([r.reward for r in rollouts]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", help="write the curves here")
    parser.add_argument(
        "--harness",
        choices=("retry", "single"),
        default="retry",
        help="retry: ask again while unformatted (1-3 samples per rollout); single: one call",
    )
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from lightning_otel.testing import digit_sum
    from lightning_otel.testing.tiny_model import build_tiny_model
    from lightning_otel.trainer.update import UpdateConfig

    transformers_logging.disable_progress_bar()
    workdir = Path(tempfile.mkdtemp(prefix="lightning-ablation-"))
    curves: dict[str, list[list[float]]] = {name: [] for name in args.variants}
    again = digit_sum.retry_unformatted() if args.harness == "retry" else None
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        warm = digit_sum.sft_warmup(
            build_tiny_model(workdir / f"base-{seed}", seed=seed),
            workdir / f"sft-{seed}",
            steps=40,
            learning_rate=2e-3,
            seed=seed,
        )
        tokenizer = AutoTokenizer.from_pretrained(warm)
        for name in args.variants:
            options = VARIANTS[name]
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
            sampler = digit_sum.LocalSampler(model, tokenizer)
            config = UpdateConfig(learning_rate=1e-3, micro_batch_size=64, **options)
            optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
            rng = random.Random(seed)
            curve, splits = [held_out_reward(digit_sum, sampler, again, 10_000)], []
            for iteration in range(args.iterations):
                metrics = digit_sum.rl_iteration(
                    model,
                    optimizer,
                    sampler,
                    rng.sample(digit_sum.TRAIN, 8),
                    8,
                    config,
                    again,
                    seed=1000 * seed + iteration,
                )
                splits.append(metrics["samples_per_rollout"])
                if (iteration + 1) % 10 == 0:
                    curve.append(held_out_reward(digit_sum, sampler, again, 10_000 + iteration))
            curves[name].append(curve)
            print(
                f"seed {seed} {name}: {' '.join(f'{x:.3f}' for x in curve)} "
                f"(samples per rollout {np.mean(splits):.2f})",
                flush=True,
            )
    print("\nheld-out mean reward, mean over seeds, every 10 iterations:")
    for name, runs in curves.items():
        mean = np.mean(np.array(runs), axis=0)
        print(f"  {name:>18}: {' '.join(f'{x:.3f}' for x in mean)}")
    if args.json:
        Path(args.json).write_text(json.dumps(curves))


if __name__ == "__main__":
    main()
