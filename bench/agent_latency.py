"""What the agent side costs an agent's own timing (issue 36): `rollout()` open+close latency with 0, 1
and 3 known vLLM servers, one of them not answering; and an asyncio agent's event-loop stalls with and
without instrumentation.

    python bench/agent_latency.py

Servers are local vLLM look-alikes (aiohttp, in processes of their own): vLLM's routes the agent side
reads (/v1/models, /weight_info) and a chat completion in vLLM's layout with token ids and logprobs
(stub_vllm.py's body) answered after `--delay-ms`. A server told to hang accepts /weight_info and
never answers, as a server stuck mid-swap does. Spans go to a real collector.

Part 1, per known-server count: 2,000 `rollout()` open+close pairs back to back and 50 opened 20 ms
apart (the issue measured ~3.7 ms per rollout when they were 60 ms apart), p50/p99/max.
Part 2: 64 rollouts at once on one event loop (two chat calls, an async @tool and a reward each)
against a server answering in 20 ms; a probe task sleeps 5 ms at a time and records how much longer
the loop took to come back: "stall" (wall) and "stall less run-queue wait" (less the time Linux says
the loop's thread waited for a CPU another process held: on a shared 2-core machine that wait is
most of the raw figure). Modes: bare (no instrument()), instrumented, instrumented with the server's
/weight_info hung.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVER = r"""
import asyncio, json, sys
from aiohttp import web
sys.path.insert(0, sys.argv[3])
from stub_vllm import response
port, delay = int(sys.argv[1]), float(sys.argv[2]) / 1000
state = {"hang": False}
body = response(True, True)
models = json.dumps({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "vllm"}]})
async def weight_info(_):
    if state["hang"]:
        await asyncio.sleep(3600)
    return web.json_response({"weight_version": "7"})
async def chat(request):
    await request.read()
    if delay:
        await asyncio.sleep(delay)
    return web.Response(body=body, content_type="application/json")
async def control(request):
    state.update(await request.json())
    return web.json_response(state)
app = web.Application()
app.router.add_get("/v1/models", lambda _: web.Response(text=models, content_type="application/json"))
app.router.add_get("/weight_info", weight_info)
app.router.add_post("/v1/chat/completions", chat)
app.router.add_post("/control", control)
web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=1024)
"""

ROLLOUTS = r"""
import json, sys, time, lightning_otel
from lightning_otel.core.http_json import post_json
from lightning_otel.core.vllm_endpoint import ENDPOINTS
endpoint, urls = sys.argv[1], json.loads(sys.argv[2])
inst = lightning_otel.instrument(endpoint=endpoint, service_name="bench-rollouts")
for url in urls:
    assert ENDPOINTS.info(url, {}).is_vllm  # known: its version is read from now on
if urls:  # the first one stops answering /weight_info
    post_json(urls[0].removesuffix("/v1") + "/control", {"hang": True}, timeout=5)
def pair():
    t = time.perf_counter()
    with lightning_otel.rollout(task_id="bench"):
        pass
    return time.perf_counter() - t
for _ in range(200):
    pair()
back_to_back = [pair() for _ in range(2000)]
spaced = []
for _ in range(50):
    time.sleep(0.02)
    spaced.append(pair())
print(json.dumps({"back_to_back": back_to_back, "spaced": spaced}))
"""

ASYNC_AGENT = r"""
import asyncio, contextlib, json, sys, threading, time, openai
from lightning_otel.core.http_json import post_json
mode, url, endpoint = sys.argv[1], sys.argv[2], sys.argv[3]
import lightning_otel
if mode != "bare":
    lightning_otel.instrument(endpoint=endpoint, service_name="bench-async")
client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
ask = dict(model="policy", messages=[{"role": "user", "content": "hello " * 50}], max_tokens=32)
SCHEDSTAT = f"/proc/self/task/{threading.get_native_id()}/schedstat"
def queued():
    try:
        with open(SCHEDSTAT) as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return 0.0
