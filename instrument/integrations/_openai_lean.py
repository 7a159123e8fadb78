"""Lean OpenAI SDK spans (`instrument(openai_spans="lean")`): chat and text completions get our own
span, named and attributed as OpenInference's (openinference_attributes.py), with the same token
capture as openai_sdk.py's; every other endpoint still goes through OpenInference. It exists for
speed: with token capture OpenInference's span costs ~470 us per call here, the lean one (a
direct_span.DirectSpan) ~165 (BENCHMARKS.md); what it leaves out is listed in
openinference_attributes.py.

A lean non-streaming call reads vLLM's token fields from the response JSON before the SDK builds its
objects (BaseClient._process_response_data, wrapped while such a call runs in this context), and takes
out those the caller did not ask for: the caller gets the response it would have had uninstrumented,
and the SDK is spared a logprob object per token (the largest single cost of token capture).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Status, StatusCode

from lightning_otel.instrument.direct_span import start_span
from lightning_otel.instrument.integrations.openai_sdk import _safely, _stamp, _token_fields, _watch
from lightning_otel.instrument.openinference_attributes import output_attributes, request_attributes, response_attributes, stream_text
from lightning_otel.instrument.options import Options
from lightning_otel.instrument.vllm_endpoint import CHAT, COMPLETIONS, StreamAccumulator, endpoint_kind, token_attributes

log = logging.getLogger(__name__)


class _LeanCall:
    """One chat/completions call's span, from request to the end of its response or stream."""

    def __init__(self, tracer: trace.Tracer, kind: str, body: dict, options: Options) -> None:
        self.kind, self.body, self.hide_outputs = kind, body, options.hide_outputs
        self.span = start_span(tracer, _SPAN_NAMES[kind], trace.SpanKind.CLIENT, request_attributes(kind, body, options.hide_inputs))
        self.base_url: str | None = None  # set when token ids are captured
        self.accumulator: StreamAccumulator | None = None
        self.texts: list[str] = []
        self.ended = False
        self.strip_ids = self.strip_logprobs = False  # token fields the caller did not ask for
        self.taken: dict[str, Any] | None = None  # token attributes taken from the response JSON

    def chunk(self, chunk: Any) -> None:
        if self.accumulator is not None:
            self.accumulator.add(chunk)
        text = stream_text(self.kind, chunk)
        if text:
            self.texts.append(text)

    def done(self, parsed: Any, completed: bool) -> None:
        if self.ended:
            return
        self.ended = True
        try:
            if parsed is not None:
                attributes = response_attributes(self.kind, parsed, self.hide_outputs)
                if self.base_url:
                    attributes.update(self.taken if self.taken is not None else token_attributes(self.kind, parsed))
            else:  # a stream: what it delivered (token ids only when it ran to its end)
                attributes = output_attributes(self.kind, "".join(self.texts), self.hide_outputs)
                if self.accumulator is not None and completed:
                    attributes.update(self.accumulator.attributes())
                    attributes.update(self.accumulator.token_counts())  # streams carry no usage unless asked
            _stamp(self.span, attributes, self.base_url)
        finally:
            self.span.end()  # with what could be recorded, whatever went wrong

    def __enter__(self) -> "_LeanCall":
        """While the request runs: its span is the current one; a failure ends it as an error."""
        self._token = context_api.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, kind, exc, traceback) -> None:  # noqa: ANN001
        context_api.detach(self._token)
        if exc is not None:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        self.ended = True
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.span.end()

    def add_token_fields(self, client: Any, request_options: Any, capture: str) -> None:
        """Ask vLLM for token ids and logprobs, on the SDK's request options themselves (made per
        call, and copied by the SDK before use; no other wrapper holds them)."""
        fields = _token_fields(client, request_options, self.kind, self.body, capture)
        if fields is not None:
            extra = request_options.extra_json or {}
            ids, logprobs = (extra[k] if k in extra else self.body.get(k) for k in ("return_token_ids", "logprobs"))
            self.strip_ids, self.strip_logprobs = not ids, (not logprobs if self.kind == CHAT else logprobs is None)
            request_options.extra_json, self.base_url = fields

    def take(self, data: dict) -> None:
        """Read the token fields from the response JSON before the SDK builds its objects, and take
        out those the caller did not ask for: it gets the response it would have had without us, and
        the SDK does not build a logprob object per token that nobody reads (~60 us a call here)."""
        if self.taken is not None:
            return
        self.taken = token_attributes(self.kind, data)
        choices = data.get("choices") if type(data.get("choices")) is list else ()
        if self.strip_ids:
            data.pop("prompt_token_ids", None)
        for choice in choices:
            if type(choice) is dict:
                if self.strip_ids:
                    choice.pop("token_ids", None)
                    choice.pop("prompt_token_ids", None)
                if self.strip_logprobs and "logprobs" in choice:
                    choice["logprobs"] = None

    def watch(self, response: Any) -> Any:
        self.accumulator = StreamAccumulator(self.kind) if self.base_url else None
        return _watch(response, self.chunk, self.done)


