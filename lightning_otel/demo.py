"""`lightning-otel demo`: the whole loop, for real, on this machine's CPU.

collector + vLLM start -> the instrumented example agent runs rollouts (its own process, OTLP
to the collector) -> SQL selects the iteration's rollouts -> one rollout-level GRPO step ->
the new weights are hot-swapped into vLLM and checked with a logprob probe -> repeat.
Everything started here is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROW = "{:>4} | {:>8} | {:>9} | {:>15} | {:>11} | {:>9} | {:>7} | {:>10}"
HEADER = ROW.format("iter", "rollouts", "llm calls", "samples/rollout", "mean reward", "grad norm", "swap s", "probe diff")


def _wait_for_rollouts(data_dir: Path, since_epoch: float, expected: int, timeout_s: float = 60.0) -> None:
    from lightning_otel.collector import connect

    deadline = time.monotonic() + timeout_s
    query = f"SELECT count(*) FROM rollouts WHERE reward IS NOT NULL AND start_time >= to_timestamp({since_epoch})"
    while True:
        count = connect(data_dir).execute(query).fetchone()[0]
        if count >= expected:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {count} of {expected} rollouts reached the store within {timeout_s:.0f} s")
        time.sleep(0.25)


def _tasks(n: int) -> list[str]:
    return [f"{(3 * i + 1) % 10}+{(7 * i + 4) % 10}" for i in range(n)]


def run_demo(workdir: str | Path, iterations: int = 3, tasks: int = 4, rollouts_per_task: int = 4) -> int:
    import os

    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from lightning_otel.collector import connect
    from lightning_otel.servers import CollectorProcess, VLLMServer
    from lightning_otel.trainer import PolicyTrainer, UpdateConfig, VLLMAdmin, probe_max_diff
    from lightning_otel.trainer.tiny_model import build_tiny_model

    transformers_logging.disable_progress_bar()  # keep the table readable
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = workdir / "model"
    if not (model_dir / "config.json").exists():
        print(f"building the tiny model in {model_dir}", flush=True)
        build_tiny_model(model_dir)
    data_dir = workdir / "traces"
    collector = CollectorProcess(data_dir, log_path=workdir / "collector.log")
    vllm = VLLMServer(model_dir, log_path=workdir / "vllm.log")
    try:
        print(f"starting collector and vLLM (logs in {workdir})", flush=True)
        collector.start()
        started = time.perf_counter()
        vllm.start()
        print(f"vLLM up in {time.perf_counter() - started:.0f} s at {vllm.base_url}", flush=True)
        admin = VLLMAdmin(vllm.url)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        probe_text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
        )
        probe_ids = tokenizer.encode(probe_text, add_special_tokens=False)
        trainer = PolicyTrainer(model_dir, workdir, UpdateConfig(learning_rate=2e-3))
        agent_env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.traces_endpoint}
        task_list = _tasks(tasks)
        print(HEADER, flush=True)
        for iteration in range(1, iterations + 1):
            since = time.time()
            subprocess.run(
                [sys.executable, "-m", "lightning_otel.demo_agent", "--base-url", vllm.base_url,
                 "--tasks", ",".join(task_list), "--rollouts", str(rollouts_per_task)],
                env=agent_env, check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            _wait_for_rollouts(data_dir, since, len(task_list) * rollouts_per_task)
            result = trainer.step(connect(data_dir), where=f"start_time >= to_timestamp({since})")
            swap = trainer.swap_into(admin)
            diff = probe_max_diff(admin, vllm.served_model_name, trainer.model, probe_ids)
            row = ROW.format(
                iteration, len(result.selection.rollouts), result.selection.llm_calls,
                f"{result.batch.samples_per_rollout:.2f}", f"{result.mean_reward:.3f}",
                f"{result.metrics['grad_norm']:.3f}", f"{swap.seconds:.2f}", f"{diff:.1e}",
            )  # fmt: skip
            print(row, flush=True)
            if diff > 1e-4:
                print(f"error: vLLM serves logprobs {diff:.2e} away from the trainer's after the swap", file=sys.stderr)
                return 1
        print(f"done: traces in {data_dir}; try: lightning-otel sql --data-dir {data_dir} 'SELECT * FROM rollouts'")
        return 0
    except KeyboardInterrupt:
        print("interrupted; stopping everything the demo started", file=sys.stderr)
        return 130
    finally:
        vllm.stop()
        collector.stop()
