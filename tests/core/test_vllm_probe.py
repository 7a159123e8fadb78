"""Whether a server is vLLM (`VLLMEndpoints.info`, asked on the first call to a server): an answer is
kept, a missing answer is not. A vLLM too busy to answer /v1/models within the probe's timeout (a
loaded 2-core machine was seen to do it) must not leave the agent recording every later call to it
without token ids."""

from __future__ import annotations

import time

import pytest
from stall_server import StallServer

from lightning_otel.core import vllm_endpoint
from lightning_otel.core.vllm_endpoint import VLLMEndpoints


@pytest.fixture
def server():
    running = StallServer(version="5")
    yield running
    running.stop()


def test_a_server_that_did_not_answer_is_asked_again_after_a_pause(server, monkeypatch):
    monkeypatch.setattr(vllm_endpoint, "_PROBE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(vllm_endpoint, "PROBE_RETRY_S", 1.0)
    endpoints = VLLMEndpoints()
    server.state["hang_models"] = True  # accepted, not answered: as a vLLM too busy to answer in time
    assert not endpoints.info(server.base_url, {}).is_vllm
    assert endpoints.cached(server.base_url) is None  # not kept: only a timeout said so
    server.state["hang_models"] = False
    began = time.monotonic()
    assert not endpoints.info(server.base_url, {}).is_vllm  # within the pause: not asked again
    assert time.monotonic() - began < 0.1  # and nothing waited on the network
    time.sleep(1.0)
    assert endpoints.info(server.base_url, {}).is_vllm  # asked again: it answers now
    assert endpoints.cached(server.base_url).is_vllm


def test_an_answer_is_kept_even_when_it_says_not_vllm(server):
    endpoints = VLLMEndpoints()
    other = server.base_url.removesuffix("/v1") + "/elsewhere/v1"  # a 404 on its /models: an answer
    assert not endpoints.info(other, {}).is_vllm
    assert endpoints.cached(other) is not None and not endpoints.cached(other).is_vllm
