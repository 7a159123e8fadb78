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

# Lazy (PEP 562): `import lightning_otel.collector` or `.trainer` runs this file too, and must not set
# up the agent stack (OpenTelemetry SDK, OpenInference, wrapt); the names load on first use.
_AGENT_API = frozenset(
    ("Instrumentation", "Rollout", "agent", "current_rollout", "instrument", "reward", "rollout", "tool")
)


def __getattr__(name: str):
    if name in _AGENT_API:
        import lightning_otel.instrumentation as agent_side

        value = getattr(agent_side, name)
        globals()[name] = value  # later reads skip this function
        return value
    raise AttributeError(f"module 'lightning_otel' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_AGENT_API})


__version__ = "0.1.0"
__all__ = ["Instrumentation", "Rollout", "agent", "current_rollout", "instrument", "reward", "rollout", "tool"]
