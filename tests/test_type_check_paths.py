"""The type checker follows `lightning_otel` across the part folders from the tree alone.

`make lint` runs mypy with the root pyproject.toml's `[tool.mypy]`, whose `mypy_path` lists each part
folder as a source root. Here mypy runs against a bare virtual environment (no part installed, no
editable install, no third-party package), so the only way it can find `lightning_otel.core.schema`
from a trainer module is that configuration. A copy of the configuration without `mypy_path` is the
control: the same imports must then be reported missing, or this test proves nothing.
"""

import ast
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UNRESOLVED = re.compile(
    r'^(\S+?\.py):\d+: error: Cannot find implementation or library stub for module named "([^"]+)"'
)


def _parts() -> list[str]:
    """Part folders: a top-level folder holding a `lightning_otel/` tree."""
    return sorted(p.name for p in REPO.iterdir() if (p / "lightning_otel").is_dir())


def _cross_part_imports() -> set[tuple[str, str]]:
    """(file, module) for every absolute `lightning_otel.<part>` import that names another part."""
    found = set()
    for part in _parts():
        for path in (REPO / part / "lightning_otel").rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                for name in names:
                    pieces = name.split(".")
                    if len(pieces) > 1 and pieces[0] == "lightning_otel" and pieces[1] != part:
                        found.add((path.relative_to(REPO).as_posix(), name))
    return found


def _unresolved(config: Path, bare_python: Path, cache: Path) -> list[tuple[str, str]]:
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--python-executable", str(bare_python)]
        + ["--cache-dir", str(cache), "--no-pretty", "--show-error-codes"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Found" in run.stdout or "Success" in run.stdout, run.stdout + run.stderr  # mypy itself ran
    return [m.groups() for m in map(UNRESOLVED.match, run.stdout.splitlines()) if m]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("bare-venv")
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    probe = subprocess.run([python, "-c", "import lightning_otel"], capture_output=True, text=True)
    assert probe.returncode != 0, "the bare environment must not see lightning_otel"
    return python


def test_cross_part_imports_resolve_without_an_install(bare_python, tmp_path):
    cross = _cross_part_imports()
    trainer_to_core = {(f, m) for f, m in cross if f.startswith("trainer/") and m.startswith("lightning_otel.core")}
    assert trainer_to_core, "the tree has trainer modules importing core; the probe needs them"

    unresolved = _unresolved(REPO / "pyproject.toml", bare_python, tmp_path / "cache")
    # The environment really is bare: third-party imports are missing...
    assert any(module.split(".")[0] in {"torch", "opentelemetry"} for _, module in unresolved)
    # ...and every lightning_otel import is still found, through the source roots alone.
    assert [(f, m) for f, m in unresolved if m.split(".")[0] == "lightning_otel"] == []


def test_without_the_source_roots_the_same_imports_are_missing(bare_python, tmp_path):
    text = (REPO / "pyproject.toml").read_text()
    without_roots = re.sub(r"(?m)^mypy_path\s*=.*\n", "", text)
    assert without_roots != text, "[tool.mypy] must set mypy_path"
    config = tmp_path / "pyproject.toml"
    config.write_text(without_roots)

    missing = {
        (f, m) for f, m in _unresolved(config, bare_python, tmp_path / "cache") if m.startswith("lightning_otel")
    }
    # Every trainer -> core import the tree has is now reported, so the check above is not vacuous.
    trainer_to_core = {
        (f, m) for f, m in _cross_part_imports() if f.startswith("trainer/") and m.startswith("lightning_otel.core")
    }
    assert trainer_to_core <= missing
