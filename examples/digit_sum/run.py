"""The digit-sum example (what `make demo` runs): the whole loop, for real, on this machine's CPU, on a checkable task.

1. Build the tiny model (offline: our own BPE tokenizer, a small Qwen2) and warm it up with a short
   SFT (TRL's SFTTrainer on digit_sum's format), so that some rollouts earn reward from the start.
2. Start the collector and vLLM (serving the warmed model).
3. Each iteration: the instrumented example agent (digit_sum_agent.py, its own process, OTLP to the
   collector) runs a group of rollouts per task, with a tool step and retries -> the scheduled
   training job's run (`lightning-otel train`: SQL selects the rollouts not trained on yet,
   rollout-level GRPO step, checkpoint, hot-swap into vLLM, logprob probe; its train_step and
   merge_boundary spans go into the same store) -> one row of the table.
4. At the end: the reward per policy version (from SQL), a report (PNG plots + Markdown), and the
   command that opens the dashboard on the traces.
Everything started here is stopped on exit, Ctrl-C included.

    python examples/digit_sum/run.py --workdir ./demo-runs/latest --iterations 15
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROW = "{:>4} | {:>8} | {:>9} | {:>15} | {:>11} | {:>8} | {:>7}"
HEADER = ROW.format("iter", "rollouts", "llm calls", "samples/rollout", "mean reward", "loss", "swap s")
# The loss column is near zero by construction: group-normalized advantages sum to zero per task.


def _wait_for(data_dir: Path, query: str, expected: int, what: str, timeout_s: float) -> tuple:
    """Poll `query` (first column: a count) until it reaches `expected`; returns its row. The views
    re-list the Parquet files at each query, so one connection sees what the collector adds."""
    from lightning_otel.collector import connect

    conn = connect(data_dir)
    deadline = time.monotonic() + timeout_s
    while (row := conn.execute(query).fetchone())[0] < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {row[0]} of {expected} {what} reached the store within {timeout_s:.0f} s")
        time.sleep(0.25)
    return row


def _wait_for_rollouts(data_dir: Path, since_epoch: float, expected: int) -> tuple[int, int]:
    """Wait until the iteration's rewarded rollouts are queryable; (rollouts, llm calls)."""
    count, calls = _wait_for(
        data_dir,
        "SELECT count(*), coalesce(sum(llm_calls), 0) FROM rollouts "
        f"WHERE reward IS NOT NULL AND start_time >= to_timestamp({since_epoch})",
        expected,
        "rollouts",
        timeout_s=60.0,
    )
    return count, int(calls)


def _train_config(workdir: Path, policy_dir: Path, collector, vllm, learning_rate: float):
    from lightning_otel.trainer.config import (
        CheckpointSection,
        ModelSection,
        SelectionSection,
        ServerSection,
        StoreSection,
        TrainConfig,
        UpdateConfig,
    )

    return TrainConfig(
        store=StoreSection(data_dir=str(workdir / "traces"), otlp_endpoint=collector.traces_endpoint),
        model=ModelSection(base=str(policy_dir), served_model_name=vllm.served_model_name),
        server=ServerSection(replicas=[vllm.url]),
        # min_age_s=0: the demo waits for every rollout of the iteration itself (a cron job would not)
        selection=SelectionSection(min_age_s=0.0, max_rollouts=10_000),
        update=UpdateConfig(learning_rate=learning_rate, micro_batch_size=64),
        checkpoints=CheckpointSection(dir=str(workdir / "train-state"), keep=2),
    )


def _reward_by_version(data_dir: Path) -> list[tuple]:
    from lightning_otel.collector import connect

    return (
        connect(data_dir)
        .execute("""
        SELECT policy_versions[1] AS version, count(*) AS rollouts, avg(reward) AS mean_reward,
               avg((reward = 1)::INT) AS solved
        FROM rollouts WHERE reward IS NOT NULL AND len(policy_versions) = 1
        GROUP BY 1 ORDER BY TRY_CAST(version AS INT) NULLS FIRST""")
        .fetchall()
    )


def _prepare_model(workdir: Path, sft_steps: int) -> Path:
    import digit_sum  # this example's task, beside this file

    from lightning_otel.trainer.tiny_model import build_tiny_model

    base, warm = workdir / "model", workdir / "sft"
    if not (base / "config.json").exists():
        print(f"building the tiny model in {base}", flush=True)
        build_tiny_model(base)
    if sft_steps and not (warm / "config.json").exists():
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # TRL prints its metrics dict; the table is the output
            digit_sum.sft_warmup(base, warm, steps=sft_steps)
        print(f"SFT warm-up: {sft_steps} steps in {time.perf_counter() - began:.0f} s -> {warm}", flush=True)
    return warm if sft_steps else base


