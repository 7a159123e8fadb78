"""The text-to-SQL example's agent: a stock LangChain agent (`create_agent`, a LangGraph graph)
with one tool that runs SQL on the example's DuckDB database.

Nothing here is written for training except `lightning_otel.instrument()` (once),
`lightning_otel.rollout(...)` around each run and `lightning_otel.reward(...)` at its end.
LangChain's ChatOpenAI calls vLLM through the OpenAI SDK; vLLM's `hermes` parser turns the model's
`<tool_call>` text into tool calls; LangGraph runs the tool and calls the model again.

    python examples/text_to_sql/sql_agent.py --base-url http://127.0.0.1:8000/v1 --database db.duckdb \
        --tasks "How many employees work in Sales?=SELECT count(*) FROM employees WHERE department = 'Sales'"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

import sql_task  # this example's task, beside this file
from langchain.agents import create_agent
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError

import lightning_otel


def make_run_sql(database: Path, results: list) -> BaseTool:
    """The agent's tool; each query's rows are also kept in `results` (the reward reads the last)."""

    @tool
    def run_sql(query: str) -> str:
        """Run one SQL query on the database and return its rows."""
        try:
            rows = sql_task.run_query(database, query)
        except Exception as error:
            return f"error: {error}"
        results.append(rows)
        return sql_task.rows_text(rows)

    return run_sql


async def run_rollout(
    model: ChatOpenAI, database: Path, question: str, gold: str, recursion_limit: int, split: str
) -> float:
    results: list = []
    agent = create_agent(model, tools=[make_run_sql(database, results)], system_prompt=sql_task.SYSTEM_PROMPT)
    with lightning_otel.rollout(task_id=question, split=split):
        with contextlib.suppress(GraphRecursionError):  # too many steps: scored on what it ran
            await agent.ainvoke(
                {"messages": [{"role": "user", "content": question}]}, {"recursion_limit": recursion_limit}
            )
        value = sql_task.reward(results[-1] if results else None, sql_task.run_query(database, gold))
        lightning_otel.reward(value)
        return value


async def run_all(
    model: ChatOpenAI, database: Path, jobs: list[tuple[str, str]], recursion_limit: int, split: str
) -> list[float]:
    return await asyncio.gather(*(run_rollout(model, database, q, gold, recursion_limit, split) for q, gold in jobs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default="policy")
    parser.add_argument("--database", required=True, type=Path)
    parser.add_argument("--tasks", required=True, help="';'-separated QUESTION=GOLD_SQL pairs")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per task (the GRPO group size)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--recursion-limit", type=int, default=5, help="LangGraph steps: model, tool, model, tool, model"
    )
    parser.add_argument("--split", default="train", choices=("train", "eval"), help="eval: never trained on")
    args = parser.parse_args(argv)

    instrumentation = lightning_otel.instrument(service_name="text-to-sql-agent")
    model = ChatOpenAI(
        model=args.model,
        base_url=args.base_url,
        api_key="unused",
        temperature=1.0,
        max_tokens=args.max_tokens,
        max_retries=0,
    )
    tasks = [tuple(task.split("=", 1)) for task in args.tasks.split(";")]
    jobs = [task for task in tasks for _ in range(args.rollouts)]
    rewards = asyncio.run(run_all(model, args.database, jobs, args.recursion_limit, args.split))
    instrumentation.flush()
    print(f"text-to-sql agent: {len(rewards)} rollouts, mean reward {sum(rewards) / len(rewards):.3f}")


if __name__ == "__main__":
    main()
