"""What an example's agent gets each iteration (`Iteration`), and the long-running agent process some
examples keep across iterations (`AgentProcess`). `training_loop` re-exports both."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


def agent_failed(script: Path, code: int, log_path: Path) -> RuntimeError:
    """The error for an agent script that exited: its code and the end of its log."""
    return RuntimeError(f"{script.name} exited with code {code}; {log_path} ends:\n{log_path.read_text()[-3000:]}")


# The line that ends an agent's answer to one line of work starts with this; any other line it (or a
# library in it) prints to stdout goes to agent.log, so a stray print cannot pass for an answer.
ANSWER_PREFIX = "@answer "


class AgentProcess:
    """An agent script kept running across iterations, for agents whose imports and setup take seconds
    (the OpenAI Agents SDK's take ~2.5 s here, a quarter of a small iteration). The script reads one
    line of work from stdin per iteration and prints one line starting with ANSWER_PREFIX once that
    work's rollouts are done and their spans exported; its other output goes to agent.log."""

    def __init__(self, script: Path, args: tuple[str, ...], env: dict[str, str], log_path: Path):
        self.script, self.log_path = script, log_path
        with open(log_path, "a") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, str(script), *args],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    def request(self, work: str) -> str:
        """Send one line of work; return the agent's answer line, without ANSWER_PREFIX."""
        try:
            self.process.stdin.write(work + "\n")
            self.process.stdin.flush()
            while (line := self.process.stdout.readline()) and not line.startswith(ANSWER_PREFIX):
                with open(self.log_path, "a") as log:
                    log.write(line)
        except BrokenPipeError:
            line = ""
        if not line:
            raise agent_failed(self.script, self.process.wait(timeout=10), self.log_path)
        return line.removeprefix(ANSWER_PREFIX).strip()

    def stop(self) -> None:
        """Close its stdin (the agent's signal to finish) and wait; kill it if it does not end."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Iteration:
    """What an example's agent needs to run one iteration's rollouts."""

    number: int
    base_url: str  # vLLM's OpenAI-compatible API
    model: str  # the served model name
    rng: random.Random  # draws this iteration's tasks (seeded by --seed)
    tasks: int
    rollouts_per_task: int
    workdir: Path
    otlp_endpoint: str
    agents: dict[tuple, AgentProcess] = field(default_factory=dict)  # kept across iterations by `run`
    split: str = "train"  # "eval": the held-out evaluation pass (Example.run_eval), never trained on

    def _agent_env(self) -> dict[str, str]:
        return {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.otlp_endpoint}

    def _log_iteration(self) -> Path:
        log_path = self.workdir / "agent.log"
        with open(log_path, "a") as log:
            log.write(f"--- iteration {self.number}\n")
        return log_path

    def run_script(self, script: Path, *args: str) -> None:
        """Run an agent script with OTLP pointed at the collector; its output goes to agent.log."""
        log_path = self._log_iteration()
        with open(log_path, "a") as log:
            done = subprocess.run(
                [sys.executable, str(script), *args], env=self._agent_env(), stdout=log, stderr=subprocess.STDOUT
            )
        if done.returncode != 0:
            raise agent_failed(script, done.returncode, log_path)

    def ask_agent(self, script: Path, args: tuple[str, ...], work: str) -> str:
        """Give this iteration's `work` to `script` started once with `args` (`AgentProcess`)."""
        log_path = self._log_iteration()
        key = (script, args)
        if key not in self.agents:
            self.agents[key] = AgentProcess(script, args, self._agent_env(), log_path)
        return self.agents[key].request(work)
