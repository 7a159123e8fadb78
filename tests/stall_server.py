"""A local server that speaks vLLM's routes the agent side reads, and can stop answering.

GET /v1/models (owned_by vllm), GET /weight_info (the version in `state`), POST .../chat/completions
(vLLM's response layout with token ids and logprobs, or its stream, after `state["delay_s"]`), POST /v1/traces (an
OTLP sink: 200, body dropped), POST /control (JSON merged into `state`, for a server run as
`python stall_server.py`, in a process of its own so that it does not compete with the agent for its
GIL). While `state["hang"]` is true, /weight_info is accepted and never
answered, as a server stuck mid-swap does; `state["weight_delay_s"]` delays its answer, as a busy
server's; `state["hang_models"]` does the same to /v1/models. A real socket on 127.0.0.1; `stop()` closes it.

The swap routes a gateway calls (POST /pause, /collective_rpc, /reset_prefix_cache,
/update_weight_version, /resume) answer as vLLM's dev mode does. A /weight_info that arrives between
/pause and /resume (each arrival sets `weight_read`) is answered `state["paused_weight_delay_s"]`
after /resume, as a replica busy with its reload and backlog answers late; /collective_rpc (the
reload) sets `reloading` and returns once `reload_may_finish` is set.
"""

from __future__ import annotations

import json
import socketserver
import threading
import time

PROMPT_IDS, COMPLETION_IDS, LOGPROBS = [1, 2, 3, 4], [7, 8], [-0.25, -0.5]
_SWAP_ROUTES = ("/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume")


def chat_reply(model: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "prompt_token_ids": PROMPT_IDS,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
                "token_ids": COMPLETION_IDS,
                "logprobs": {
                    "content": [{"token": "t", "logprob": lp, "bytes": None, "top_logprobs": []} for lp in LOGPROBS]
                },
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }


class StallServer:
    def __init__(self, version: str = "1", delay_s: float = 0.0) -> None:
        self.state = {"version": version, "hang": False, "delay_s": delay_s, "weight_reads": 0, "chats": 0}
        self.released = threading.Event()  # set at stop(): hung handlers return
        self.resumed, self.reloading, self.reload_may_finish = threading.Event(), threading.Event(), threading.Event()
        self.weight_read = threading.Event()
        self.resumed.set()
        self.reload_may_finish.set()
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                request_line = self.rfile.readline().decode("latin-1").split()
                if len(request_line) < 2:
                    return
                method, path = request_line[0], request_line[1]
                length = 0
                while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = self.rfile.read(length) if length else b""
                server.route(self, method, path, body)

        class Server(socketserver.ThreadingTCPServer):
            request_queue_size = 256  # the default 5 drops the SYNs of 64 clients connecting at once (1 s retries)

        self.tcp = Server(("127.0.0.1", 0), Handler)
        self.tcp.daemon_threads = True
        threading.Thread(target=self.tcp.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.tcp.server_address[1]}/v1"

    def route(self, handler, method: str, path: str, body: bytes) -> None:
        state = self.state
        if path == "/weight_info":
            state["weight_reads"] += 1
            if state["hang"]:
                self.released.wait()  # accepted, never answered
                return
            self.weight_read.set()
            if not self.resumed.is_set():
                self.resumed.wait()
                time.sleep(state.get("paused_weight_delay_s", 0.0))
            time.sleep(state.get("weight_delay_s", 0.0))  # a replica too busy to answer at once
            reply = {"weight_version": state["version"]}
        elif path == "/v1/models":
            if state.get("hang_models"):  # as /weight_info: accepted, never answered
                self.released.wait()
                return
            reply = {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "vllm"}]}
        elif method == "POST" and path.endswith("/chat/completions"):
            time.sleep(state["delay_s"])
            state["chats"] += 1
            request = json.loads(body)
            if request.get("stream"):
                self.stream(handler, request.get("model", "policy"))
                return
            reply = chat_reply(request.get("model", "policy"))
        elif method == "POST" and path == "/v1/traces":
            reply = {}
        elif method == "POST" and path.split("?")[0] in _SWAP_ROUTES:
            reply = self.swap_step(path.split("?")[0], json.loads(body) if body else {})
        elif method == "POST" and path == "/control":  # another process sets version, hang, delay_s
            state.update(json.loads(body))
            reply = state
        else:
            handler.wfile.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        data = json.dumps(reply).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        handler.wfile.write(head.encode() + data)

    def swap_step(self, route: str, body: dict) -> dict:
        if route == "/pause":
            self.resumed.clear()
        elif route == "/collective_rpc":
            self.reloading.set()
            self.reload_may_finish.wait()
        elif route == "/update_weight_version":
            self.state["version"] = body["new_version"]
        elif route == "/resume":
            self.resumed.set()
        return {}

    @staticmethod
    def stream(handler, model: str) -> None:
        """vLLM's stream: prompt ids at the top of the first chunk, each chunk's new ids and logprobs."""
        chunks = []
        for i, (token, logprob) in enumerate(zip(COMPLETION_IDS, LOGPROBS, strict=True)):
            last = i == len(COMPLETION_IDS) - 1
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": "h" if i == 0 else "i"},
                        "token_ids": [token],
                        "logprobs": {
                            "content": [{"token": "t", "logprob": logprob, "bytes": None, "top_logprobs": []}]
                        },
                        "finish_reason": "stop" if last else None,
                    }
                ],
            }
            if i == 0:
                chunk["prompt_token_ids"] = PROMPT_IDS
            chunks.append(f"data: {json.dumps(chunk)}\n\n")
        data = ("".join(chunks) + "data: [DONE]\n\n").encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        handler.wfile.write(head.encode() + data)

    def stop(self) -> None:
        self.released.set()
        self.resumed.set()
        self.reload_may_finish.set()
        self.tcp.shutdown()
        self.tcp.server_close()


def control(base_url: str, **changes) -> dict:
    import urllib.request

    url = base_url.removesuffix("/v1") + "/control"
    request = urllib.request.Request(url, json.dumps(changes).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.loads(reply.read())


if __name__ == "__main__":  # prints its base URL, serves until stdin closes
    import sys

    running = StallServer()
    print(running.base_url, flush=True)
    sys.stdin.read()
    running.stop()
