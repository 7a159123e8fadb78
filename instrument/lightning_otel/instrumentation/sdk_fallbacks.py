"""Private SDK internals the agent side reaches into for speed, and what it does when one is gone.

Each use checks that the internal is there; when a release of `openai` or `opentelemetry-sdk` lays it
out differently, the public path runs instead (slower, never losing the span or its token ids), the
first miss is logged, and every rollout span then carries `lightning.sdk.fallbacks` (how many
internals this process found missing), so a silent degradation shows in the traces and the
dashboards. docs/agent-side.md lists every internal, its guard and its fallback.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("lightning_otel.instrumentation")
_missing: set[str] = set()
_lock = threading.Lock()


def missing(internal: str, fallback: str) -> None:
    """Record that `internal` is not in this SDK: logged once per process, counted."""
    if internal in _missing:
        return
    with _lock:
        if internal in _missing:
            return
        _missing.add(internal)
    log.warning("lightning_otel: %s not found in this SDK version; %s (docs/agent-side.md)", internal, fallback)


def count() -> int:
    """How many private internals this process found missing (0: every fast path in use)."""
    return len(_missing)
