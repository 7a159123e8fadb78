"""BENCHMARKS.md's table of current figures is checkable: `bench/benchmarks_table.py --check` passes on
the file as committed and fails on copies with one thing wrong (a row without its commit, a commit git
does not know, a command naming no existing script, an empty goal, a bad date). The script runs as a
command, the way people run it, not imported."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "benchmarks_table.py"
BENCHMARKS = REPO / "BENCHMARKS.md"
COLUMNS = ["measure", "figure", "goal", "commit", "date", "command", "code"]
# The script runs as a process, and asks git (a process too) whether each commit exists.
pytestmark = pytest.mark.integration


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO)


def _table_rows(text: str) -> list[int]:
    """Indices of the table's data rows (found here independently of the script's parser)."""
    lines = text.splitlines()
    start = lines.index("## Current figures")
    rows = []
    for index in range(start + 1, len(lines)):
        if lines[index].startswith("## "):
            break
        if lines[index].startswith("|") and not lines[index].startswith("|---"):
            rows.append(index)
    return rows[1:]  # the first is the header


def _with_cell(text: str, row: int, column: str, value: str) -> str:
    lines = text.splitlines()
    cells = lines[row].strip().strip("|").split(" | ")
    assert len(cells) == len(COLUMNS), lines[row]
    cells[COLUMNS.index(column)] = value
    lines[row] = "| " + " | ".join(cell.strip() for cell in cells) + " |"
    return "\n".join(lines) + "\n"


def test_the_committed_table_passes_the_check():
    result = _run("--check")
    assert result.returncode == 0, result.stderr
    rows = _table_rows(BENCHMARKS.read_text())
    assert len(rows) >= 5
    assert f"{len(rows)} rows" in result.stdout


def test_printing_the_table_shows_every_row():
    text = BENCHMARKS.read_text()
    printed = _run().stdout
    for row in _table_rows(text):
        measure = text.splitlines()[row].strip().strip("|").split(" | ")[0].strip()
        assert f" measure: {measure}" in printed


@pytest.mark.parametrize(
    ("column", "value", "complaint"),
    [
        ("commit", "", "empty commit"),
        ("commit", "0123abc", "not in this repository's history"),
        ("commit", "HEAD~1", "not a hex commit id"),
        ("goal", "", "empty goal"),
        ("figure", "", "empty figure"),
        ("date", "4 Dec", "not YYYY-MM-DD"),
        ("command", "`python bench/no_such_bench.py`", "bench/no_such_bench.py does not exist"),
        ("command", "run it by hand", "names no script"),
        ("code", "`collector/no_such_module.py`", "code path collector/no_such_module.py does not exist"),
    ],
)
def test_a_row_with_one_thing_wrong_fails_the_check(tmp_path, column, value, complaint):
    text = BENCHMARKS.read_text()
    rows = _table_rows(text)
    broken = tmp_path / "BENCHMARKS.md"
    broken.write_text(_with_cell(text, rows[len(rows) // 2], column, value))
    result = _run("--check", "--file", str(broken))
    assert result.returncode == 1
    assert complaint in result.stderr


def test_a_pending_item_must_name_a_script_that_exists(tmp_path):
    text = BENCHMARKS.read_text()
    broken = tmp_path / "BENCHMARKS.md"
    lines = text.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("## Not yet re-measured"))
    lines.insert(heading + 1, "- a figure: `python bench/gone.py`")
    broken.write_text("\n".join(lines) + "\n")
    result = _run("--check", "--file", str(broken))
    assert result.returncode == 1
    assert "bench/gone.py does not exist" in result.stderr
