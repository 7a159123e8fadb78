"""instrument(), rollout(), reward() and @tool against a real collector process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import wait_for
from opentelemetry import trace

import lightning_otel
from lightning_otel.collector import connect
from lightning_otel.core.servers import free_port


def _rows(collector, sql, expected_count, *params):
    def query():
        return connect(collector.data_dir).execute(sql, list(params)).fetchall()

    return wait_for(query, lambda rows: len(rows) >= expected_count)


def test_instrument_twice_adds_nothing(instrumented, session_collector):
    provider = instrumented.tracer_provider
    processors = len(provider._active_span_processor._span_processors)
    assert lightning_otel.instrument() is instrumented
    assert lightning_otel.instrument(endpoint="http://127.0.0.1:1/ignored") is instrumented
    assert len(provider._active_span_processor._span_processors) == processors
    with trace.get_tracer("t").start_as_current_span("only-once"):
        pass
    instrumented.flush()
    rows = wait_for(
        lambda: (
            connect(session_collector.data_dir)
            .execute("SELECT count(*) FROM spans WHERE name = 'only-once'")
            .fetchone()[0]
        ),
        lambda n: n >= 1,
    )
    # the raw files hold it once too: no second exporter sent a copy
    raw = (
        connect(session_collector.data_dir)
        .execute(
            f"SELECT count(*) FROM read_parquet('{session_collector.data_dir}/spans/**/*.parquet') WHERE name = 'only-once'"
        )
        .fetchone()[0]
    )
    assert rows == 1 and raw == 1
    # the dev extra installs every supported library, so every integration is on
    assert instrumented.integrations == [
        "threading",
        "openai",
        "openai-responses",
        "anthropic",
        "langchain",
        "openai-agents",
        "litellm",
    ]


def test_missing_libraries_are_skipped_quietly():
    from lightning_otel.instrumentation.integrations._installed import installed

    assert installed("json") and not installed("no_such_library_here")
    assert not installed("json", "no_such_library_here.sub")


def test_rollout_identity_reaches_every_span_and_rewards(instrumented, session_collector):
    @lightning_otel.tool
    def lookup(key: str) -> dict:
        return {"key": key, "value": 42}

    with lightning_otel.rollout(task_id="task-ident") as rollout:
        lookup("answer")
        with trace.get_tracer("t").start_as_current_span("sub-agent"):
            lightning_otel.reward(0.25, name="format")
        rollout.reward(1.0)
    lightning_otel.reward(0.5, name="late", rollout_id=rollout.rollout_id)  # after the rollout ended
    instrumented.flush()
    rows = _rows(
        session_collector,
        "SELECT name, span_kind, task_id, tool_name FROM spans WHERE rollout_id = ? ORDER BY name, task_id NULLS LAST",
        6,
        rollout.rollout_id,
    )
    assert rows == [
        ("lookup", "TOOL", "task-ident", "lookup"),
        ("reward", "EVALUATOR", "task-ident", None),
        ("reward", "EVALUATOR", "task-ident", None),
        ("reward", "EVALUATOR", None, None),  # late: only the rollout id ties it
        ("rollout", "AGENT", "task-ident", None),
        ("sub-agent", None, "task-ident", None),
    ]
    conn = connect(session_collector.data_dir)
    reward, rewards, calls, tools = conn.execute(
        "SELECT reward, rewards, llm_calls, tool_calls FROM rollouts WHERE rollout_id = ?", [rollout.rollout_id]
    ).fetchone()
    assert reward == 1.0 and rewards == {"format": 0.25, "late": 0.5, "reward": 1.0}
    assert (calls, tools) == (0, 1)
    tool_output = conn.execute("SELECT output FROM tool_calls WHERE rollout_id = ?", [rollout.rollout_id]).fetchone()[0]
    assert json.loads(tool_output) == {"key": "answer", "value": 42}


def test_bad_rewards_are_refused_at_the_source(instrumented):
    with pytest.raises(ValueError, match="finite"):
        with lightning_otel.rollout(task_id="t"):
            lightning_otel.reward(float("nan"))
    with pytest.raises(ValueError, match="number"):
        lightning_otel.reward("high", rollout_id="r")
    with pytest.raises(RuntimeError, match="outside a rollout"):
        lightning_otel.reward(1.0)
    with pytest.raises(ValueError, match="task_id"):
        with lightning_otel.rollout(task_id=""):
            pass


def test_spans_are_flushed_at_interpreter_exit(session_collector):
    script = (
        "import lightning_otel\n"
        f"lightning_otel.instrument(endpoint={session_collector.traces_endpoint!r}, service_name='exit-test')\n"
        "with lightning_otel.rollout(task_id='exit-task'):\n"
        "    pass\n"
    )  # no flush(): the TracerProvider's exit hook must send it
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    rows = _rows(session_collector, "SELECT task_id FROM spans WHERE service_name = 'exit-test'", 1)
    assert rows == [("exit-task",)]


class _OtherProviderHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that is not vLLM: stands for a hosted provider, which a test
    cannot reach from this machine. It records request bodies so the test can check them."""

    bodies: list = []

    def log_message(self, *args):
        pass

    def _send(self, payload):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "gpt-x", "object": "model", "owned_by": "someone-else"}]})

    def do_POST(self):
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self._send(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": "gpt-x",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )


def test_other_providers_get_plain_requests_and_normal_spans(instrumented, session_collector):
    import openai

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _OtherProviderHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="k")
        with lightning_otel.rollout(task_id="other-provider") as rollout:
            reply = client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "hello"
    finally:
        server.shutdown()
    body = _OtherProviderHandler.bodies[-1]
    assert "return_token_ids" not in body and "logprobs" not in body
    instrumented.flush()
    rows = _rows(
        session_collector,
        "SELECT model_name, token_count_prompt, prompt_token_ids FROM llm_calls WHERE rollout_id = ?",
        1,
        rollout.rollout_id,
    )
    assert rows == [("gpt-x", 3, None)]