def run_demo(
    workdir: str | Path,
    iterations: int = 15,
    tasks: int = 8,
    rollouts_per_task: int = 8,
    sft_steps: int = 40,
    learning_rate: float = 2e-3,
    seed: int = 0,
) -> int:
    import digit_sum  # this example's task, beside this file
    from transformers.utils import logging as transformers_logging

    from lightning_otel.core.servers import CollectorProcess, VLLMServer
    from lightning_otel.dashboards.server import DEFAULT_PORT
    from lightning_otel.trainer.training_run import run_once

    transformers_logging.disable_progress_bar()  # keep the table readable
    transformers_logging.set_verbosity_error()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    policy_dir = _prepare_model(workdir, sft_steps)
    data_dir = workdir / "traces"
    collector = CollectorProcess(data_dir, flush_interval_s=0.5, log_path=workdir / "collector.log")
    vllm = VLLMServer(policy_dir, log_path=workdir / "vllm.log")
    rng = random.Random(seed)
    try:
        print(f"starting collector and vLLM (logs in {workdir})", flush=True)
        collector.start()
        vllm_began = time.perf_counter()
        vllm.start()
        print(f"vLLM answered /health {time.perf_counter() - vllm_began:.0f} s after its start", flush=True)
        config = _train_config(workdir, policy_dir, collector, vllm, learning_rate)
        agent_env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.traces_endpoint}
        print(HEADER, flush=True)
        for iteration in range(1, iterations + 1):
            since = time.time()
            task_list = [f"{a}+{b}" for a, b in rng.sample(digit_sum.TRAIN, tasks)]
            subprocess.run(
                [
                    sys.executable,
                    str(HERE / "digit_sum_agent.py"),
                    "--base-url",
                    vllm.base_url,
                    "--tasks",
                    ",".join(task_list),
                    "--rollouts",
                    str(rollouts_per_task),
                ],
                env={**os.environ, **agent_env},
                check=True,
                stdout=subprocess.DEVNULL,
            )
            rollouts, calls = _wait_for_rollouts(data_dir, since, len(task_list) * rollouts_per_task)
            summary = run_once(config)  # raises JobFailed (servers restored) if the swap or probe fails
            if summary.status != "trained":
                raise RuntimeError(f"the training run did not train: {summary.status}, excluded {summary.excluded}")
            print(
                ROW.format(
                    iteration,
                    rollouts,
                    calls,
                    f"{summary.samples / summary.rollouts:.2f}",
                    f"{summary.mean_reward:.3f}",
                    f"{summary.loss:+.1e}",
                    f"{summary.swap_seconds:.2f}",
                ),
                flush=True,
            )
        _wait_for_train_steps(data_dir, iterations)
        print("\nreward by the policy version that served the rollout (SQL over the traces):")
        print(f"{'version':>7} | {'rollouts':>8} | {'mean reward':>11} | {'solved':>6}")
        for version, count, mean_reward, solved in _reward_by_version(data_dir):
            print(f"{version:>7} | {count:>8} | {mean_reward:>11.3f} | {solved:>6.1%}")
        from lightning_otel.dashboards.report import write_report

        report = write_report(data_dir, workdir / "report")
        print(f"\ndone in {time.perf_counter() - began:.0f} s; traces in {data_dir}")
        print(f"report:    {report}")
        print(
            f"dashboard: lightning-otel dashboard --data-dir {data_dir} --tokenizer {policy_dir} --port {DEFAULT_PORT}"
            f"  -> http://127.0.0.1:{DEFAULT_PORT}/"
        )
        return 0
    except KeyboardInterrupt:
        print("interrupted; stopping everything the demo started", file=sys.stderr)
        return 130
    finally:
        vllm.stop()
        collector.stop()


def _wait_for_train_steps(data_dir: Path, expected: int) -> None:
    """The trainer's train_step spans travel through the collector like any other: wait for them."""
    _wait_for(data_dir, "SELECT count(*) FROM train_steps", expected, "train_step spans", timeout_s=30.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="./demo-runs/latest")
    parser.add_argument("--iterations", type=int, default=15, help="train/swap iterations")
    parser.add_argument("--tasks", type=int, default=8, help="sums per iteration")
    parser.add_argument("--rollouts-per-task", type=int, default=8, help="rollouts per task (the GRPO group size)")
    parser.add_argument("--sft-steps", type=int, default=40, help="SFT warm-up steps before RL (0: none)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run_demo(
        workdir=args.workdir,
        iterations=args.iterations,
        tasks=args.tasks,
        rollouts_per_task=args.rollouts_per_task,
        sft_steps=args.sft_steps,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )


if __name__ == "__main__":
    sys.exit(main())
