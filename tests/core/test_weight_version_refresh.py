"""The agent side's weight versions (`VLLMEndpoints.label`): a call is labelled with the version of a
/weight_info read sent after its response arrived, by the server's reader thread, so that a call
right after a swap carries the new version, not the last poll's, and the caller never waits. A small HTTP server stands in for vLLM's two routes the cache reads (/v1/models,
/weight_info): a real vLLM's version only changes through a swap, which the end-to-end tests do."""

from __future__ import annotations

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lightning_otel.core.vllm_endpoint import VLLMEndpoints


def serve(state: dict) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state["reads"] += self.path == "/weight_info"
            body = (
                {"weight_version": state["version"]}
                if self.path == "/weight_info"
                else {"data": [{"id": "policy", "owned_by": "vllm"}]}
            )
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_label_waits_for_a_read_sent_after_the_call_and_the_caller_does_not():
    state = {"version": "default", "reads": 0}
    server = serve(state)
    endpoints = VLLMEndpoints(version_poll_s=3600)  # no idle poll within the test: only labels read
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/v1"
        assert endpoints.info(base, {}).is_vllm
        assert endpoints.weight_version(base) == "default"
        state["version"] = "1"  # the swap, then a call's response arrives
        labels = queue.Queue()
        start = time.perf_counter()
        endpoints.label(base, time.monotonic(), labels.put)
        assert time.perf_counter() - start < 0.05  # the caller goes on; the reader thread reads
        assert labels.get(timeout=5) == "1"  # not the cached "default"
        assert endpoints.weight_version(base) == "1"
        reads = state["reads"]
        state["version"] = "2"
        endpoints.label(base, time.monotonic(), labels.put)
        assert endpoints.settle(5)  # what a flush waits for
        assert labels.get_nowait() == "2" and state["reads"] == reads + 1
    finally:
        endpoints.forget()
        server.shutdown()
        server.server_close()


def test_a_server_without_weight_info_is_labelled_at_once_with_none():
    endpoints = VLLMEndpoints(version_poll_s=3600)
    labels = []
    endpoints.label("http://127.0.0.1:9/v1", time.monotonic(), labels.append)  # never seen: no network
    assert labels == [None] and endpoints.weight_version("http://127.0.0.1:9/v1") is None
    assert endpoints.settle(0)
