"""lightning_otel.core.http_json against a real server on 127.0.0.1: what it sends, what it returns,
and the one error it raises for every way a request can fail."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lightning_otel.core.gateway_client import GatewayAdminClient
from lightning_otel.core.http_json import ERROR_BODY_LIMIT, HttpError, get_json, post_json, request
from lightning_otel.core.vllm_admin import SwapError, VLLMAdmin

pytestmark = pytest.mark.integration  # every test talks to a server on 127.0.0.1 (or to a closed port)


class _Handler(BaseHTTPRequestHandler):
    """Routes that each answer one way; every request seen is kept in `server.seen`."""

    def log_message(self, *args) -> None:
        pass

    def _reply(self, status: int, body: bytes, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first (the timeout test) or read only what it keeps

    def _answer(self, method: str) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((method, self.path, dict(self.headers), data))
        if self.path == "/echo":
            self._reply(200, json.dumps({"method": method, "body": data.decode()}).encode())
        elif self.path == "/created":
            self._reply(201, b'{"id": 7}')
        elif self.path == "/empty":
            self._reply(200, b"")
        elif self.path == "/text":
            self._reply(200, b"plain words")
        elif self.path == "/unavailable":
            self._reply(503, b'{"error": "draining"}')
        elif self.path == "/huge-error":
            self._reply(500, b"x" * (ERROR_BODY_LIMIT * 3))
        elif self.path == "/slow":
            time.sleep(1.5)
            self._reply(200, b"{}")
        elif self.path == "/admin/state":  # the gateway's admin routes
            self._reply(200, b'{"replicas": []}')
        elif self.path == "/admin/swap":
            self._reply(502, b'{"error": {"message": "replica 2 failed to load; rolled back"}}')
        elif self.path in ("/pause?mode=wait", "/update_weight_version"):  # vLLM's: empty, or plain text
            self._reply(200, b"")
        elif self.path == "/resume":
            self._reply(200, b"resumed")
        elif self.path == "/weight_info":
            self._reply(200, b'{"weight_version": 12}')
        elif self.path == "/v1/load_lora_adapter":
            self._reply(400, b'{"message": "The lora adapter policy@3 has already been loaded."}')
        elif self.path == "/cut":  # promises more than it sends, then hangs up
            self._reply(200, b'{"partial": ', length=1000)
            self.close_connection = True
        else:
            self._reply(404, b"no such route")

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.seen = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_get_json_returns_the_decoded_reply_and_sends_the_headers(server):
    httpd, url = server
    assert get_json(url + "/echo", timeout=5, headers={"Authorization": "Bearer t"}) == {"method": "GET", "body": ""}
    method, path, headers, _ = httpd.seen[-1]
    assert (method, path, headers["Authorization"], headers["Accept"]) == (
        "GET",
        "/echo",
        "Bearer t",
        "application/json",
    )


def test_post_json_sends_the_body_as_json(server):
    httpd, url = server
    body = {"mode": "full", "weights": [1, 2.5, None], "name": "é"}
    reply = post_json(url + "/echo", body, timeout=5)
    assert reply["method"] == "POST" and json.loads(reply["body"]) == body
    assert httpd.seen[-1][2]["Content-Type"] == "application/json"
    assert post_json(url + "/created", {}, timeout=5) == {"id": 7}  # any 2xx is an answer


def test_an_empty_reply_is_none(server):
    _, url = server
    assert get_json(url + "/empty", timeout=5) is None
    assert post_json(url + "/empty", None, timeout=5) is None


def test_request_returns_raw_bytes_for_any_method(server):
    httpd, url = server
    assert request("POST", url + "/text", b"\x00raw", timeout=5) == b"plain words"
    assert httpd.seen[-1][3] == b"\x00raw"


def test_a_non_2xx_answer_is_an_http_error_with_status_body_and_url(server):
    _, url = server
    with pytest.raises(HttpError) as caught:
        post_json(url + "/unavailable", {"a": 1}, timeout=5)
    error = caught.value
    assert (error.status, error.body, error.url, error.method) == (
        503,
        '{"error": "draining"}',
        url + "/unavailable",
        "POST",
    )
    assert "503" in str(error) and "draining" in str(error) and url + "/unavailable" in str(error)
    assert isinstance(error, OSError)  # callers that treat any network failure alike still catch it
    with pytest.raises(HttpError) as missing:
        get_json(url + "/nowhere", timeout=5)
    assert (missing.value.status, missing.value.body) == (404, "no such route")


def test_a_huge_error_body_is_kept_bounded(server):
    _, url = server
    with pytest.raises(HttpError) as caught:
        get_json(url + "/huge-error", timeout=5)
    assert caught.value.status == 500 and caught.value.body == "x" * ERROR_BODY_LIMIT
    assert len(str(caught.value)) < 1000


def test_a_reply_that_is_not_json_is_an_http_error_naming_it(server):
    _, url = server
    with pytest.raises(HttpError) as caught:
        get_json(url + "/text", timeout=5)
    assert caught.value.status == 200 and caught.value.body == "plain words" and "not JSON" in str(caught.value)


def test_no_listener_is_an_http_error_without_status():
    with socket.socket() as closed:  # a port just freed: nothing listens there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(HttpError) as caught:
        get_json(f"http://127.0.0.1:{port}/x", timeout=5)
    assert caught.value.status is None and "refused" in str(caught.value).lower()


def test_a_server_that_does_not_answer_in_time_is_an_http_error(server):
    _, url = server
    with pytest.raises(HttpError) as caught:
        get_json(url + "/slow", timeout=0.2)
    assert caught.value.status is None and "timed out" in str(caught.value)


def test_a_reply_cut_off_midway_is_an_http_error(server):
    _, url = server
    with pytest.raises(HttpError) as caught:
        get_json(url + "/cut", timeout=5)
    assert caught.value.status is None and "IncompleteRead" in str(caught.value)


def test_a_server_that_hangs_up_without_answering_is_an_http_error():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def hang_up() -> None:
            connection, _ = listener.accept()
            connection.recv(65536)
            connection.close()

        thread = threading.Thread(target=hang_up, daemon=True)
        thread.start()
        with pytest.raises(HttpError) as caught:
            get_json(f"http://127.0.0.1:{listener.getsockname()[1]}/", timeout=5)
        thread.join(5)
    assert caught.value.status is None


def test_the_gateway_admin_client_sends_its_token_and_names_a_failed_swap(server):
    httpd, url = server
    client = GatewayAdminClient(url, "admin-token", timeout_s=5)
    assert client.state() == {"replicas": []}
    assert httpd.seen[-1][2]["Authorization"] == "Bearer admin-token"
    with pytest.raises(SwapError, match="HTTP 502.*replica 2 failed to load; rolled back"):
        client.swap_full("/w/new", "7", "/w/old")
    assert json.loads(httpd.seen[-1][3]) == {
        "mode": "full",
        "weights_path": "/w/new",
        "version": "7",
        "rollback_path": "/w/old",
    }


def test_vllm_admin_reads_empty_text_and_json_replies_and_tolerates_a_loaded_adapter(server):
    httpd, url = server
    admin = VLLMAdmin(url + "/v1", timeout_s=5, api_key="k")  # its OpenAI base URL works too
    admin.pause()
    assert httpd.seen[-1][:2] == ("POST", "/pause?mode=wait") and httpd.seen[-1][3] == b"{}"
    admin.set_weight_version("13")
    assert json.loads(httpd.seen[-1][3]) == {"new_version": "13"}
    admin.resume()  # a plain-text reply is an answer, not an error
    assert admin.weight_version() == "12" and httpd.seen[-1][2]["Authorization"] == "Bearer k"
    admin.load_lora("policy@3", "/adapters/3")  # already there: a rollback reloading it is a no-op
    with pytest.raises(SwapError, match="HTTP 404"):
        admin.unload_lora("policy@3")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "127.0.0.1:80/x"])
def test_only_http_urls_are_opened(url):
    with pytest.raises(ValueError, match="not an http"):
        get_json(url, timeout=1)
