"""The text-to-SQL task: questions about a small DuckDB database that the example makes.

Database (`make_database`): one table, employees(name, department, city, salary), 24 rows drawn
from a fixed seed. Questions come from templates, each with its gold query, e.g. "How many
employees work in Sales?" -> SELECT count(*) FROM employees WHERE department = 'Sales'.
Reward: 1 when the rows of the last query the agent ran equal the gold query's rows (as a
multiset: order does not count), else 0.

`sft_examples` are what the SFT warm-up shows the model: one prompt -> completion pair per model
call of a solved rollout (the query, then the answer).

Splits: every question belongs to exactly one of SPLITS, cut by a hash of its text (`split_of`), so the
warm-up's demonstrations, the RL tasks and the held-out evaluation never share a question, whatever
the seed: disjoint by construction (tests/examples/test_example_task_splits.py). Each template's
questions are cut into the splits, so a held-out question is an unseen combination of seen words: its
template, department, city or amount were all shown, in other questions.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections import Counter
from pathlib import Path

SYSTEM_PROMPT = "Answer with the run_sql tool. Table: employees(name, department, city, salary)."
DEPARTMENTS = ("Sales", "Research", "Support", "Finance")
CITIES = ("Paris", "Lima", "Oslo", "Cairo")
NAMES = (
    "Ana",
    "Ben",
    "Cleo",
    "Dan",
    "Eva",
    "Finn",
    "Gia",
    "Hugo",
    "Ines",
    "Jon",
    "Kai",
    "Lea",
    "Max",
    "Nia",
    "Omar",
    "Pia",
    "Quin",
    "Rosa",
    "Sam",
    "Tara",
    "Uma",
    "Vic",
    "Wes",
    "Yara",
)
TEMPLATES = (
    ("How many employees work in {department}?", "SELECT count(*) FROM employees WHERE department = '{department}'"),
    ("How many employees live in {city}?", "SELECT count(*) FROM employees WHERE city = '{city}'"),
    (
        "What is the highest salary in {department}?",
        "SELECT max(salary) FROM employees WHERE department = '{department}'",
    ),
    ("What is the lowest salary in {city}?", "SELECT min(salary) FROM employees WHERE city = '{city}'"),
    ("Who works in {city}?", "SELECT name FROM employees WHERE city = '{city}'"),
    ("Who works in {department}?", "SELECT name FROM employees WHERE department = '{department}'"),
    ("How many employees earn more than {amount}?", "SELECT count(*) FROM employees WHERE salary > {amount}"),
    (
        "Who in {department} earns more than {amount}?",
        "SELECT name FROM employees WHERE department = '{department}' AND salary > {amount}",
    ),
)
# Below every department's highest salary (8,100 to 8,700 in the example's database): no question has an
# empty answer, which any query returning no rows would match
AMOUNTS = tuple(range(3000, 8000, 200))
# Shares of each template's questions, in percent (`_split_template`). Of the 149 questions (six
# templates x 4 values, one x 25 amounts, one x 4 departments x 25 amounts): 37 held out, 50 for the
# warm-up, 62 for RL.
SPLITS = {"eval": 25, "warm_up": 35, "rl": 40}
# The fixed held-out evaluation set (`eval_tasks`): 32 of the 37 held-out questions. The task space is
# small, so this is below the 64 a larger one would allow; a bigger eval share would starve the warm-up.
EVAL_TASKS = 32


def make_database(path: Path, seed: int = 0) -> Path:
    """Write the example's database (overwriting it): 24 employees with a department, a city and a salary."""
    import duckdb

    rng = random.Random(seed)
    path.unlink(missing_ok=True)
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE TABLE employees (name VARCHAR, department VARCHAR, city VARCHAR, salary INTEGER)")
        rows = [(name, rng.choice(DEPARTMENTS), rng.choice(CITIES), rng.randrange(3000, 9000, 100)) for name in NAMES]
        conn.executemany("INSERT INTO employees VALUES (?, ?, ?, ?)", rows)
    return path


def _tasks_of(template: tuple[str, str]) -> list[tuple[str, str]]:
    """Every (question, gold query) `template` makes, each once."""
    question, gold = template
    values = (
        {"department": department, "city": city, "amount": amount}
        for department, city, amount in itertools.product(DEPARTMENTS, CITIES, AMOUNTS)
    )
    # a template without {city} makes the same task for every city: kept once, in first-seen order
    return list(dict.fromkeys((question.format(**v), gold.format(**v)) for v in values))


def _split_template(tasks: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """One template's questions cut into SPLITS' shares, in the order of a hash of their text (not of a
    seed): every template has questions in every split, the smallest (4 questions) 1 + 1 + 2."""
    ordered = sorted(tasks, key=lambda task: hashlib.sha256(task[0].encode()).digest())
    ends = [round(len(ordered) * end / 100) for end in itertools.accumulate(SPLITS.values())]
    return {split: ordered[start:end] for split, start, end in zip(SPLITS, [0, *ends], ends)}


# split -> one list per template (TEMPLATES' order) of that template's questions in the split
_TASKS: dict[str, list[list[tuple[str, str]]]] = {split: [] for split in SPLITS}
for _template in TEMPLATES:
    for _split, _tasks in _split_template(_tasks_of(_template)).items():
        _TASKS[_split].append(_tasks)


def split_of(question: str) -> str:
    """The split `question` belongs to."""
    return next(
        split for split, by_template in _TASKS.items() for tasks in by_template for q, _ in tasks if q == question
    )


def make_task(rng: random.Random, split: str = "rl") -> tuple[str, str]:
    """(question, gold query), drawn from `split`: the template first, so that a template with more
    values is not asked more often, then one of its questions."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
    return rng.choice(rng.choice(_TASKS[split]))


def eval_tasks(count: int = EVAL_TASKS) -> list[tuple[str, str]]:
    """The held-out evaluation set: `count` questions of the eval split, the same for every seed."""
    return random.Random("eval").sample([task for tasks in _TASKS["eval"] for task in tasks], count)


def run_query(database: Path, query: str) -> list[tuple]:
    """The rows of `query` on a read-only connection (a query that writes fails)."""
    import duckdb

    with duckdb.connect(str(database), read_only=True) as conn:
        return conn.execute(query).fetchall()


def rows_text(rows: list[tuple]) -> str:
    """What the tool returns to the model: the rows as JSON."""
    return json.dumps([list(row) for row in rows], default=str)


def reward(last_rows: list[tuple] | None, gold_rows: list[tuple]) -> float:
    return 1.0 if last_rows is not None and Counter(last_rows) == Counter(gold_rows) else 0.0


def sft_examples(count: int, rng: random.Random, database: Path) -> list[dict]:
    """Prompt -> completion pairs of solved rollouts, two per task (the query, the answer)."""
    examples = []
    for _ in range(count):
        question, gold = make_task(rng, "warm_up")
        call = {"id": "call_0", "type": "function", "function": {"name": "run_sql", "arguments": {"query": gold}}}
        start = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        calling = {"role": "assistant", "content": None, "tool_calls": [call]}
        result = rows_text(run_query(database, gold))
        answered = start + [calling, {"role": "tool", "tool_call_id": "call_0", "content": result}]
        examples.append({"prompt": start, "completion": [calling]})
        examples.append({"prompt": answered, "completion": [{"role": "assistant", "content": result}]})
    return examples
