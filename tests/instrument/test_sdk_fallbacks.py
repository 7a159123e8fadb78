"""A private SDK internal gone (as in a future `openai` release that moves it): capture keeps working on
the public path, the miss is logged once, and every rollout span counts it (`lightning.sdk.fallbacks`).

The agent runs in a process of its own (instrument() configures a process once) against
tests/stall_server.py (vLLM's routes and response layout with token ids; no model is needed to see
whether ids are captured). The move is simulated by taking `_process_response_data` off `BaseClient`
and putting it on its two subclasses: the SDK still works, our hook no longer finds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from repo_paths import TESTS
from stall_server import COMPLETION_IDS, LOGPROBS, PROMPT_IDS

AGENT = r"""
import array, json, sys, openai, lightning_otel
from openai._base_client import AsyncAPIClient, BaseClient, SyncAPIClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from stall_server import StallServer
from lightning_otel.core import schema
moved = BaseClient.__dict__["_process_response_data"]  # a release that moved it to the subclasses
del BaseClient._process_response_data
SyncAPIClient._process_response_data = AsyncAPIClient._process_response_data = moved
server = StallServer(version="5")
inst = lightning_otel.instrument(endpoint=server.base_url.removesuffix("/v1") + "/v1/traces")
memory = InMemorySpanExporter()
inst.tracer_provider.add_span_processor(SimpleSpanProcessor(memory))
client = openai.OpenAI(base_url=server.base_url, api_key="x")
for i in range(2):
    with lightning_otel.rollout(task_id="t"):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
inst.flush()
unpack = lambda value, code: list(array.array(code, value)) if value is not None else None
spans = [
    {"kind": s.attributes.get(schema.OPENINFERENCE_SPAN_KIND), "fallbacks": s.attributes.get(schema.SDK_FALLBACKS),
     "prompt": unpack(s.attributes.get(schema.PACKED_PROMPT_TOKEN_IDS), "i"),
     "completion": unpack(s.attributes.get(schema.PACKED_COMPLETION_TOKEN_IDS), "i"),
     "logprobs": unpack(s.attributes.get(schema.PACKED_COMPLETION_LOGPROBS), "d"),
     "version": s.attributes.get(schema.POLICY_VERSION)}
    for s in memory.get_finished_spans()
]
print(json.dumps(spans))
server.stop()
"""


def test_a_moved_openai_internal_keeps_capture_logs_once_and_is_counted():
    here = TESTS
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", AGENT], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    spans = json.loads(result.stdout.strip().splitlines()[-1])
    llm = [s for s in spans if s["kind"] == "LLM"]
    assert len(llm) == 2
    for span in llm:  # captured through the public path: the SDK's objects
        assert (span["prompt"], span["completion"], span["logprobs"]) == (PROMPT_IDS, COMPLETION_IDS, LOGPROBS)
        assert span["version"] == "5"
    rollouts = [s for s in spans if s["kind"] == "AGENT"]
    assert [s["fallbacks"] for s in rollouts] == [1, 1]
    assert result.stderr.count("BaseClient._process_response_data not found") == 1
