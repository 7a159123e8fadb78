"""Agent side: `instrument()`, `rollout()`, `reward()` and `tool`. Light: no torch, no duckdb.

`lightning_otel.instrument` is this package *and* callable: `lightning_otel.instrument()` runs
`configure.instrument()`. A package-level function of the same name would shadow the package and
break `import lightning_otel.instrument.schema as schema`; a callable module breaks nothing.
"""

import sys
import types

from lightning_otel.instrument.configure import Instrumentation, instrument
from lightning_otel.instrument.rollouts import Rollout, agent, current_rollout, reward, rollout, tool

__all__ = ["Instrumentation", "Rollout", "agent", "current_rollout", "instrument", "reward", "rollout", "tool"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs) -> Instrumentation:
        return instrument(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
