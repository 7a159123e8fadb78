"""The demo (`make demo`: `examples/tool_use/run.py`) stops everything it started on Ctrl-C, and an example
run's printed rows agree with its trace store (the session's `demo_run`: the digit-sum run, whose
store the dashboard, report and Grafana tests read). Each run starts its own vLLM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_paths import EXAMPLES


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _demo(workdir: Path, iterations: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLES / "tool_use" / "run.py"),
            "--workdir",
            str(workdir),
            "--iterations",
            str(iterations),
            "--tasks",
            "2",
            "--rollouts-per-task",
            "2",
            "--sft-steps",
            "5",  # the loop, not the learning: a short warm-up
            "--eval-tasks",
            "2",  # and a short held-out pass (the whole set is 64 tasks)
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_an_example_run_prints_a_row_per_iteration_a_reward_table_and_stops_everything(demo_run):
    """The session's digit_sum run (conftest: 2 iterations, 4 tasks x 4 rollouts) against its own store."""
    from lightning_otel.collector import connect

    lines = demo_run.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("iter |"))
    names = [name.strip() for name in lines[header].split("|")]
    assert {"samples/rollout", "one-sample", "mean reward", "solved", "swap s"} <= set(names)
    rows = [dict(zip(names, (cell.strip() for cell in line.split("|")))) for line in lines[header + 1 : header + 3]]
    conn = connect(demo_run.data_dir)
    assert [int(r["iter"]) for r in rows] == [1, 2]
    steps = conn.execute("SELECT step, rollouts, mean_reward, samples FROM train_steps ORDER BY step").fetchall()
    assert [s[0] for s in steps] == [1, 2]  # the trainer's metrics reached the same store
    for row, (_, rollouts, mean_reward, samples) in zip(rows, steps):
        assert int(row["rollouts"]) == rollouts == 16  # 4 tasks x 4 rollouts, each trained exactly once
        assert 1 <= int(row["llm calls"]) / 16 <= 3  # one to three LLM calls per rollout
        assert float(row["mean reward"]) == pytest.approx(mean_reward, abs=5e-4 + 1e-9)  # printed with 3 decimals
        assert float(row["samples/rollout"]) == pytest.approx(samples / rollouts, abs=5e-3 + 1e-9)
    # The reward table comes from SQL: every version that served rollouts, with its rollout count.
    first = lines.index(next(line for line in lines if line.startswith("version |"))) + 1
    table = lines[first : lines.index("", first)]
    served = dict(
        conn.execute(
            "SELECT policy_versions[1], count(*) FROM rollouts WHERE len(policy_versions) = 1 AND split = 'train' GROUP BY 1"
        ).fetchall()
    )
    assert {row.split("|")[0].strip(): int(row.split("|")[1]) for row in table} == served
    assert set(served) == {"default", "1"}  # the warmed-up start, then version 1 (version 2 serves no rollout)
    report = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("report:"))
    assert Path(report).is_file()
    assert any(line.startswith("dashboard: lightning-otel dashboard --data-dir") for line in lines)
    assert _processes_mentioning(str(demo_run.workdir)) == []


def test_sigterm_stops_everything_the_demo_started(tmp_path):
    """`kill` (SIGTERM) reaches the demo alone, not its servers: it stops them. Ctrl-C takes the same path
    (training_loop.Terminated is a KeyboardInterrupt); from a terminal it also reaches the servers."""
    process = _demo(tmp_path, iterations=50)
    deadline = time.monotonic() + 300
    seen = ""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen += line
        if line.startswith("   1 |") or not line:  # the first iteration's row: the agent process is up too
            break
    assert "   1 |" in seen, seen
    assert len(_processes_mentioning(str(tmp_path))) >= 2  # collector and vLLM are up
    agents = _processes_mentioning("calculator_agent.py")
    # the training agent and the held-out evaluation's (--split eval), each kept across iterations
    # (their command lines name no workdir)
    assert len(agents) == 2
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, seen + rest
    assert _processes_mentioning(str(tmp_path)) == []
    assert not any(Path(f"/proc/{agent}").exists() for agent in agents)
