"""The text-to-SQL example: a LangChain agent (create_agent, LangGraph) with a SQL tool on a small
DuckDB database, trained on CPU by the whole loop (collector, vLLM with the hermes tool parser, train, hot-swap).

    python examples/text_to_sql/run.py --workdir ./demo-runs/text_to_sql --iterations 10

See README.md beside this file; examples/training_loop.py has the loop.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this example's task, and the loop all examples share

import sql_task  # noqa: E402
import training_loop  # noqa: E402


def tool_schema(database: Path) -> dict:
    """The tool as LangChain sends it to vLLM (the SFT warm-up renders the same prompt)."""
    import sql_agent
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return convert_to_openai_tool(sql_agent.make_run_sql(database, []))


def database(workdir: Path) -> Path:
    path = workdir / "employees.duckdb"
    return path if path.exists() else sql_task.make_database(path)


def build_model(out: Path, seed: int) -> Path:
    from lightning_otel.testing.tiny_model import build_tiny_model

    # The prompt's fixed text and the queries' words in the tokenizer's corpus: fewer tokens each.
    rng = random.Random(seed)
    extra = [sql_task.SYSTEM_PROMPT, json.dumps(tool_schema(out.parent / "employees.duckdb"))] * 50
    extra += [" ".join(sql_task.make_task(rng)) for _ in range(500)]
    return build_tiny_model(out, seed=seed, vocab_size=1024, tool_calls=True, extra_text=extra, merge_words=True)


def warm_up(base: Path, out: Path, steps: int, learning_rate: float, seed: int) -> Path:
    db = database(out.parent)
    examples = sql_task.sft_examples(400, random.Random(seed), db)
    return training_loop.sft_warmup(base, out, examples, [tool_schema(db)], steps, learning_rate, seed)


def _ask(iteration: training_loop.Iteration, tasks: list[tuple[str, str]], rollouts: int) -> int:
    iteration.run_script(
        HERE / "sql_agent.py",
        "--base-url",
        iteration.base_url,
        "--model",
        iteration.model,
        "--database",
        str(database(iteration.workdir)),
        "--tasks",
        ";".join(f"{question}={gold}" for question, gold in tasks),
        "--rollouts",
        str(rollouts),
        "--split",
        iteration.split,
    )
    return len(tasks) * rollouts


def run_agent(iteration: training_loop.Iteration) -> int:
    return _ask(
        iteration, [sql_task.make_task(iteration.rng) for _ in range(iteration.tasks)], iteration.rollouts_per_task
    )


def run_eval(iteration: training_loop.Iteration) -> int:
    """The held-out set (sql_task.eval_tasks: no warm-up or RL question), one rollout each; only its
    first `iteration.tasks` when that is set (--eval-tasks)."""
    held_out = sql_task.eval_tasks()
    return _ask(iteration, held_out[: iteration.tasks or len(held_out)], 1)


EXAMPLE = training_loop.Example(
    name="text_to_sql",
    description=__doc__.splitlines()[0],
    build_model=build_model,
    warm_up=warm_up,
    run_agent=run_agent,
    run_eval=run_eval,
    tool_call_parser="hermes",
    # 240 warm-up steps: with 60 the model made no tool call vLLM accepted; RL at 2e-3 stopped the calls
    defaults={"iterations": 10, "tasks": 8, "rollouts_per_task": 4, "sft_steps": 240, "learning_rate": 3e-4},
)

if __name__ == "__main__":
    sys.exit(training_loop.run(EXAMPLE))
