"""lightning-otel: reinforcement learning on the runs of the agent harness you deploy.

    import lightning_otel
    lightning_otel.instrument()
    with lightning_otel.rollout(task_id="t1"):
        ...  # your agent's LLM calls and tools
        lightning_otel.reward(1.0)
"""

from lightning_otel import instrument  # the agent-side package; calling it configures tracing
from lightning_otel.instrument import Instrumentation, Rollout, agent, current_rollout, reward, rollout, tool

__version__ = "0.1.0"
__all__ = ["Instrumentation", "Rollout", "agent", "current_rollout", "instrument", "reward", "rollout", "tool"]