raw, adjusted = [], []
async def probe(stop):
    while not stop.is_set():
        t, q = time.perf_counter(), queued()
        await asyncio.sleep(0.005)
        late = time.perf_counter() - t - 0.005
        raw.append(late)
        adjusted.append(late - (queued() - q))
if mode == "bare":
    rollout = lambda **_: contextlib.nullcontext()
    tool = lambda fn: fn
    reward = lambda value: None
else:
    rollout, tool, reward = lightning_otel.rollout, lightning_otel.tool, lightning_otel.reward
@tool
async def lookup(q: str) -> str:
    return q
async def one(i):
    with rollout(task_id=f"t{i % 8}"):
        await client.chat.completions.create(**ask)
        await lookup("x")
        await client.chat.completions.create(**ask)
        reward(1.0)
async def main():
    await asyncio.gather(*(one(i) for i in range(8)))  # warm up: connections, lazy imports, the vLLM probe
    if mode == "hung":
        post_json(url.removesuffix("/v1") + "/control", {"hang": True}, timeout=5)
    stop = asyncio.Event()
    watcher = asyncio.create_task(probe(stop))
    t = time.perf_counter()
    for _ in range(3):
        await asyncio.gather(*(one(i) for i in range(64)))
    took = time.perf_counter() - t
    stop.set()
    await watcher
    return took
took = asyncio.run(main())
print(json.dumps({"took": took, "raw": raw, "adjusted": adjusted}))
"""


def start_server(port: int, delay_ms: float) -> subprocess.Popen:
    from lightning_otel.core.servers import wait_http_ok

    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), str(delay_ms), str(HERE)], start_new_session=True
    )
    wait_http_ok(f"http://127.0.0.1:{port}/v1/models", 30, server, "look-alike")
    return server


def run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the async part's server answer time")
    args = parser.parse_args()
    from lightning_otel.core.servers import free_port, stop_process
    from lightning_otel.testing.servers import CollectorProcess

    began = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="lightning-agent-latency-"))
    servers: list[subprocess.Popen] = []
    try:
        with CollectorProcess(workdir / "data") as collector:
            print("rollout() open+close, us | back to back: p50 p99 max | 20 ms apart: p50 p99 max")
            for known in (0, 1, 3):
                ports = [free_port() for _ in range(known)]
                servers += [start_server(port, 0) for port in ports]
                urls = [f"http://127.0.0.1:{port}/v1" for port in ports]
                r = run(ROLLOUTS, collector.traces_endpoint, json.dumps(urls))
                line = " | ".join(
                    " ".join(f"{f(r[k]) * 1e6:8.0f}" for f in (statistics.median, lambda v: pct(v, 0.99), max))
                    for k in ("back_to_back", "spaced")
                )
                print(f"{known} known server(s){', first hung' if known else '':>12} | {line}")
                for server in servers:
                    stop_process(server)
                servers.clear()
            print(f"\n64 rollouts at once on one loop x 3 (server answers in {args.delay_ms:g} ms); loop stall, ms")
            print("mode          | took s | stall: p99  max | less run-queue wait: p99  max")
            for mode in ("bare", "instrumented", "hung", "bare", "instrumented", "hung"):
                port = free_port()
                servers.append(start_server(port, args.delay_ms))
                r = run(ASYNC_AGENT, mode, f"http://127.0.0.1:{port}/v1", collector.traces_endpoint)
                stop_process(servers.pop())
                print(
                    f"{mode:13} | {r['took']:6.2f} | {pct(r['raw'], 0.99) * 1e3:9.1f} {max(r['raw']) * 1e3:5.1f} | "
                    f"{pct(r['adjusted'], 0.99) * 1e3:26.1f} {max(r['adjusted']) * 1e3:5.1f}"
                )
    finally:
        for server in servers:
            stop_process(server)
    print(f"\nwhole run: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
