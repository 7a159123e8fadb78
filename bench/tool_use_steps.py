"""Where a tool_use run's rollouts fail, per ten policy versions, from SQL over its traces: the first
call (a tool call at all, the question's expression exactly) and the answer given the right call.

    python bench/tool_use_steps.py DIR/seed-2/traces

One line per ten versions: rollouts; share whose first call is a tool call; share whose call carries
the question's expression; share solved; and, of the rollouts with the right call, the share solved
(the answer step: copying the tool's result). A rollout counts under the version of its first call.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "tool_use"))
import calculator_task  # the example's task: what the right call's expression is

CALLS = """
SELECT l.rollout_id, l.policy_version, l.output_messages, r.reward, r.task_id
FROM llm_calls l JOIN rollouts r USING (rollout_id)
WHERE r.reward IS NOT NULL ORDER BY l.rollout_id, l.start_time"""


def expression_called(output_messages: str | None) -> str | None:
    """The first tool call's `expression` argument ('' when it does not parse); None: no tool call."""
    parts = [part for message in json.loads(output_messages or "[]") for part in message.get("parts", [])]
    calls = [part for part in parts if part.get("type") == "tool_call"]
    if not calls:
        return None
    try:
        return str(json.loads(calls[0]["arguments"])["expression"]).strip()
    except (KeyError, TypeError, ValueError):
        return ""


def steps_by_versions(rows: list[tuple], width: int = 10) -> dict[int, Counter]:
    by_rollout: dict[str, list[tuple]] = defaultdict(list)
    for row in rows:
        by_rollout[row[0]].append(row)
    counts: dict[int, Counter] = defaultdict(Counter)
    for calls in by_rollout.values():
        _, version, output, reward, question = calls[0]
        bucket = (int(version) if str(version).isdigit() else 0) // width * width
        expression = expression_called(output)
        right = expression == calculator_task.expression_of(question)
        count = counts[bucket]
        count["rollouts"] += 1
        count["tool call"] += expression is not None
        count["right call"] += right
        count["solved"] += reward >= 1
        count["solved, right call"] += right and reward >= 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path, help="a run's traces directory (DIR/seed-N/traces)")
    args = parser.parse_args()
    from lightning_otel.collector import connect

    counts = steps_by_versions(connect(args.traces).execute(CALLS).fetchall())
    print("versions | rollouts | tool call | right call | solved | solved given the right call")
    for bucket, count in sorted(counts.items()):
        n = count["rollouts"]
        answered = count["solved, right call"] / max(count["right call"], 1)
        print(
            f"{bucket:>3}-{bucket + 9:<4} | {n:>8} | {count['tool call'] / n:>9.2f} | {count['right call'] / n:>10.2f} | "
            f"{count['solved'] / n:>6.2f} | {answered:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
