"""The coding example: mini-SWE-agent (text-based bash actions) fixing tiny generated repositories,
trained on CPU by the whole loop (collector, vLLM, train, hot-swap).

    python examples/coding/run.py --workdir ./demo-runs/coding --iterations 5

See README.md beside this file; examples/training_loop.py has the loop.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this example's task, and the loop all examples share

import coding_task  # noqa: E402
import training_loop  # noqa: E402

STEP_LIMIT = 4  # model calls per rollout: the scripted fix takes three (fix, test, submit)


def build_model(out: Path, seed: int) -> Path:
    from lightning_otel.testing.tiny_model import build_tiny_model

    # The harness's prompts in the tokenizer's corpus, merged across words: its fixed text takes few tokens.
    conversations = coding_task.sft_examples(10, random.Random(seed), STEP_LIMIT)
    extra = [m["content"] for example in conversations for m in example["prompt"] + example["completion"]] * 50
    return build_tiny_model(out, seed=seed, vocab_size=2048, extra_text=extra, merge_words=True)


def warm_up(base: Path, out: Path, steps: int, learning_rate: float, seed: int) -> Path:
    examples = coding_task.sft_examples(100, random.Random(seed), STEP_LIMIT)
    return training_loop.sft_warmup(base, out, examples, None, steps, learning_rate, seed, batch_size=8)


def _ask(iteration: training_loop.Iteration, tasks: list, rollouts: int) -> int:
    iteration.run_script(
        HERE / "coding_agent.py",
        "--base-url",
        iteration.base_url,
        "--model",
        iteration.model,
        "--tasks",
        ";".join(task.encode() for task in tasks),
        "--rollouts",
        str(rollouts),
        "--step-limit",
        str(STEP_LIMIT),
        "--split",
        iteration.split,
    )
    return len(tasks) * rollouts


def run_agent(iteration: training_loop.Iteration) -> int:
    tasks = [coding_task.make_task(iteration.rng) for _ in range(iteration.tasks)]
    return _ask(iteration, tasks, iteration.rollouts_per_task)


def run_eval(iteration: training_loop.Iteration) -> int:
    """The held-out set (coding_task.eval_tasks: no warm-up or RL task), one rollout each; only its
    first `iteration.tasks` when that is set (--eval-tasks)."""
    held_out = coding_task.eval_tasks()
    return _ask(iteration, held_out[: iteration.tasks or len(held_out)], 1)


EXAMPLE = training_loop.Example(
    name="coding",
    description=__doc__.splitlines()[0],
    build_model=build_model,
    warm_up=warm_up,
    run_agent=run_agent,
    run_eval=run_eval,
    micro_batch_size=16,
    defaults={"iterations": 5, "tasks": 4, "rollouts_per_task": 4, "sft_steps": 40},
)

if __name__ == "__main__":
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    sys.exit(training_loop.run(EXAMPLE))
