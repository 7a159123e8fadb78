"""The text_to_sql and coding examples' tasks: the warm-up's demonstrations, the RL tasks and the
held-out evaluation set never share a task, for any seed, and the evaluation set is the same for
every seed. Each stream is read from what the example itself does: its warm-up data function, and
its run_agent / run_eval with an iteration that records the tasks instead of starting the agent."""

from __future__ import annotations

import importlib.util
import random
import sys
from types import SimpleNamespace

import pytest
from repo_paths import EXAMPLES


def _example(name: str):
    """The example's run.py and its task module (each example's run.py puts its folder on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"{name}_run_for_splits", EXAMPLES / name / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SQL = _example("text_to_sql")
CODING = _example("coding")
sql_task, coding_task = sys.modules["sql_task"], sys.modules["coding_task"]


def _asked(run, seed: int, iterations: int, tasks: int, split: str = "train") -> list[str]:
    """The tasks `run` (run_agent or run_eval) sends to the agent over `iterations`, as the agent reads
    them from its --tasks argument."""
    asked: list[str] = []

    def run_script(script, *args):
        arguments = list(args)
        assert arguments[arguments.index("--split") + 1] == split
        asked.extend(arguments[arguments.index("--tasks") + 1].split(";"))

    iteration = SimpleNamespace(
        rng=random.Random(seed),  # training_loop.run's rng
        tasks=tasks,
        rollouts_per_task=1,
        split=split,
        base_url="http://unused",
        model="policy",
        workdir=None,
        run_script=run_script,
    )
    for _ in range(iterations):
        run(iteration)
    return asked


def _text(encoded: str) -> str:
    return coding_task.Task.decode(encoded).text


def _check_disjoint(sets: dict[str, set]) -> None:
    for first, second in ((x, y) for x in sets for y in sets if x < y):
        shared = sets[first] & sets[second]
        assert not shared, (first, second, sorted(shared)[:5])


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    return sql_task.make_database(tmp_path_factory.mktemp("sql") / "employees.duckdb")


@pytest.fixture
def sql_without_database(monkeypatch, tmp_path):
    """The questions do not depend on the rows: skip DuckDB (400 queries a seed) for speed."""
    monkeypatch.setattr(SQL, "database", lambda workdir: tmp_path / "unused.duckdb")
    monkeypatch.setattr(sql_task, "run_query", lambda database, query: [])
    return tmp_path / "unused.duckdb"


@pytest.mark.parametrize("seed", range(10))
def test_text_to_sql_warm_up_rl_and_eval_questions_are_disjoint(seed, sql_without_database):
    defaults = SQL.EXAMPLE.defaults
    # what run.warm_up shows the model
    examples = sql_task.sft_examples(400, random.Random(seed), sql_without_database)
    warm_up = {pair["prompt"][1]["content"] for pair in examples}
    rl = {task.split("=", 1)[0] for task in _asked(SQL.run_agent, seed, defaults["iterations"] * 4, defaults["tasks"])}
    evaluated = {task.split("=", 1)[0] for task in _asked(SQL.run_eval, seed, 1, 0, split="eval")}
    assert len(evaluated) == sql_task.EVAL_TASKS
    _check_disjoint({"warm_up": warm_up, "rl": rl, "eval": evaluated})
    assert len(warm_up) > 30 and len(rl) > 40  # not vacuous: each stream drew many distinct questions


@pytest.mark.parametrize("seed", range(10))
def test_coding_warm_up_rl_and_eval_tasks_are_disjoint(seed):
    defaults = CODING.EXAMPLE.defaults
    # run.warm_up's data: sft_examples(100, Random(seed)) runs the scripted agent on each task; its tasks
    # are the rng's draws, which this replays without running the agent (checked once below).
    # Compared by task text, the prompt the agent sees (the wrong operator is not in it).
    rng = random.Random(seed)
    warm_up = {coding_task.make_task(rng, "warm_up").text for _ in range(100)}
    rl = {_text(task) for task in _asked(CODING.run_agent, seed, defaults["iterations"] * 20, defaults["tasks"])}
    evaluated = {_text(task) for task in _asked(CODING.run_eval, seed, 1, 0, split="eval")}
    assert len(evaluated) == coding_task.EVAL_TASKS
    _check_disjoint({"warm_up": warm_up, "rl": rl, "eval": evaluated})
    assert len(warm_up) > 50 and len(rl) > 200


def test_the_text_to_sql_warm_up_shows_the_tasks_of_its_own_split(database):
    examples = sql_task.sft_examples(5, random.Random(7), database)
    rng = random.Random(7)
    expected = [sql_task.make_task(rng, "warm_up") for _ in range(5)]
    calls = examples[0::2]
    assert [pair["prompt"][1]["content"] for pair in calls] == [question for question, _ in expected]
    assert [pair["completion"][0]["tool_calls"][0]["function"]["arguments"]["query"] for pair in calls] == [
        gold for _, gold in expected
    ]


def test_the_coding_warm_up_runs_the_tasks_of_its_own_split():
    examples = coding_task.sft_examples(3, random.Random(7), 4)
    rng = random.Random(7)
    expected = [coding_task.make_task(rng, "warm_up").text for _ in range(3)]
    shown = [pair["prompt"][1]["content"] for pair in examples if len(pair["prompt"]) == 2]
    assert [next(e for e in expected if e in text) for text in shown] == expected


def test_every_task_is_in_one_split_and_the_eval_sets_are_fixed():
    for module in (sql_task, coding_task):
        assert module.eval_tasks() == module.eval_tasks()
        with pytest.raises(ValueError, match="unknown split"):
            module.make_task(random.Random(0), "test")
    assert all(sql_task.split_of(question) == "eval" for question, _ in sql_task.eval_tasks())
    assert all(coding_task.split_of(task) == "eval" for task in coding_task.eval_tasks())
    # every text_to_sql template is asked in every split, so a held-out question's template was shown
    for split in sql_task.SPLITS:
        assert all(sql_task._TASKS[split]), split


def test_every_coding_task_is_in_one_split_and_one_text_in_one_split():
    every = coding_task._every_task()
    by_split = {split: set(coding_task._TASKS[split]) for split in coding_task.SPLITS}
    assert sum(map(len, by_split.values())) == len(every) == 5 * 3 * 2 * 8 * 8
    assert set().union(*by_split.values()) == set(every)
    texts = {split: {task.text for task in tasks} for split, tasks in by_split.items()}
    _check_disjoint(texts)  # the other wrong operator of a held-out text is held out too
    assert len({task.text for task in coding_task.eval_tasks()}) == coding_task.EVAL_TASKS


@pytest.mark.parametrize("example", [SQL, CODING], ids=["text_to_sql", "coding"])
def test_run_eval_asks_the_same_held_out_set_for_every_seed_and_honours_eval_tasks(example, sql_without_database):
    """run_eval ignores the loop's seeded rng: every seed evaluates one fixed set, and --eval-tasks N
    (iteration.tasks) asks its first N."""
    asked = [_asked(example.run_eval, seed, 1, 0, split="eval") for seed in range(10)]
    assert all(tasks == asked[0] for tasks in asked), "the held-out set depends on the seed"
    assert len(set(asked[0])) == len(asked[0]) > 0
    assert _asked(example.run_eval, 3, 1, 5, split="eval") == asked[0][:5]
