"""BENCHMARKS.md's table of current figures: print it, check it, or list the rows whose code moved.

    python bench/benchmarks_table.py            # print the table, one block per row
    python bench/benchmarks_table.py --check    # exit 1 naming every malformed row
    python bench/benchmarks_table.py --stale    # rows whose code has commits after the row's commit

The table is the one under "## Current figures". Each row is one measure with seven cells:
measure | figure | goal | commit | date | command | code. The check wants every cell filled, a
commit that git knows, an ISO date, a command (in backticks) that names a script which exists in
the repository or a Makefile rule (`make demo`), and code paths that exist. Items of the "## Not yet re-measured" list need a command
naming an existing script too, so that someone can run them. `--stale` is separate from `--check`
because any commit to the code a row exercises makes it stale until someone re-measures it; that is
work to schedule, not a malformed table.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE_HEADING = "## Current figures"
PENDING_HEADING = "## Not yet re-measured"
COLUMNS = ("measure", "figure", "goal", "commit", "date", "command", "code")
# A script a command runs: bench/x.py, examples/x/run.py, tests/x.py, ... (relative to the repository).
SCRIPT = re.compile(r"(?<![\w/.-])((?:bench|examples|tests)/[\w./-]+\.(?:py|sh))")
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
MAKE = re.compile(r"`(?:[^`]*[\s;&(])?make((?:[ \t]+[a-z][\w-]*)+)")


@dataclass
class Row:
    line: int
    cells: dict[str, str]


def _section(lines: list[str], heading: str) -> list[tuple[int, str]]:
    """The (line number, text) pairs after `heading` up to the next heading of its level or above."""
    out: list[tuple[int, str]] = []
    inside = False
    for number, text in enumerate(lines, 1):
        if text.startswith("## ") or text.startswith("# "):
            if inside:
                break
            inside = text.strip().startswith(heading)
            continue
        if inside:
            out.append((number, text))
    return out


def _split_row(text: str) -> list[str]:
    # Cells hold code spans with `|` only escaped as `\|`, as Markdown tables need.
    inner = text.strip()[1:-1] if text.strip().endswith("|") else text.strip()[1:]
    cells = re.split(r"(?<!\\)\|", inner)
    return [cell.strip().replace("\\|", "|") for cell in cells]


def parse(text: str) -> tuple[list[Row], list[tuple[int, str]], list[str]]:
    """Rows of the table, the pending list's items, and problems with the table's shape."""
    lines = text.splitlines()
    table = [(n, t) for n, t in _section(lines, TABLE_HEADING) if t.lstrip().startswith("|")]
    problems: list[str] = []
    if not table:
        problems.append(f"no table under {TABLE_HEADING!r}")
        return [], [], problems
    header = [cell.lower() for cell in _split_row(table[0][1])]
    if tuple(header) != COLUMNS:
        problems.append(f"line {table[0][0]}: columns {header}, expected {list(COLUMNS)}")
        return [], [], problems
    rows = []
    for number, text_line in table[2:]:
        cells = _split_row(text_line)
        if len(cells) != len(COLUMNS):
            problems.append(f"line {number}: {len(cells)} cells, expected {len(COLUMNS)}")
            continue
        rows.append(Row(number, dict(zip(COLUMNS, cells))))
    if not rows:
        problems.append(f"the table under {TABLE_HEADING!r} has no rows")
    pending: list[tuple[int, str]] = []
    for number, item_line in _section(lines, PENDING_HEADING):
        if item_line.startswith("- "):
            pending.append((number, item_line))
        elif item_line.startswith("  ") and pending:  # an item's continuation line
            pending[-1] = (pending[-1][0], pending[-1][1] + " " + item_line.strip())
    return rows, pending, problems


def _commit_exists(commit: str) -> bool:
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        capture_output=True,
    )
    return found.returncode == 0


def _scripts(command: str) -> list[str]:
    return SCRIPT.findall(command)


def _code_paths(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def check(text: str) -> list[str]:
    """Every problem with the table and the pending list, one line each; [] when all is well."""
    rows, pending, problems = parse(text)
    for row in rows:
        where = f"line {row.line} ({row.cells['measure'] or 'no measure'})"
        for column in COLUMNS:
            if not row.cells[column]:
                problems.append(f"{where}: empty {column}")
        commit = row.cells["commit"].strip("`")
        if commit and not COMMIT.match(commit):
            problems.append(f"{where}: commit {commit!r} is not a hex commit id")
        elif commit and not _commit_exists(commit):
            problems.append(f"{where}: commit {commit} is not in this repository's history")
        date = row.cells["date"]
        if date and not DATE.match(date):
            problems.append(f"{where}: date {date!r} is not YYYY-MM-DD")
        problems += _command_problems(where, row.cells["command"])
        for path in _code_paths(row.cells["code"]):
            if not (REPO / path).exists():
                problems.append(f"{where}: code path {path} does not exist")
        if row.cells["code"] and not _code_paths(row.cells["code"]):
            problems.append(f"{where}: code names no path in backticks")
    for number, item in pending:
        problems += _command_problems(f"line {number} (not yet re-measured)", item)
    return problems


def _make_targets(command: str) -> list[str]:
    return [word for words in MAKE.findall(command) for word in words.split()]


def _makefile_rules() -> set[str]:
    rules = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        rule = re.match(r"^([A-Za-z0-9_. -]+?)\s*:(?!=)", line)
        if rule:
            rules.update(rule.group(1).split())
    return rules


def _command_problems(where: str, command: str) -> list[str]:
    if not command:
        return []
    scripts, targets = _scripts(command), _make_targets(command)
    if "`" not in command or not (scripts or targets):
        return [
            f"{where}: the command names no script (bench/..., examples/..., tests/...) or make target in backticks"
        ]
    problems = [f"{where}: {script} does not exist" for script in scripts if not (REPO / script).is_file()]
    rules = _makefile_rules() if targets else set()
    return problems + [f"{where}: make {target} is not a Makefile rule" for target in targets if target not in rules]


def stale(text: str) -> list[str]:
    """Rows whose code paths have commits after the row's commit (`git log <commit>..HEAD -- paths`)."""
    rows, _, _ = parse(text)
    out = []
    for row in rows:
        commit, paths = row.cells["commit"].strip("`"), _code_paths(row.cells["code"])
        if not commit or not paths:
            continue
        log = subprocess.run(
            ["git", "-C", str(REPO), "log", "--oneline", f"{commit}..HEAD", "--", *paths],
            capture_output=True,
            text=True,
        )
        if log.stdout.strip():
            changes = len(log.stdout.strip().splitlines())
            out.append(f"line {row.line} ({row.cells['measure']}): {changes} commit(s) to {' '.join(paths)}")
    return out


def render(text: str) -> str:
    rows, _, _ = parse(text)
    blocks = []
    for row in rows:
        blocks.append("\n".join(f"{column:>8}: {row.cells[column]}" for column in COLUMNS))
    return "\n\n".join(blocks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, default=REPO / "BENCHMARKS.md")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 naming every malformed row")
    mode.add_argument("--stale", action="store_true", help="rows whose code changed after their commit")
    args = parser.parse_args()
    text = args.file.read_text()
    if args.check:
        problems = check(text)
        for problem in problems:
            print(f"{args.file.name}: {problem}", file=sys.stderr)
        rows, _, _ = parse(text)
        if not problems:
            print(f"{args.file.name}: {len(rows)} rows, all with figure, goal, commit, date, command and code")
        return 1 if problems else 0
    if args.stale:
        lines = stale(text)
        print("\n".join(lines) if lines else "no row's code changed after its commit")
        return 0
    print(render(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
