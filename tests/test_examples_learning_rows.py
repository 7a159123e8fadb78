"""bench/examples_learning.py reads an example run's iteration table from its output: the held-out
eval lines printed between iterations are skipped, not taken for the table's end (they were, and a
77-iteration run was summarised as 10 iterations)."""

from __future__ import annotations

import importlib.util

from repo_paths import REPO

_SPEC = importlib.util.spec_from_file_location("examples_learning", REPO / "bench" / "examples_learning.py")
examples_learning = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(examples_learning)

HEADER = "iter | rollouts | llm calls | samples/rollout | one-sample | mean reward | solved | swap s"
EVAL = "eval | version {v:>6} |    64 tasks |    64 rollouts | solved  20.3% [12.3% to 31.7%] | mean reward 0.203"


def _row(n: int) -> str:
    return f"{n:4d} |      128 |       246 |            1.01 |      99.2% |       0.055 |   5.5% |   0.05"


def test_eval_lines_between_iterations_do_not_end_the_table():
    lines = ["SFT warm-up: 693 steps in 188 s", EVAL.format(v="default"), HEADER]
    for n in range(1, 26):
        lines.append(_row(n))
        if n % 10 == 0:
            lines.append(EVAL.format(v=n))
    lines += [EVAL.format(v=25), "", "25 iterations in 200 s"]
    table = examples_learning.rows("\n".join(lines))
    assert [int(row["iter"]) for row in table] == list(range(1, 26))
    assert table[0]["solved"] == "5.5%" and table[-1]["rollouts"] == "128"
