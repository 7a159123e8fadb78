"""The demo's example agent: a plain OpenAI-SDK harness, instrumented with one call.

Each rollout: the model is asked a sum, replies; the harness runs an `add` tool and appends
its result as a tool message; the model answers again; the answer is scored. Two LLM calls with
a tool step between them, which is the shape the trainer's merge rule is about.

    python -m lightning_otel.demo_agent --base-url http://127.0.0.1:8000/v1 --tasks 3+4,2+5 --rollouts 4
"""

from __future__ import annotations

import argparse
import re
from concurrent.futures import ThreadPoolExecutor

import openai

import lightning_otel

SYSTEM = "You are a calculator agent. Call the add tool, then reply with the result as a number."


@lightning_otel.tool
def add(a: int, b: int) -> int:
    return a + b


def score(answer: str, expected: int) -> float:
    """1 for the right number; otherwise partial credit for answering in digits at all."""
    if re.search(rf"(?<!\d){expected}(?!\d)", answer):
        return 1.0
    digits = sum(ch.isdigit() for ch in answer)
    return 0.5 * digits / max(1, len(answer))


def run_rollout(client: openai.OpenAI, model: str, a: int, b: int, max_tokens: int) -> float:
    with lightning_otel.rollout(task_id=f"add-{a}-{b}"):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}]
        first = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=1.0)
        messages.append({"role": "assistant", "content": first.choices[0].message.content or ""})
        messages.append({"role": "tool", "content": str(add(a, b))})
        final = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=1.0)
        value = score(final.choices[0].message.content or "", a + b)
        lightning_otel.reward(value)
        return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default="policy")
    parser.add_argument("--tasks", required=True, help="comma-separated sums, e.g. 3+4,2+5")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per task")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)

    instrumentation = lightning_otel.instrument(service_name="demo-agent")
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    tasks = [tuple(int(x) for x in task.split("+")) for task in args.tasks.split(",")]
    jobs = [(a, b) for a, b in tasks for _ in range(args.rollouts)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        rewards = list(pool.map(lambda job: run_rollout(client, args.model, *job, args.max_tokens), jobs))
    instrumentation.flush()
    print(f"demo agent: {len(rewards)} rollouts, mean reward {sum(rewards) / len(rewards):.3f}")


if __name__ == "__main__":
    main()
