"""The examples' figures for BENCHMARKS.md: runs an example's run.py per seed (one at a time) and
prints what its output and its trace store say.

For each run: the solved share at iteration 1 (served by the SFT warm-up's weights) and at the end
(the mean of the last three iterations, and the last), how many iterations fit in the time given, the
samples per rollout and one-sample share over every train step, and the merge boundaries (merged,
and the causes of the others) from the `merge_diagnostics` view. A second table adds the counts
(rollouts, LLM calls) and the mean reward at the first and last iteration, beside the paper's coding
agent (2.41 samples per rollout, 36% one-sample); a last one lists the boundaries that did not merge by
cause, the detail's first clause and the message the next prompt ends with.

    python bench/examples_learning.py --example tool_use --seeds 0 1 2 --minutes 10 --workdir /tmp/bench-tool-use
    python bench/examples_learning.py --example coding --seeds 0 --iterations 5 --workdir /tmp/bench-coding
    python bench/examples_learning.py --example tool_use --seeds 0 1 2 --workdir /tmp/bench-tool-use --summarize
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rows(output: str) -> list[dict[str, str]]:
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("iter |"))
    names = [name.strip() for name in lines[header].split("|")]
    table = []
    for line in lines[header + 1 :]:
        if line.startswith("eval |"):  # the held-out pass printed between iterations
            continue
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) != len(names):
            break
        table.append(dict(zip(names, cells)))
    return table


def percent(text: str) -> float:
    return float(text.rstrip("%")) / 100


def run_totals(table: list[dict[str, str]]) -> dict:
    """Sums over the run's rows; the overall solved share weighs each row by its rollouts."""
    rollouts = [int(row["rollouts"]) for row in table]
    solved = sum(percent(row["solved"]) * count for row, count in zip(table, rollouts))
    return {
        "rollouts": sum(rollouts),
        "llm_calls": sum(int(row["llm calls"]) for row in table),
        "reward_first": float(table[0]["mean reward"]),
        "reward_last": float(table[-1]["mean reward"]),
        "solved": round(solved),
    }


def next_message_by_cause(data_dir: Path) -> list[tuple[str, str, str, int]]:
    """Boundaries not merged, by cause, the detail's first clause, and the first line (60 characters)
    of the message the next prompt ends with (its text, or a tool result): what the harness sent after
    the answer it kept or dropped."""
    from lightning_otel.collector import connect

    return (
        connect(data_dir)
        .execute("""
        SELECT d.cause, split_part(d.detail, ',', 1), left(split_part(last_text, chr(10), 1), 60), count(*)
        FROM merge_diagnostics d JOIN (
            SELECT span_id, coalesce(json_extract_string(input_messages, '$[#-1].parts[0].content'),
                                     json_extract_string(input_messages, '$[#-1].parts[0].response')) AS last_text
            FROM llm_calls) n ON n.span_id = d.next_span_id
        WHERE NOT d.merged GROUP BY ALL ORDER BY 4 DESC, 1, 2, 3""")
        .fetchall()
    )


def store_figures(data_dir: Path) -> dict:
    sys.path.insert(0, str(ROOT / "examples"))
    import training_loop

    boundaries, merged, causes, histogram = training_loop.merge_summary(data_dir)
    rollouts = sum(histogram)
    per_rollout = sum((k + 1) * count for k, count in enumerate(histogram)) / rollouts if rollouts else float("nan")
    return {
        "samples_per_rollout": per_rollout,
        "one_sample": histogram[0] / rollouts if rollouts else float("nan"),
        "boundaries": boundaries,
        "merged": merged,
        "causes": causes,
        "next_messages": next_message_by_cause(data_dir) if boundaries else [],
    }


def relayed(command: list[str]) -> tuple[str, int]:
    """Run `command`, printing its output line by line as it comes (progress, also through a pipe);
    returns the output and the exit code."""
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as run:
        assert run.stdout is not None
        for line in run.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    return "".join(lines), run.returncode


EVAL_LINE = re.compile(r"^eval \| version\s+(\S+) \|\s+(\d+) tasks .*solved\s+([\d.]+)% \[([\d.]+)% to ([\d.]+)%\]")
WARM_UP_LINE = re.compile(r"^SFT warm-up: (\d+) steps in (\d+) s")


def eval_rows(output: str) -> list[tuple[str, int, float, float, float]]:
    """The held-out evaluation lines run.py printed, in order: (version, tasks, solved, low, high)."""
    found = [EVAL_LINE.match(line) for line in output.splitlines()]
    return [(m[1], int(m[2]), float(m[3]) / 100, float(m[4]) / 100, float(m[5]) / 100) for m in found if m is not None]


def warm_up_of(output: str) -> tuple[int, int] | None:
    """(steps, seconds) of the SFT warm-up, from run.py's line; None when it reused an earlier one."""
    match = next((m for m in map(WARM_UP_LINE.match, output.splitlines()) if m), None)
    return (int(match[1]), int(match[2])) if match else None


