"""The text-to-SQL task: questions about a small DuckDB database that the example makes.

Database (`make_database`): one table, employees(name, department, city, salary), 24 rows drawn
from a fixed seed. Questions come from templates, each with its gold query, e.g. "How many
employees work in Sales?" -> SELECT count(*) FROM employees WHERE department = 'Sales'.
Reward: 1 when the rows of the last query the agent ran equal the gold query's rows (as a
multiset: order does not count), else 0.

`sft_examples` are what the SFT warm-up shows the model: one prompt -> completion pair per model
call of a solved rollout (the query, then the answer).
"""

from __future__ import annotations

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
)


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


def make_task(rng: random.Random) -> tuple[str, str]:
    """(question, gold query)."""
    question, gold = rng.choice(TEMPLATES)
    values = {"department": rng.choice(DEPARTMENTS), "city": rng.choice(CITIES)}
    return question.format(**values), gold.format(**values)


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
        question, gold = make_task(rng)
        call = {"id": "call_0", "type": "function", "function": {"name": "run_sql", "arguments": {"query": gold}}}
        start = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        calling = {"role": "assistant", "content": None, "tool_calls": [call]}
        result = rows_text(run_query(database, gold))
        answered = start + [calling, {"role": "tool", "tool_call_id": "call_0", "content": result}]
        examples.append({"prompt": start, "completion": [calling]})
        examples.append({"prompt": answered, "completion": [{"role": "assistant", "content": result}]})
    return examples
