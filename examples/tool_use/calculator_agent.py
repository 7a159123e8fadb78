"""The tool-use example's agent: a stock OpenAI Agents SDK agent with one function tool.

Nothing here is written for training except three calls: `lightning_otel.instrument()` (once),
`lightning_otel.rollout(...)` around each run and `lightning_otel.reward(...)` at its end. The SDK
talks to vLLM through the OpenAI SDK's chat completions; vLLM's `hermes` parser turns the model's
`<tool_call>` text into tool calls, the SDK runs the tool and sends its result back.

It runs as a small service: each line on stdin is one batch of tasks (`QUESTION=RESULT` pairs joined
by `;`); it runs `--rollouts` rollouts of each, exports their spans and prints one line with the mean
reward (starting with `@answer `, what `training_loop.AgentProcess` waits for). It ends at the end of
its input, so the SDK's imports are paid once, not once per batch.

    echo 'What is "37*48"?=1776' | python examples/tool_use/calculator_agent.py \
        --base-url http://127.0.0.1:8000/v1 --rollouts 4
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import calculator_task  # this example's task, beside this file
import openai
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
from agents.exceptions import AgentsException

import lightning_otel


# strict_mode=False: with a strict tool, vLLM enforces the JSON schema by a grammar while sampling, and
# the logprobs it returns are those of the masked distribution, not of the policy being trained.
@function_tool(
    name_override=calculator_task.TOOL_NAME, description_override=calculator_task.TOOL_DESCRIPTION, strict_mode=False
)
def calculator(expression: str) -> str:
    return calculator_task.calculate(expression)


def make_agent(base_url: str, model: str, max_tokens: int) -> Agent:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    return Agent(
        name="calculator",
        instructions=calculator_task.INSTRUCTIONS,
        tools=[calculator],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=1.0, max_tokens=max_tokens),
    )


async def run_rollout(agent: Agent, question: str, result: int, max_turns: int, split: str) -> float:
    with lightning_otel.rollout(task_id=question, split=split):
        try:
            answer = (await Runner.run(agent, question, max_turns=max_turns)).final_output
        except AgentsException:  # too many turns, a malformed tool call: no answer
            answer = ""
        value = calculator_task.reward(str(answer), result)
        lightning_otel.reward(value)
        return value


async def run_all(
    agent: Agent, jobs: list[tuple[str, int]], max_turns: int, concurrency: int, split: str
) -> list[float]:
    limit = asyncio.Semaphore(concurrency)

    async def one(question: str, result: int) -> float:
        async with limit:
            return await run_rollout(agent, question, result, max_turns, split)

    return await asyncio.gather(*(one(question, result) for question, result in jobs))


def parse_tasks(line: str) -> list[tuple[str, int]]:
    return [(question, int(result)) for question, result in (task.rsplit("=", 1) for task in line.split(";"))]


async def serve(agent: Agent, instrumentation, args: argparse.Namespace) -> None:
    while line := (await asyncio.to_thread(sys.stdin.readline)).strip():
        jobs = [task for task in parse_tasks(line) for _ in range(args.rollouts)]
        rewards = await run_all(agent, jobs, args.max_turns, args.concurrency, args.split)
        await asyncio.to_thread(instrumentation.flush)
        # the answer line training_loop.AgentProcess waits for (its ANSWER_PREFIX)
        print(f"@answer {len(rewards)} rollouts, mean reward {sum(rewards) / len(rewards):.3f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default="policy")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per task (the GRPO group size)")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--split", default="train", choices=("train", "eval"), help="eval: never trained on")
    args = parser.parse_args(argv)

    instrumentation = lightning_otel.instrument(service_name="tool-use-agent")
    agent = make_agent(args.base_url, args.model, args.max_tokens)
    asyncio.run(serve(agent, instrumentation, args))


if __name__ == "__main__":
    main()
