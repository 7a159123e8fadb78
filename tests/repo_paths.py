"""Where things are, for tests in any tests/<part>/ folder: the repository, tests/ (shared support
files such as stall_server.py and js/), and examples/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
EXAMPLES = REPO / "examples"
