"""The digit-sum example: the whole loop, for real, on this machine's CPU, on a checkable task.

The agent (digit_sum_agent.py, a plain OpenAI-SDK harness with a tool step and retries) answers
"What is a + b?"; the reward checks the format and the sum. examples/training_loop.py runs the loop:
tiny model + SFT warm-up, collector and vLLM, then per iteration the agent's rollouts -> the
scheduled training job's run (SQL selection, GRPO step, checkpoint, hot-swap, probe) -> one row;
at the end the reward per policy version from SQL, a report and the dashboard command.

    python examples/digit_sum/run.py --workdir ./demo-runs/digit_sum --iterations 15
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this example's task, and the loop all examples share

import digit_sum  # noqa: E402
import training_loop  # noqa: E402


def build_model(out: Path, seed: int) -> Path:
    from lightning_otel.trainer.tiny_model import build_tiny_model

    return build_tiny_model(out, seed=seed)


def warm_up(base: Path, out: Path, steps: int, learning_rate: float, seed: int) -> Path:
    return digit_sum.sft_warmup(base, out, steps=steps, learning_rate=learning_rate, seed=seed)


def _run(iteration: training_loop.Iteration, pairs: list[tuple[int, int]], rollouts: int) -> int:
    tasks = ",".join(f"{a}+{b}" for a, b in pairs)
    script = HERE / "digit_sum_agent.py"
    flags = ("--base-url", iteration.base_url, "--model", iteration.model, "--split", iteration.split)
    iteration.run_script(script, *flags, "--tasks", tasks, "--rollouts", str(rollouts))
    return len(pairs) * rollouts


def run_agent(iteration: training_loop.Iteration) -> int:
    return _run(iteration, iteration.rng.sample(digit_sum.TRAIN, iteration.tasks), iteration.rollouts_per_task)


def run_eval(iteration: training_loop.Iteration) -> int:
    """The held-out pairs (digit_sum.HELD_OUT: never in the warm-up or the RL tasks), one rollout each."""
    return _run(iteration, digit_sum.HELD_OUT, 1)


EXAMPLE = training_loop.Example(
    name="digit_sum",
    description=__doc__.splitlines()[0],
    build_model=build_model,
    warm_up=warm_up,
    run_agent=run_agent,
    run_eval=run_eval,
    defaults={"iterations": 15, "tasks": 8, "rollouts_per_task": 8, "sft_steps": 40},
)

if __name__ == "__main__":
    sys.exit(training_loop.run(EXAMPLE))
