"""`lightning-otel demo` end to end, and its clean shutdown on Ctrl-C. Each run starts its own vLLM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


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
        [sys.executable, "-m", "lightning_otel", "demo", "--workdir", str(workdir),
         "--iterations", str(iterations), "--tasks", "2", "--rollouts", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_demo_prints_a_row_per_iteration_and_stops_everything(tmp_path):
    process = _demo(tmp_path, iterations=2)
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("iter |"))
    assert "samples/rollout" in lines[header] and "mean reward" in lines[header] and "swap s" in lines[header]
    rows = [line.split("|") for line in lines[header + 1 :] if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2]
    for row in rows:
        assert int(row[1]) == 4 and int(row[2]) == 8  # 2 tasks x 2 rollouts, 2 LLM calls each
        assert 1.0 <= float(row[3]) <= 2.0
        assert float(row[7]) < 1e-4  # the server serves what the trainer holds
    assert _processes_mentioning(str(tmp_path)) == []


def test_ctrl_c_stops_everything_the_demo_started(tmp_path):
    process = _demo(tmp_path, iterations=50)
    deadline = time.monotonic() + 300
    seen = ""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen += line
        if line.startswith("iter |") or not line:
            break
    assert "iter |" in seen, seen
    assert len(_processes_mentioning(str(tmp_path))) >= 2  # collector and vLLM are up
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == 130, seen + rest
    assert _processes_mentioning(str(tmp_path)) == []
