"""Bearer-token checks, one implementation for every server we run (collector, gateway, dashboard).

Stdlib only: the agent side and `lightning-otel --help` import this without extras."""

from __future__ import annotations

import hmac


def bearer_ok(header: str | None, token: str | None) -> bool:
    """True when no token is required, or `header` is exactly `Bearer <token>` (constant-time)."""
    if not token:
        return True
    return header is not None and hmac.compare_digest(header.strip().encode(), f"Bearer {token}".encode())
