"""The coding task: tiny generated repositories, each with one failing test, fixed with bash.

A repository (`make_repo`, in a temporary directory of its own): `<module>.py` with one
two-argument function whose operator is wrong (`add` returning `a - b`), and `test_<module>.py`,
a script asserting one call's value. The task text names the failing test; the agent edits the
module with bash commands. Reward: 1 when `python test_<module>.py` exits 0 after the agent
stopped, else 0.

The agent is mini-SWE-agent with its stock text-based configuration (`mini_textbased.yaml`: one
bash block per answer); `agent_config` only sets the step limit. `sft_examples` runs that same
agent with mini-SWE-agent's scripted model (fix, run the test, submit) on generated repositories,
so the warm-up shows the model exactly the conversations the harness builds.

Splits: every task belongs to exactly one of SPLITS, by a hash of its text (`split_of`: the module,
the function and the arguments; the wrong operator is not in the text), so the warm-up's scripted
runs, the RL tasks and the held-out evaluation never share a task text, whatever the seed: disjoint by
construction (tests/examples/test_example_task_splits.py). A held-out task is an unseen combination of
a module, a function and two arguments, each seen in other tasks; its fix is the same kind of `sed`
on the module's operator the warm-up shows, so the evaluation measures whether the agent carries that
over to a task text it was never trained on.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

OPERATORS = {"add": "+", "subtract": "-", "multiply": "*"}
MODULES = ("calc", "mathlib", "arith", "ops", "numbers")
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# Shares of the 960 task texts (5 modules x 3 functions x 8 x 8 arguments), in percent of the hash
# space; each text comes with both wrong operators: 200 eval tasks (100 texts), 550 warm-up, 1,170 RL.
SPLITS = {"eval": 10, "warm_up": 30, "rl": 60}
# The fixed held-out evaluation set (`eval_tasks`): 32 rollouts, about two RL iterations' worth on CPU
# (4 tasks x 4 rollouts each), run before the first update and at the end of a default run.
EVAL_TASKS = 32


@dataclass(frozen=True)
class Task:
    module: str
    function: str
    wrong: str  # the operator the generated module uses instead of the right one
    x: int
    y: int

    @property
    def right(self) -> str:
        return OPERATORS[self.function]

    @property
    def expected(self) -> int:
        return {"+": self.x + self.y, "-": self.x - self.y, "*": self.x * self.y}[self.right]

    @property
    def text(self) -> str:
        call = f"{self.function}({self.x}, {self.y})"
        return f"The test test_{self.module}.py fails: {call} should be {self.expected}. Fix {self.module}.py."

    @property
    def fix(self) -> str:
        pattern = self.wrong.replace("*", "\\*")  # sed's basic regex: * repeats, \* is the character
        return f"sed -i 's/a {pattern} b/a {self.right} b/' {self.module}.py"

    def encode(self) -> str:
        return f"{self.module},{self.function},{self.wrong},{self.x},{self.y}"

    @classmethod
    def decode(cls, text: str) -> Task:
        module, function, wrong, x, y = text.split(",")
        return cls(module, function, wrong, int(x), int(y))


def split_of(task: Task) -> str:
    """The split `task` belongs to: a hash of its text (not of a seed) into SPLITS' shares. Two tasks
    that differ only in the wrong operator have one text, so they share a split."""
    bucket = int.from_bytes(hashlib.sha256(task.text.encode()).digest()[:8], "big") % 100
    return next(split for split, end in zip(SPLITS, itertools.accumulate(SPLITS.values())) if bucket < end)


def _every_task() -> list[Task]:
    return [
        Task(module, function, wrong, x, y)
        for module in MODULES
        for function in sorted(OPERATORS)
        for wrong in sorted(set(OPERATORS.values()) - {OPERATORS[function]})
        for x in range(2, 10)
        for y in range(2, 10)
    ]


_TASKS = {split: [task for task in _every_task() if split_of(task) == split] for split in SPLITS}


def make_task(rng: random.Random, split: str = "rl") -> Task:
    """A task drawn from `split` (each of the 1,920 tasks is in one)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
    return rng.choice(_TASKS[split])


def eval_tasks(count: int = EVAL_TASKS) -> list[Task]:
    """The held-out evaluation set: `count` tasks of the eval split (no two with one text), the same
    for every seed."""
    one_per_text = list({task.text: task for task in _TASKS["eval"]}.values())
    return random.Random("eval").sample(one_per_text, count)


def make_repo(task: Task, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{task.module}.py").write_text(f"def {task.function}(a, b):\n    return a {task.wrong} b\n")
    (directory / f"test_{task.module}.py").write_text(
        f"from {task.module} import {task.function}\n\n"
        f"assert {task.function}({task.x}, {task.y}) == {task.expected}, {task.function}({task.x}, {task.y})\n"
        'print("test passed")\n'
    )
    return directory


def reward(task: Task, directory: Path) -> float:
    try:
        done = subprocess.run(
            [sys.executable, f"test_{task.module}.py"], cwd=directory, capture_output=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        return 0.0
    return 1.0 if done.returncode == 0 else 0.0


def agent_config(step_limit: int) -> dict:
    """mini-SWE-agent's stock text-based configuration, with a step limit."""
    import yaml
    from minisweagent.config import get_config_path

    config = yaml.safe_load(get_config_path("mini_textbased.yaml").read_text())
    config["agent"]["step_limit"] = step_limit
    return config


def _answer(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


def sft_examples(count: int, rng: random.Random, step_limit: int) -> list[dict]:
    """Prompt -> completion pairs from scripted runs of the stock agent: fix, run the test, submit."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.test_models import DeterministicModel, make_output

    config = agent_config(step_limit)
    examples = []
    with tempfile.TemporaryDirectory(prefix="coding-sft-") as root:
        for index in range(count):
            task = make_task(rng, "warm_up")
            repo = make_repo(task, Path(root) / str(index))
            outputs = [
                make_output(
                    _answer(f"{task.function} uses the wrong operator; fix it.", task.fix), [{"command": task.fix}]
                ),
                make_output(
                    _answer("Run the test.", f"python test_{task.module}.py"),
                    [{"command": f"python test_{task.module}.py"}],
                ),
                make_output(_answer("The test passes; submit.", SUBMIT), [{"command": SUBMIT}]),
            ]
            model = DeterministicModel(outputs=outputs, observation_template=config["model"]["observation_template"])
            agent = DefaultAgent(model, LocalEnvironment(**config["environment"], cwd=str(repo)), **config["agent"])
            agent.run(task.text)
            messages = [{"role": m["role"], "content": m["content"]} for m in agent.messages if m["role"] != "exit"]
            for position, message in enumerate(messages):
                if message["role"] == "assistant":
                    examples.append({"prompt": messages[:position], "completion": [message]})
    return examples
