"""The package root is lazy (PEP 562): importing the collector or the trainer loads none of the agent
stack, and the agent API still reads as `lightning_otel.instrument` / `from lightning_otel import rollout`.
Each check runs in a fresh interpreter (this test process has the agent side loaded already)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("part", ["collector", "trainer"])
def test_importing_a_service_part_loads_no_agent_stack(part):
    run(
        f"import lightning_otel.{part}, sys\n"
        "loaded = [m for m in sys.modules if m.startswith(('lightning_otel.instrumentation', 'openinference', 'wrapt'))]\n"
        "assert not loaded, loaded"
    )


def test_the_agent_api_loads_on_first_use():
    run(
        "import sys, lightning_otel\n"
        "assert 'lightning_otel.instrumentation' not in sys.modules\n"
        "from lightning_otel import rollout, tool\n"
        "import lightning_otel.instrumentation as agent_side\n"
        "assert rollout is agent_side.rollout and lightning_otel.instrument is agent_side.instrument\n"
        "assert set(lightning_otel.__all__) <= set(dir(lightning_otel))\n"
        "try:\n"
        "    lightning_otel.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('an unknown name resolved')"
    )
