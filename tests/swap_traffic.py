"""A gateway swapping full weights while callers keep sending requests: none fails, and each call's
span names the version that served it (the response's X-Lightning-Policy-Version). Shared by the
tests of each API the gateway serves."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from helpers import wait_for

from lightning_otel.collector import connect
from lightning_otel.core.gateway_client import GatewayAdminClient


def swaps_under_traffic_drop_nothing(
    gateway_url: str,
    admin_token: str,
    session_collector,
    weights: Path,
    prefix: str,
    call: Callable[[str, int], str],
    callers: int = 3,
) -> None:
    """`call(rollout_id, caller)` sends one request through `gateway_url/rollout/<rollout_id>` and
    returns the version header; two swaps (to `weights`, as `<prefix>-1` and `<prefix>-2`) run meanwhile."""
    answered, failures, stop = [], [], threading.Event()

    def caller(index: int) -> None:
        while not stop.is_set():
            rollout_id = f"{prefix}-{index}-{uuid.uuid4().hex[:8]}"
            try:
                answered.append((rollout_id, call(rollout_id, index)))
            except Exception as exc:
                failures.append(repr(exc))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    admin = GatewayAdminClient(gateway_url, admin_token)
    versions = (f"{prefix}-1", f"{prefix}-2")
    try:
        for version in versions:
            time.sleep(0.5)
            assert admin.swap_full(weights, version, weights)["version"] == version
            # traffic on each version before the next swap (a loaded machine answers slowly)
            wait_for(lambda: [v for _, v in answered], lambda seen, v=version: v in seen, timeout_s=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == [], failures[:5]
    assert set(versions) <= {version for _, version in answered}
    conn = connect(session_collector.data_dir)
    ids = dict(answered)
    rows = wait_for(
        lambda: conn.execute(
            "SELECT rollout_id, policy_version FROM llm_calls WHERE rollout_id LIKE ?", [f"{prefix}-%"]
        ).fetchall(),
        lambda r: set(ids) <= {x[0] for x in r},
        timeout_s=30,
    )
    assert {rid: version for rid, version in rows if rid in ids} == ids  # each span names the version that served it
