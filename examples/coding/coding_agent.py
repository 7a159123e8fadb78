"""The coding example's agent: mini-SWE-agent 2.4.6 as it ships (DefaultAgent, LocalEnvironment,
LitellmTextbasedModel, the stock `mini_textbased.yaml`), one tiny repository per rollout.

Nothing here is written for training except `lightning_otel.instrument()` (once),
`lightning_otel.rollout(...)` around each run and `lightning_otel.reward(...)` at its end. The
agent calls vLLM through LiteLLM (`hosted_vllm/<name>`), which instrument() captures. When an
answer holds no valid bash block, the agent drops it and asks again with a format-error message:
its context is rewritten, and the merge diagnostics say so (`context_rewritten`).

    python examples/coding/coding_agent.py --base-url http://127.0.0.1:8000/v1 --tasks calc,add,-,3,4 --rollouts 2
"""

from __future__ import annotations

import argparse
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import coding_task  # this example's task, beside this file

import lightning_otel

# No network here: LiteLLM would fetch its price list at import; local models have no price.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")  # a local server that fails will fail again


def run_rollout(
    task: coding_task.Task, config: dict, base_url: str, model_name: str, max_tokens: int, split: str
) -> float:
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    kwargs = {
        **config["model"]["model_kwargs"],
        "api_base": base_url,
        "api_key": "unused",
        "temperature": 1.0,
        "max_tokens": max_tokens,
    }
    model = LitellmTextbasedModel(**{**config["model"], "model_kwargs": kwargs}, model_name=f"hosted_vllm/{model_name}")
    with tempfile.TemporaryDirectory(prefix="coding-rollout-") as directory:
        repo = coding_task.make_repo(task, Path(directory))
        agent = DefaultAgent(model, LocalEnvironment(**config["environment"], cwd=str(repo)), **config["agent"])
        with lightning_otel.rollout(task_id=task.encode(), split=split):
            agent.run(task.text)  # ends submitted, out of steps, or after repeated format errors
            value = coding_task.reward(task, repo)
            lightning_otel.reward(value)
        return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default="policy")
    parser.add_argument("--tasks", required=True, help="';'-separated tasks (coding_task.Task.encode)")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per task (the GRPO group size)")
    parser.add_argument("--step-limit", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--split", default="train", choices=("train", "eval"), help="eval: never trained on")
    args = parser.parse_args(argv)

    instrumentation = lightning_otel.instrument(service_name="coding-agent")
    config = coding_task.agent_config(args.step_limit)
    jobs = [coding_task.Task.decode(text) for text in args.tasks.split(";") for _ in range(args.rollouts)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        rewards = list(
            pool.map(
                lambda task: run_rollout(task, config, args.base_url, args.model, args.max_tokens, args.split), jobs
            )
        )
    instrumentation.flush()
    print(f"coding agent: {len(rewards)} rollouts, mean reward {sum(rewards) / len(rewards):.3f}")


if __name__ == "__main__":
    main()
