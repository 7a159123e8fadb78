"""The agent side's weight-version cache re-read on demand (`VLLMEndpoints.refresh`, which `rollout()`
calls): after a swap, a rollout that starts later is labelled with the new version at once, not after
the next poll. A small HTTP server stands in for vLLM's two routes the cache reads (/v1/models,
/weight_info): a real vLLM's version only changes through a swap, which the end-to-end tests do."""

from __future__ import annotations

import json
import threading
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


def test_refresh_reads_the_new_version_now_and_at_most_once_per_interval():
    state = {"version": "default", "reads": 0}
    server = serve(state)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/v1"
        endpoints = VLLMEndpoints(version_poll_s=3600)  # the poller never runs within the test
        assert endpoints.info(base, {}).is_vllm
        assert endpoints.weight_version(base) == "default"
        state["version"] = "1"  # the swap
        assert endpoints.weight_version(base) == "default"  # the cache, until read again
        endpoints.refresh(max_age_s=3600)
        assert endpoints.weight_version(base) == "1"
        reads = state["reads"]
        state["version"] = "2"
        endpoints.refresh(max_age_s=3600)  # read within the interval: not again
        assert (endpoints.weight_version(base), state["reads"]) == ("1", reads)
        endpoints.refresh(max_age_s=0)
        assert endpoints.weight_version(base) == "2"
    finally:
        server.shutdown()
        server.server_close()


def test_refresh_without_a_known_server_reads_nothing():
    endpoints = VLLMEndpoints(version_poll_s=3600)
    endpoints.refresh(max_age_s=0)  # no vLLM seen yet: nothing to read, no network
    assert endpoints.weight_version("http://127.0.0.1:9/v1") is None