def test_a_dead_collector_never_blocks_the_agent_and_losses_are_counted():
    """Collector down, tiny queue: spans are dropped and counted, the agent runs on and exits."""
    code = (
        "import json, lightning_otel\n"
        "from lightning_otel.core.servers import free_port\n"
        "inst = lightning_otel.instrument(endpoint=f'http://127.0.0.1:{free_port()}/v1/traces')\n"
        "for i in range(2000):\n"
        "    with lightning_otel.rollout(task_id='t'):\n"
        "        lightning_otel.reward(1.0)\n"
        "flushed = inst.flush(timeout_millis=30000)\n"
        "print(json.dumps({'dropped': inst.dropped_spans, 'failed': inst.failed_spans, 'flushed': flushed}))\n"
    )
    env = {
        **os.environ,
        "OTEL_BSP_MAX_QUEUE_SIZE": "64",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
    }
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["dropped"] > 0  # 4,000 spans through a 64-span queue to nowhere
    assert counts["failed"] > 0
    assert counts["flushed"]
    assert counts["dropped"] + counts["failed"] == 4000  # every span accounted for exactly once


def test_redaction_hides_text_but_keeps_what_training_needs(tmp_path):
    """In a fresh process: instrument(hide_inputs, hide_outputs) masks tool I/O (OpenInference masks LLM text)."""
    from lightning_otel.testing.servers import CollectorProcess

    with CollectorProcess(tmp_path / "data", flush_interval_s=0.2) as collector:
        code = (
            "import lightning_otel\n"
            f"inst = lightning_otel.instrument(endpoint={collector.traces_endpoint!r}, hide_inputs=True, hide_outputs=True)\n"
            "@lightning_otel.tool\n"
            "def lookup(secret: str) -> str:\n"
            "    return secret.upper()\n"
            "with lightning_otel.rollout(task_id='private'):\n"
            "    lookup('my password')\n"
            "inst.flush()\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
        rows = wait_for(
            lambda: connect(collector.data_dir).execute("SELECT input, output FROM tool_calls").fetchall(),
            lambda r: len(r) >= 1,
        )
    assert rows == [("__REDACTED__", "__REDACTED__")]


def test_attribute_caps_that_would_cut_ids_are_refused():
    """In a fresh process: a span-limit cap from the environment (the SDK reads
    OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT) that would cut rollout ids, or any cap with base64 token
    encoding, is refused by instrument(); under a cap that fits, ids longer than it are refused
    by rollout() and reward() rather than cut on the spans."""
    code = (
        "import json, os, lightning_otel\n"
        "said = []\n"
        "def attempt(call):\n"
        "    try:\n"
        "        call()\n"
        "        said.append('accepted')\n"
        "    except ValueError as e:\n"
        "        said.append(str(e))\n"
        "dead = 'http://127.0.0.1:9/v1/traces'\n"
        "os.environ['OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT'] = '16'\n"
        "attempt(lambda: lightning_otel.instrument(endpoint=dead))\n"
        "os.environ['OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT'] = '300'\n"
        "attempt(lambda: lightning_otel.instrument(endpoint=dead, token_encoding='base64'))\n"
        "attempt(lambda: lightning_otel.instrument(endpoint=dead))\n"
        "def enter(task_id):\n"
        "    with lightning_otel.rollout(task_id=task_id):\n"
        "        pass\n"
        "attempt(lambda: enter('t' * 301))\n"
        "attempt(lambda: enter('t' * 300))\n"
        "attempt(lambda: lightning_otel.reward(1.0, rollout_id='r' * 301))\n"
        "print(json.dumps(said))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    short, base64, fits, long_task, task_at_cap, long_rollout = json.loads(out.stdout.strip().splitlines()[-1])
    assert "cut string attributes to 16 characters" in short
    assert "base64" in base64
    assert fits == task_at_cap == "accepted"
    assert "task_id is 301 characters, over max_attribute_length=300" in long_task
    assert "rollout_id is 301 characters" in long_rollout
