"""The digit-sum agent: a plain OpenAI-SDK harness, instrumented with one call.

Task: "What is a + b?" (digit_sum.py: the reply must read "The answer is <a+b>.").
Each rollout asks the model; a `check_answer` tool step reads the reply; while the reply is not in
the format the harness asks again, up to three calls:
- the second call continues the conversation (the reply and a reminder appended), so its prompt
  extends the first call's tokens and the trainer can merge the two into one sample;
- the third call starts over in a rewritten context (digit_sum's follow-up), which never extends
  the previous tokens: a failed merge, which the dashboards show with its first divergent token.
The reward scores the last reply. That gives the trainer rollouts of one, two and three calls.

    python -m lightning_otel.testing.digit_sum_agent --base-url http://127.0.0.1:8000/v1 --tasks 3+4,2+5 --rollouts 4
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

import lightning_otel
from lightning_otel.testing import digit_sum

REMINDER = "Reply exactly as: The answer is <number>."


@lightning_otel.tool
def check_answer(reply: str) -> bool:
    """The harness's tool step: is the reply in the format the task asks for?"""
    return digit_sum.formatted(reply)


def run_rollout(client: openai.OpenAI, model: str, a: int, b: int, max_tokens: int, split: str = "train") -> float:
    with lightning_otel.rollout(task_id=f"{a}+{b}", split=split):
        messages: list[Any] = digit_sum.messages(a, b)  # the SDK's message dicts
        reply = ""
        for call in range(3):
            if call == 1:  # continue the conversation: the prompt extends the last call's tokens
                messages = messages + [{"role": "assistant", "content": reply}, {"role": "user", "content": REMINDER}]
            elif call == 2:  # start over in a rewritten context: never a prefix extension
                messages = digit_sum.follow_up(a, b, reply)
            response = client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, temperature=1.0
            )
            reply = response.choices[0].message.content or ""
            if check_answer(reply):
                break
        value = digit_sum.reward(reply, a, b)
        lightning_otel.reward(value)
        return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default="policy")
    parser.add_argument("--tasks", required=True, help="comma-separated sums, e.g. 3+4,2+5")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per task (the GRPO group size)")
    parser.add_argument("--max-tokens", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--split", default="train", choices=("train", "eval"), help="eval: never trained on")
    args = parser.parse_args(argv)

    instrumentation = lightning_otel.instrument(service_name="demo-agent")
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    tasks = [(int(a), int(b)) for a, b in (task.split("+") for task in args.tasks.split(","))]
    jobs = [(a, b) for a, b in tasks for _ in range(args.rollouts)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        rewards = list(
            pool.map(lambda job: run_rollout(client, args.model, job[0], job[1], args.max_tokens, args.split), jobs)
        )
    instrumentation.flush()
    print(f"demo agent: {len(rewards)} rollouts, mean reward {sum(rewards) / len(rewards):.3f}")


if __name__ == "__main__":
    main()
