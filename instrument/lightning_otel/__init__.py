"""lightning-otel: reinforcement learning on the runs of the agent harness you deploy.

    import lightning_otel
    lightning_otel.instrument()
    with lightning_otel.rollout(task_id="t1"):
        ...  # your agent's LLM calls and tools
        lightning_otel.reward(1.0)

`lightning_otel` is one package spread over the repository's part folders (core/, instrument/,
gateway/, collector/, trainer/, dashboards/, cli/), each installable on its own; this file, the
agent-side API, comes with the `lightning-otel` distribution (instrument/).
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)  # the other parts' subpackages

from lightning_otel.instrumentation import (
    Instrumentation,
    Rollout,
    agent,
    current_rollout,
    instrument,
    reward,
    rollout,
    tool,
)

__version__ = "0.1.0"
__all__ = ["Instrumentation", "Rollout", "agent", "current_rollout", "instrument", "reward", "rollout", "tool"]
