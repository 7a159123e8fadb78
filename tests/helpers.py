"""Small helpers shared by tests."""

from __future__ import annotations

import time


def wait_for(query_fn, predicate, timeout_s: float = 20.0, interval_s: float = 0.1):
    """Poll query_fn() until predicate(result) holds; return the last result (assert outside)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = query_fn()
        if predicate(result) or time.monotonic() > deadline:
            return result
        time.sleep(interval_s)
