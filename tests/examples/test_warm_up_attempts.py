"""tool_use's warm-up starts over from another initialization and draw of demonstrations when an
attempt has not passed its check in WARM_UP_ATTEMPT_STEPS, within the run's step budget, and keeps the
attempt that passed. A real attempt takes minutes of SFT: here an attempt is a stand-in that passes
or fails as told (its own behaviour is tests/examples/test_warm_up_stop.py's)."""

from __future__ import annotations

import json
import sys

import pytest
from repo_paths import EXAMPLES

TOOL_USE = EXAMPLES / "tool_use"
sys.path[:0] = [str(TOOL_USE), str(TOOL_USE.parent)]
import run as tool_use  # noqa: E402

ATTEMPT = tool_use.WARM_UP_ATTEMPT_STEPS


@pytest.fixture
def attempts(monkeypatch):
    """The attempts run, as (start model, steps, attempt); the one given in `passes` passes after 700 steps."""
    ran: list[tuple[str, int, int]] = []
    built: list[int] = []
    passes: dict[str, int | None] = {"at": None}

    def attempt(start, out, steps, learning_rate, seed, number):
        ran.append((start.name, steps, number))
        out.mkdir(parents=True)
        (out / "weights").write_text(f"attempt {number}")
        passed = number == passes["at"]
        return {"steps": 700 if passed else steps, "max_steps": steps, "passed": passed}

    def build_model(out, seed):
        built.append(seed)
        return out

    monkeypatch.setattr(tool_use, "_warm_up_attempt", attempt)
    monkeypatch.setattr(tool_use, "build_model", build_model)
    return ran, built, passes


def test_a_failed_attempt_starts_over_from_another_initialization_and_the_passing_one_is_kept(attempts, tmp_path):
    ran, built, passes = attempts
    passes["at"] = 2
    base, out = tmp_path / "base", tmp_path / "sft"
    tool_use.warm_up(base, out, 5 * ATTEMPT, 2e-3, seed=3)
    assert ran == [("base", ATTEMPT, 0), ("model", ATTEMPT, 1), ("model", ATTEMPT, 2)]
    assert built == [tool_use.attempt_seed(3, 1), tool_use.attempt_seed(3, 2)] and len(set(built + [3])) == 3
    assert (out / "weights").read_text() == "attempt 2"
    record = json.loads((out / "warm_up.json").read_text())
    assert record == {"steps": 2 * ATTEMPT + 700, "max_steps": 5 * ATTEMPT, "passed": True, "attempts": 3}


def test_attempts_stop_at_the_step_budget_and_say_the_check_never_passed(attempts, tmp_path):
    ran, _, _ = attempts
    out = tmp_path / "sft"
    tool_use.warm_up(tmp_path / "base", out, ATTEMPT + 400, 2e-3, seed=0)
    assert ran == [("base", ATTEMPT, 0), ("model", 400, 1)]
    record = json.loads((out / "warm_up.json").read_text())
    assert record == {"steps": ATTEMPT + 400, "max_steps": ATTEMPT + 400, "passed": False, "attempts": 2}
    assert (out / "weights").read_text() == "attempt 1"


def test_each_attempt_draws_other_demonstrations_and_the_first_is_the_runs_own():
    first, check = tool_use.warm_up_data(5)
    assert tool_use.warm_up_data(5, attempt=0) == (first, check)
    second, second_check = tool_use.warm_up_data(5, attempt=1)
    assert second_check == check  # one stopping check for every attempt
    assert [pair["prompt"] for pair in second] != [pair["prompt"] for pair in first]
