"""The tool-use example: an OpenAI Agents SDK agent with a calculator tool,
trained on CPU by the whole loop (collector, vLLM with the hermes tool parser, train, hot-swap).

    python examples/tool_use/run.py --workdir ./demo-runs/tool_use --iterations 40

See README.md beside this file; examples/training_loop.py has the loop.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this example's task, and the loop all examples share

import calculator_task  # noqa: E402
import training_loop  # noqa: E402


def build_model(out: Path, seed: int) -> Path:
    from lightning_otel.trainer.tiny_model import build_tiny_model

    # The prompt's fixed text in the tokenizer's corpus: the system turn takes fewer tokens.
    extra = [calculator_task.INSTRUCTIONS, json.dumps(calculator_task.tool_schema()), "The answer is"] * 50
    return build_tiny_model(out, seed=seed, vocab_size=1024, tool_calls=True, extra_text=extra, merge_words=True)


def warm_up(base: Path, out: Path, steps: int, learning_rate: float, seed: int) -> Path:
    examples = calculator_task.sft_examples(400, random.Random(seed))
    return training_loop.sft_warmup(base, out, examples, [calculator_task.tool_schema()], steps, learning_rate, seed)


def run_agent(iteration: training_loop.Iteration) -> int:
    tasks = [calculator_task.make_task(iteration.rng) for _ in range(iteration.tasks)]
    iteration.run_script(
        HERE / "calculator_agent.py",
        "--base-url",
        iteration.base_url,
        "--model",
        iteration.model,
        "--tasks",
        ";".join(f"{question}={result}" for question, result in tasks),
        "--rollouts",
        str(iteration.rollouts_per_task),
    )
    return len(tasks) * iteration.rollouts_per_task


EXAMPLE = training_loop.Example(
    name="tool_use",
    description=__doc__.splitlines()[0],
    build_model=build_model,
    warm_up=warm_up,
    run_agent=run_agent,
    tool_call_parser="hermes",
    defaults={"iterations": 40, "tasks": 8, "rollouts_per_task": 8, "sft_steps": 200},
)

if __name__ == "__main__":
    sys.exit(training_loop.run(EXAMPLE))
