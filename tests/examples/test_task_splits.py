"""The tool_use example's questions: the warm-up's demonstrations, its stopping check, the RL tasks and
the held-out evaluation set never share a question (nor its mirror, a * b for b * a), for any seed.
A learning claim is read off the evaluation set, so an overlap would let memorised answers count."""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import pytest
from repo_paths import EXAMPLES

TOOL_USE = EXAMPLES / "tool_use"
sys.path[:0] = [str(TOOL_USE), str(TOOL_USE.parent)]
import calculator_task  # noqa: E402
import run as tool_use  # noqa: E402


def _operands(question: str) -> frozenset[int]:
    a, b = (int(x) for x in calculator_task.expression_of(question).split("*"))
    return frozenset((a, b))  # a * b and b * a: one question as far as memorising goes


def _rl_questions(seed: int, iterations: int, tasks: int) -> set[frozenset[int]]:
    """What the loop's agent is asked over `iterations`: run.run_agent's own draws, from the loop's rng."""
    asked: list[str] = []
    iteration = SimpleNamespace(
        rng=random.Random(seed),  # training_loop.run's rng
        tasks=tasks,
        rollouts_per_task=1,
        split="train",
        base_url="http://unused",
        model="policy",
        ask_agent=lambda script, args, work: asked.extend(item.split("=")[0] for item in work.split(";")),
    )
    for _ in range(iterations):
        tool_use.run_agent(iteration)
    return {_operands(q) for q in asked}


def test_every_question_is_in_exactly_one_split_and_a_mirror_in_the_same_one():
    everything = [(a, b) for a in calculator_task.OPERANDS for b in calculator_task.OPERANDS]
    by_split = {split: set(calculator_task.operands_in(split)) for split in calculator_task.SPLITS}
    assert sum(len(members) for members in by_split.values()) == len(everything) == 68 * 68
    assert set().union(*by_split.values()) == set(everything)
    for a, b in everything:
        assert calculator_task.split_of(a, b) == calculator_task.split_of(b, a)
    for split, share in calculator_task.SPLITS.items():  # each split near its share: the hash spreads
        assert abs(len(by_split[split]) / len(everything) - share / 100) < 0.03, split
    with pytest.raises(ValueError, match="unknown split"):
        calculator_task.operands_in("test")


@pytest.mark.parametrize("seed", range(8))
def test_warm_up_check_rl_and_eval_questions_are_disjoint_for_every_seed(seed):
    iterations, tasks = 40, tool_use.EXAMPLE.defaults["tasks"]  # 40: what --iterations 40 asks
    _, check = tool_use.warm_up_data(seed)
    attempts = -(-tool_use.EXAMPLE.defaults["sft_steps"] // tool_use.WARM_UP_ATTEMPT_STEPS)  # run.warm_up's most
    warm_up = {  # every attempt's demonstrations
        _operands(pair["prompt"][1]["content"])
        for attempt in range(attempts)
        for pair in tool_use.warm_up_data(seed, attempt=attempt)[0]
    }
    checked = {_operands(question) for question, _ in check}
    rl = _rl_questions(seed, iterations * 4, tasks)  # four such runs
    evaluated = {_operands(question) for question, _ in calculator_task.eval_tasks()}
    assert len(evaluated) == calculator_task.EVAL_TASKS
    sets = {"warm_up": warm_up, "warm_up_check": checked, "rl": rl, "eval": evaluated}
    for first, second in ((x, y) for x in sets for y in sets if x < y):
        assert not sets[first] & sets[second], (
            seed,
            first,
            second,
            sorted(map(sorted, sets[first] & sets[second]))[:5],
        )
    # Not vacuous: each stream drew many distinct questions.
    assert len(warm_up) > 200 and len(checked) > 40 and len(rl) > 1000


def test_the_eval_set_is_fixed_across_seeds_and_runs():
    assert calculator_task.eval_tasks() == calculator_task.eval_tasks()
    for question, result in calculator_task.eval_tasks():
        a, b = (int(x) for x in calculator_task.expression_of(question).split("*"))
        assert result == a * b and calculator_task.split_of(a, b) == "eval"
