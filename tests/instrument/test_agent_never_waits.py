"""Nothing on the agent's call path waits on the network (issue 36): with a known vLLM server whose
/weight_info never answers (as a server stuck mid-swap), `rollout()`, `reward()` and `@tool` return at
once and an asyncio agent's event loop keeps running (also while its first call to a server not seen yet
waits for that server's hung /v1/models); and each LLM span still carries the weight
version that served it, also for a call made right after a swap (the version is read by a background
thread per server, after the call's response arrived, and the span ends once it is known).

The server is tests/stall_server.py: a real socket on 127.0.0.1 speaking vLLM's routes and response
layout (a real vLLM's /weight_info cannot be made to hang; its version changes only through a swap,
which tests/end_to_end/test_end_to_end.py does). The instrumented agent runs in a process of its own
(instrument() configures a process once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from repo_paths import TESTS
from stall_server import COMPLETION_IDS, StallServer

import lightning_otel
from lightning_otel.core.vllm_endpoint import ENDPOINTS


def test_rollouts_never_wait_for_a_server_that_does_not_answer():
    server = StallServer(version="3")
    try:
        assert ENDPOINTS.info(server.base_url, {}).is_vllm  # a known vLLM server: its version is read
        server.state["hang"] = True  # from now on /weight_info is accepted and never answered

        @lightning_otel.tool
        def add(a: int, b: int) -> int:
            return a + b

        start = time.perf_counter()
        for i in range(100):
            with lightning_otel.rollout(task_id=f"t{i}"):
                add(1, 2)
                lightning_otel.reward(1.0)
        took = time.perf_counter() - start
        assert took < 1.0, f"100 rollouts took {took:.2f} s: something waited on the hung server"
        time.sleep(0.3)  # the background reader has asked by now, and still waits
        assert server.state["weight_reads"] >= 2
        assert ENDPOINTS.weight_version(server.base_url) == "3"  # the last version read, from memory
    finally:
        ENDPOINTS.forget()
        server.stop()


AGENT = r"""
import asyncio, json, sys, time, openai, lightning_otel
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from stall_server import control
from lightning_otel.core import schema
base_url = sys.argv[1]
control(base_url, version="1", delay_s=0.02)  # answers a chat completion in 20 ms
sink = base_url.removesuffix("/v1") + "/v1/traces"
inst = lightning_otel.instrument(endpoint=sink, service_name="never-waits")
memory = InMemorySpanExporter()
inst.tracer_provider.add_span_processor(SimpleSpanProcessor(memory))
client, aclient = openai.OpenAI(base_url=base_url, api_key="x"), openai.AsyncOpenAI(base_url=base_url, api_key="x")
ask = dict(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
out = {}

# a swap, then a rollout right away: its call is labelled with the new version
with lightning_otel.rollout(task_id="before", rollout_id="before"):
    client.chat.completions.create(**ask)
inst.flush()  # this model of a swap takes no time: a real one pauses, reloads, then sets the version
control(base_url, version="2")  # the swap ends (vLLM sets the version before it resumes)
with lightning_otel.rollout(task_id="after", rollout_id="after"):
    client.chat.completions.create(**ask)
inst.flush()

# the server stuck mid-swap: its /weight_info never answers from here on
# its /v1/models hangs too: a client under another name (a server not seen yet) asks it in a worker thread
control(base_url, hang=True, hang_models=True)
unseen = openai.AsyncOpenAI(base_url=base_url.replace("127.0.0.1", "localhost"), api_key="x")
stalls = []

import threading
SCHEDSTAT = f"/proc/self/task/{threading.get_native_id()}/schedstat"

def queued_s():  # how long this thread has waited for a CPU another process held (Linux schedstat)
    try:
        with open(SCHEDSTAT) as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return 0.0

async def probe(stop):  # how long the loop did not run, less the time the OS gave its CPU to others
    while not stop.is_set():
        before, queued = time.perf_counter(), queued_s()
        await asyncio.sleep(0.005)
        stalls.append(time.perf_counter() - before - 0.005 - (queued_s() - queued))

@lightning_otel.tool
async def lookup(q: str) -> str:
    return q

async def one(i):  # 8 at once: on a 2-core machine, 64 at once stall the loop ~90 ms uninstrumented (BENCHMARKS.md)
    with lightning_otel.rollout(task_id=f"t{i % 8}", rollout_id=f"hung-{i}"):
        await aclient.chat.completions.create(**ask)
        await lookup("x")
        await aclient.chat.completions.create(**ask)
        lightning_otel.reward(1.0)

async def main():
    with lightning_otel.rollout(task_id="warm", rollout_id="warm"):
        await aclient.chat.completions.create(**ask)  # the async client's first call builds what it lazily needs
    stop = asyncio.Event()
    watcher = asyncio.create_task(probe(stop))
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(8)), unseen.chat.completions.create(**ask))
    out["async_s"] = time.perf_counter() - start
    stop.set()
    await watcher

asyncio.run(main())
out["max_stall_s"] = max(stalls)
out["top_stalls"] = sorted(stalls)[-5:]
start = time.perf_counter()
for i in range(100):
    with lightning_otel.rollout(task_id="sync"):
        pass
out["rollouts_s"] = time.perf_counter() - start
inst.flush()
import array
out["spans"] = [
    {"rollout": s.attributes.get(schema.ROLLOUT_ID), "version": s.attributes.get(schema.POLICY_VERSION),
     "ids": list(array.array("i", s.attributes[schema.PACKED_COMPLETION_TOKEN_IDS]))
     if schema.PACKED_COMPLETION_TOKEN_IDS in s.attributes else None}
    for s in memory.get_finished_spans() if s.attributes.get(schema.OPENINFERENCE_SPAN_KIND) == "LLM"
]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory) -> dict:
    here = TESTS
    server = subprocess.Popen(
        [sys.executable, str(here / "stall_server.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        base_url = server.stdout.readline().strip()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
        result = subprocess.run(
            [sys.executable, "-c", AGENT, base_url], capture_output=True, text=True, timeout=120, env=env
        )
    finally:
        server.stdin.close()
        server.wait(timeout=10)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_an_asyncio_agent_never_stalls_while_a_server_hangs(agent_run):
    assert agent_run["max_stall_s"] < 0.05, (
        f"{agent_run} the event loop stalled {agent_run['max_stall_s'] * 1000:.0f} ms"
    )
    assert agent_run["rollouts_s"] < 1.0
    hung = [s for s in agent_run["spans"] if (s["rollout"] or "").startswith("hung-")]
    assert len(hung) == 16  # every call recorded, with its token ids
    assert all(s["ids"] == COMPLETION_IDS for s in hung)
    assert {s["version"] for s in hung} == {"2"}  # the reader failed: the last version it read


def test_a_call_right_after_a_swap_carries_the_new_version(agent_run):
    by_rollout = {s["rollout"]: s for s in agent_run["spans"]}
    assert (by_rollout["before"]["version"], by_rollout["after"]["version"]) == ("1", "2")
    assert by_rollout["after"]["ids"] == COMPLETION_IDS
