"""The examples' long-running agent process (`training_loop.AgentProcess`): one line of work in, one
answer line out (other stdout lines go to its log), per iteration, from the same process; a script that
dies gets a clear error with the end of its log, and stopping it ends it. Real child processes running
small scripts."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from repo_paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import training_loop

ANSWERS = """
import os, sys
for n, line in enumerate(sys.stdin):
    print(f"work {line.strip()!r}", file=sys.stderr, flush=True)
    print("a library printing to stdout", flush=True)
    print(f"@answer {os.getpid()} {n} {line.strip().upper()}", flush=True)
"""
DIES = """
import sys
sys.stdin.readline()
print("the agent broke here", file=sys.stderr, flush=True)
sys.exit(3)
"""


def script(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_each_work_line_gets_its_answer_from_one_process(tmp_path):
    agent = training_loop.AgentProcess(script(tmp_path, ANSWERS), (), dict(os.environ), tmp_path / "agent.log")
    try:
        first, second = agent.request("a=1"), agent.request("b=2")
    finally:
        agent.stop()
    pid, number, text = first.split()
    assert (number, text) == ("0", "A=1")
    assert second.split() == [pid, "1", "B=2"]  # the same process, its second line
    assert agent.process.returncode == 0  # closing its stdin ended it
    log = (tmp_path / "agent.log").read_text()
    assert "work 'b=2'" in log  # its stderr goes to the log ...
    assert log.count("a library printing to stdout") == 2  # ... and so do stdout lines that are not answers


def test_an_agent_that_dies_is_reported_with_its_exit_code_and_log(tmp_path):
    agent = training_loop.AgentProcess(script(tmp_path, DIES), (), dict(os.environ), tmp_path / "agent.log")
    try:
        with pytest.raises(RuntimeError, match=r"(?s)exited with code 3.*the agent broke here"):
            agent.request("a=1")
    finally:
        agent.stop()


def test_iterations_reuse_the_started_agent(tmp_path):
    agents: dict = {}
    answers = []
    try:
        for number in (1, 2):
            iteration = training_loop.Iteration(
                number, "http://unused", "policy", None, 1, 1, tmp_path, "http://unused", agents
            )
            answers.append(iteration.ask_agent(script(tmp_path, ANSWERS), ("--x",), f"w{number}"))
    finally:
        for agent in agents.values():
            agent.stop()
    assert len(agents) == 1
    assert answers[0].split()[0] == answers[1].split()[0]  # one process answered both
    assert (tmp_path / "agent.log").read_text().count("--- iteration") == 2
