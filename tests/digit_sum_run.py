"""The digit-sum run: the whole loop, for real, on this machine's CPU, on a checkable task.

What the `demo_run` fixture (tests/conftest.py) runs for the dashboard, Grafana and report tests,
and the store the docs' screenshots come from.

The agent (lightning_otel.testing.digit_sum_agent, a plain OpenAI-SDK harness with a tool step and
retries) answers "What is a + b?"; the reward checks the format and the sum. examples/training_loop.py
runs the loop: tiny model + SFT warm-up, collector and vLLM, then per iteration the agent's rollouts
-> the scheduled training job's run (SQL selection, GRPO step, checkpoint, hot-swap, probe) -> one
row; at the end the reward per policy version from SQL, a report and the dashboard command.

    python tests/digit_sum_run.py --workdir ./demo-runs/digit_sum --iterations 15
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # the loop all examples share

import training_loop

from lightning_otel.testing import digit_sum

AGENT = Path(digit_sum.__file__).with_name("digit_sum_agent.py")


def build_model(out: Path, seed: int) -> Path:
    from lightning_otel.testing.tiny_model import build_tiny_model

    return build_tiny_model(out, seed=seed)


def warm_up(base: Path, out: Path, steps: int, learning_rate: float, seed: int) -> Path:
    return digit_sum.sft_warmup(base, out, steps=steps, learning_rate=learning_rate, seed=seed)


def _run(iteration: training_loop.Iteration, pairs: list[tuple[int, int]], rollouts: int) -> int:
    tasks = ",".join(f"{a}+{b}" for a, b in pairs)
    flags = ("--base-url", iteration.base_url, "--model", iteration.model, "--split", iteration.split)
    iteration.run_script(AGENT, *flags, "--tasks", tasks, "--rollouts", str(rollouts))
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