_SPAN_NAMES = {CHAT: "ChatCompletion", COMPLETIONS: "Completion"}
_taking: ContextVar[_LeanCall | None] = ContextVar("lightning_otel_openai_taking", default=None)


class _Offer:
    """While the SDK's request runs, the call's response JSON is offered to its take() (not for
    streams: their chunks are parsed as the caller reads them, after the request returned)."""

    __slots__ = ("call", "token")

    def __init__(self, call: _LeanCall, kwargs: dict) -> None:
        self.call = call if call.base_url is not None and not kwargs.get("stream") else None

    def __enter__(self) -> None:
        self.token = _taking.set(self.call) if self.call is not None else None

    def __exit__(self, *exc: Any) -> None:
        if self.token is not None:
            _taking.reset(self.token)


def _taking_wrapper(original):  # noqa: ANN001, ANN202
    """BaseClient._process_response_data, which turns a response's JSON into SDK objects: a lean call
    in progress in this context reads (and trims) the JSON first."""

    def _process_response_data(self, *, data, cast_to, response):  # noqa: ANN001, ANN202
        call = _taking.get()
        if call is not None and type(data) is dict:
            _safely(call.take, data)
        return original(self, data=data, cast_to=cast_to, response=response)

    _process_response_data.__wrapped__ = original
    return _process_response_data


def _lean_call(args: tuple, tracer: trace.Tracer, options: Options) -> _LeanCall | None:
    """A lean span for a chat or text completion request, None for anything else (or when
    instrumentation is suppressed)."""
    if len(args) < 2 or not is_instrumentation_enabled():
        return None
    kind = endpoint_kind(str(getattr(args[1], "url", "")))
    body = getattr(args[1], "json_data", None)
    if kind is None or not isinstance(body, dict):
        return None
    try:
        return _LeanCall(tracer, kind, body, options)
    except Exception:  # noqa: BLE001 - an unexpected body: OpenInference's span instead, never a failed call
        log.exception("lightning_otel: could not start a lean span; using OpenInference's")
        return None


def _lean_sync_wrapper(original, other, tracer: trace.Tracer, options: Options):  # noqa: ANN001, ANN202
    def request(self, *args, **kwargs):
        call = _lean_call(args, tracer, options)
        if call is None:
            return other(self, *args, **kwargs)  # other endpoints: OpenInference's span
        with call:
            call.add_token_fields(self, args[1], options.capture_tokens)
            with _Offer(call, kwargs):
                response = original(self, *args, **kwargs)
        return call.watch(response)

    request.__wrapped__ = original
    return request


def _lean_async_wrapper(original, other, tracer: trace.Tracer, options: Options):  # noqa: ANN001, ANN202
    async def request(self, *args, **kwargs):
        call = _lean_call(args, tracer, options)
        if call is None:
            return await other(self, *args, **kwargs)
        with call:
            call.add_token_fields(self, args[1], options.capture_tokens)
            with _Offer(call, kwargs):
                response = await original(self, *args, **kwargs)
        return call.watch(response)

    request.__wrapped__ = original
    return request


