"""Agent side: `instrument()`, `rollout()`, `reward()`, `agent()` and `@tool`. Light: no torch, no duckdb.

The same names are the package root's (`lightning_otel.instrument()`).
"""

from lightning_otel.instrumentation.configure import Instrumentation, instrument
from lightning_otel.instrumentation.rollouts import Rollout, agent, current_rollout, reward, rollout, tool

__all__ = ["Instrumentation", "Rollout", "agent", "current_rollout", "instrument", "reward", "rollout", "tool"]