def print_evaluations(evaluations: list, minutes: float | None) -> None:
    """The learning bar on held-out tasks: eval solved before the first update and at the end, the
    ratio, and whether it is at least 3x and at least 40% (the bar of issue 35)."""
    within = f" within {minutes:g} minutes of iterations" if minutes is not None else ""
    print(f"\nheld-out evaluation{within} (run.py's eval lines; 95% interval):")
    print("seed | warm-up steps / s | eval versions | solved, start | solved, end | x | >= 3x and >= 40%")
    for seed, warm_up, evals in evaluations:
        if len(evals) < 2:
            print(f"{seed} | - | {len(evals)} | - | - | - | no eval before and after training")
            continue
        (_, _, start, low0, high0), (version, _, end, low1, high1) = evals[0], evals[-1]
        ratio = end / start if start else float("inf")
        steps = f"{warm_up[0]} / {warm_up[1]}" if warm_up else "reused"
        met = "yes" if ratio >= 3 and end >= 0.4 else "no"
        print(
            f"{seed} | {steps} | {len(evals)} (last: {version}) | {start:.1%} [{low0:.1%}, {high0:.1%}] | "
            f"{end:.1%} [{low1:.1%}, {high1:.1%}] | {ratio:.1f} | {met}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--minutes", type=float, default=None, help="passed on: no iteration starts after this")
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--workdir", required=True)
    parser.add_argument(
        "--summarize", action="store_true", help="run nothing: print the table from DIR/seed-N/run.out and traces"
    )
    parser.add_argument("extra", nargs="*", help="more flags for run.py (after --)")
    args = parser.parse_args()

    summary, evaluations = [], []
    for seed in args.seeds:
        workdir = Path(args.workdir) / f"seed-{seed}"
        command = [
            sys.executable,
            str(ROOT / "examples" / args.example / "run.py"),
            "--workdir",
            str(workdir),
            "--iterations",
            str(args.iterations),
            "--seed",
            str(seed),
            *args.extra,
        ]
        if args.minutes is not None:
            command += ["--minutes", str(args.minutes)]
        began = time.perf_counter()
        if args.summarize:
            output = (workdir / "run.out").read_text()
        else:
            print("$ " + " ".join(command), flush=True)
            output, returncode = relayed(command)
            (workdir / "run.out").write_text(output)
            if returncode != 0:
                print(f"seed {seed}: run.py exited with {returncode}")
                return 1
        table = rows(output)
        solved = [percent(row["solved"]) for row in table]
        last3, last10 = solved[-3:], solved[-10:]
        figures = store_figures(workdir / "traces")
        wall = float("nan") if args.summarize else time.perf_counter() - began
        figures.update(run_totals(table))
        evaluations.append((seed, warm_up_of(output), eval_rows(output)))
        first3 = solved[:3]
        summary.append(
            (
                seed,
                len(table),
                solved[0],
                sum(first3) / len(first3),
                sum(last3) / len(last3),
                solved[-1],
                sum(last10) / len(last10),
                figures,
                wall,
            )
        )

    print_evaluations(evaluations, args.minutes)
    # "x" divides by iteration 1 (the warm-up's weights, one iteration's tasks: noisy); "x, first 3"
    # by the first three iterations' mean, which two RL steps may already have raised
    print(
        "\nseed | iterations | solved at iteration 1 | solved, first 3 (mean) | solved, last 3 (mean) | solved, last | "
        "x | x, first 3 | solved, last 10 (mean) | samples/rollout | one-sample | merged boundaries | wall s"
    )
    for seed, iterations, first, start3, mean3, last, mean10, figures, wall in summary:
        ratio = f"{mean3 / first:.1f}" if first else "inf"
        ratio3 = f"{mean3 / start3:.1f}" if start3 else "inf"
        merged = f"{figures['merged']}/{figures['boundaries']}" if figures["boundaries"] else "-"
        print(
            f"{seed} | {iterations} | {first:.1%} | {start3:.1%} | {mean3:.1%} | {last:.1%} | {ratio} | {ratio3} | "
            f"{mean10:.1%} | {figures['samples_per_rollout']:.2f} | {figures['one_sample']:.1%} | {merged} | {wall:.0f}"
        )
        if figures["causes"]:
            print("     not merged, by cause: " + ", ".join(f"{cause} {count}" for cause, count in figures["causes"]))

    print(
        "\nexample | seed | iterations | rollouts | llm calls | samples/rollout | one-sample | "
        "mean reward, first / last | solved, first / last | solved, all iterations | merged boundaries | not merged, by cause"
    )
    for seed, iterations, first, _, _, last, _, figures, _ in summary:
        merged = f"{figures['merged']}/{figures['boundaries']}" if figures["boundaries"] else "-"
        causes = ", ".join(f"{cause} {count}" for cause, count in figures["causes"]) or "-"
        print(
            f"{args.example} | {seed} | {iterations} | {figures['rollouts']} | {figures['llm_calls']} | "
            f"{figures['samples_per_rollout']:.2f} | {figures['one_sample']:.1%} | "
            f"{figures['reward_first']:.3f} / {figures['reward_last']:.3f} | {first:.1%} / {last:.1%} | "
            f"{figures['solved']}/{figures['rollouts']} ({figures['solved'] / figures['rollouts']:.1%}) | {merged} | {causes}"
        )
    print("paper (coding agent, mini-SWE-agent) | | | | | 2.41 | 36% | | | | |")
    for seed, *_, figures, _ in summary:
        if figures["next_messages"]:
            print(f"\nseed {seed}, boundaries not merged: cause | detail | the next prompt's last message | count")
            for cause, detail, line, count in figures["next_messages"]:
                print(f"{cause} | {detail or '-'} | {line!r} | {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
