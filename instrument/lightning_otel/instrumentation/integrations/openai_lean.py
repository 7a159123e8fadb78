"""Lean OpenAI SDK spans (`instrument(openai_spans="lean")`): chat and text completions get our own
span, named and attributed as OpenInference's (openinference_attributes.py), with the same token
capture as openai_capture.py's; every other endpoint still goes through OpenInference. It exists for
speed: with token capture OpenInference's span adds ~340 us per call here, the lean one (a
direct_span.DirectSpan) ~60 (BENCHMARKS.md); what it leaves out is listed in
openinference_attributes.py.

A lean non-streaming call reads vLLM's token fields from the response before the SDK builds its
objects, and sets those the caller did not ask for to null (as vLLM answers a request that does not
ask): the caller gets the response it would have had uninstrumented, and the SDK is spared an int per
prompt token and a logprob object per token, the largest costs of token capture. Where the compiled
scanner (_vllm_tokens.c) is built, this happens on the raw body: the SDK's call of httpx's
Response.json() gets the trimmed JSON and the ids and logprobs come packed from the bytes. A body the
scanner is unsure of, or no scanner, takes the Python path: the SDK parses the body and take() reads
and trims the JSON in BaseClient._process_response_data. Both hooks act only while such a call runs in
this context.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from contextvars import ContextVar, Token
from time import monotonic, time_ns
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Status, StatusCode

from lightning_otel.core import gen_ai, schema
from lightning_otel.core.vllm_endpoint import (
    CHAT,
    COMPLETIONS,
    ENDPOINTS,
    StreamAccumulator,
    endpoint_kind,
    packed_attributes,
    token_attributes,
)
from lightning_otel.instrumentation import sdk_fallbacks
from lightning_otel.instrumentation.direct_span import start_span
from lightning_otel.instrumentation.integrations.openai_capture import (
    NO_FIELDS,
    probe_off_loop,
    safely,
    server_attributes,
    token_fields,
    watch,
)
from lightning_otel.instrumentation.openinference_attributes import (
    output_attributes,
    request_attributes,
    response_attributes,
    stream_text,
)
from lightning_otel.instrumentation.options import Options

log = logging.getLogger(__name__)
try:  # the compiled body scanner (optional at install, as the OTLP encoder); LIGHTNING_OTEL_PURE_PYTHON=1 turns it off
    from lightning_otel.instrumentation.integrations import _vllm_tokens
except ImportError:  # pragma: no cover - a build without a C compiler
    _vllm_tokens = None  # type: ignore[assignment]  # None: not built or turned off, the SDK parses
if os.environ.get("LIGHTNING_OTEL_PURE_PYTHON") == "1":
    _vllm_tokens = None  # type: ignore[assignment]  # None: not built or turned off, the SDK parses


def scanner_built() -> bool:
    """Whether the compiled body scanner is in use (built at install, and not turned off)."""
    return _vllm_tokens is not None


class _LeanCall:
    """One chat/completions call's span, from request to the end of its response or stream."""

    def __init__(self, tracer: trace.Tracer, kind: str, body: dict, options: Options, client: Any) -> None:
        self.kind, self.body, self.hide_outputs = kind, body, options.hide_outputs
        attributes, name = request_attributes(kind, body, options.hide_inputs), _SPAN_NAMES[kind]
        self.gen_ai = options.gen_ai  # the GenAI-convention shape also written, or None
        if self.gen_ai is not None:
            attributes.update(gen_ai.request_attributes(kind, body, self.gen_ai, options.hide_inputs))
            attributes.update(server_attributes(client))
            name = gen_ai.span_name(kind, body.get("model"))
        self.span = start_span(tracer, name, trace.SpanKind.CLIENT, attributes)
        self.streamed: gen_ai.StreamedResponse | None = None  # a stream's chunks, for the GenAI attributes
        self.base_url: str | None = None  # set when token ids are captured
        self.accumulator: StreamAccumulator | None = None
        self.texts: list[str] = []
        self.ended = False
        self.strip_ids = self.strip_logprobs = False  # token fields the caller did not ask for
        self.taken: dict[str, Any] | None = None  # token attributes taken from the response JSON
        self.data: dict | None = None  # that JSON (read for the span faster than the SDK's objects)
        self._offered: Token[_LeanCall | None] | None = None  # _taking.set()'s token while the JSON is offered

    def chunk(self, chunk: Any) -> None:
        if self.accumulator is not None:
            self.accumulator.add(chunk)
        text = stream_text(self.kind, chunk)
        if text:
            self.texts.append(text)
        if self.gen_ai is not None:
            if self.streamed is None:
                self.streamed = gen_ai.StreamedResponse(self.kind)
            self.streamed.add(chunk)

    def done(self, parsed: Any, completed: bool) -> None:
        if self.ended:
            return
        self.ended = True
        attributes: dict[str, Any] = {}
        try:
            if parsed is not None:
                attributes = response_attributes(
                    self.kind, self.data if self.data is not None else parsed, self.hide_outputs
                )
                if self.base_url:
                    attributes.update(self.taken if self.taken is not None else token_attributes(self.kind, parsed))
                if self.gen_ai is not None:
                    response = self.data if self.data is not None else parsed
                    attributes.update(gen_ai.response_attributes(self.kind, response, self.gen_ai, self.hide_outputs))
            else:  # a stream: what it delivered (token ids only when it ran to its end)
                attributes = output_attributes(self.kind, "".join(self.texts), self.hide_outputs)
                if self.accumulator is not None and completed:
                    attributes.update(self.accumulator.attributes())
                    attributes.update(self.accumulator.token_counts())  # streams carry no usage unless asked
                if self.streamed is not None and self.gen_ai is not None:  # streamed: set when gen_ai is
                    streamed = self.streamed.response()
                    attributes.update(gen_ai.response_attributes(self.kind, streamed, self.gen_ai, self.hide_outputs))
                    attributes.update(gen_ai.counted_usage(attributes))  # from the token ids, when no usage came
        finally:
            self.finish(attributes)  # with what could be recorded, whatever went wrong

    def finish(self, attributes: dict[str, Any]) -> None:
        """End the span with `attributes`; with token capture, once the server's reader thread has
        the version that served the call (ENDPOINTS.label: the caller does not wait for it)."""
        span = self.span
        if self.base_url is None:
            if attributes:
                span.set_attributes(attributes)
            span.end()
            return
        end_time = time_ns()

        def labelled(version: str | None) -> None:
            if version is not None:
                attributes[schema.POLICY_VERSION] = version
            span.set_attributes(attributes)
            span.end(end_time)

        ENDPOINTS.label(self.base_url, monotonic(), labelled)

    def __enter__(self) -> _LeanCall:
        """While the request runs: its span is the current one (and, once add_token_fields() asked
        for them, its response JSON is offered to take()); a failure ends it as an error."""
        self._token = context_api.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, kind, exc, traceback) -> None:
        if self._offered is not None:
            _taking.reset(self._offered)
        context_api.detach(self._token)
        if exc is not None:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        self.ended = True
        if self.gen_ai is not None:
            self.span.set_attributes(gen_ai.error_attributes(exc))
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.span.end()

    def add_token_fields(self, client: Any, request_options: Any, capture: str, stream: bool) -> None:
        """Ask vLLM for token ids and logprobs, on the SDK's request options themselves (made per
        call, and copied by the SDK before use; no other wrapper holds them). Until the call's
        context exits, its response JSON is offered to take() (not a stream's: its chunks are
        parsed as the caller reads them, after the request returned)."""
        fields = token_fields(client, request_options, self.kind, self.body, capture)
        if fields is not None:
            if not stream:
                self._offered = _taking.set(self)
            extra, body = request_options.extra_json or NO_FIELDS, self.body
            ids = extra["return_token_ids"] if "return_token_ids" in extra else body.get("return_token_ids")
            logprobs = extra["logprobs"] if "logprobs" in extra else body.get("logprobs")
            self.strip_ids, self.strip_logprobs = not ids, (not logprobs if self.kind == CHAT else logprobs is None)
            request_options.extra_json, self.base_url = fields

    def take(self, data: dict) -> None:
        """Read the token fields from the response JSON before the SDK builds its objects, and set
        those the caller did not ask for to null: it gets the response it would have had without us,
        and the SDK does not build an object per logprob that nobody reads."""
        if self.taken is not None:
            return
        self.taken, self.data = token_attributes(self.kind, data), data
        if self.strip_ids and "prompt_token_ids" in data:
            data["prompt_token_ids"] = None  # as vLLM answers a request that did not ask
        unasked = (("token_ids", "prompt_token_ids") if self.strip_ids else ()) + (
            ("logprobs",) if self.strip_logprobs else ()
        )
        choices = data.get("choices")
        for choice in choices if type(choices) is list else ():
            if type(choice) is dict:
                for key in unasked:
                    if key in choice:
                        choice[key] = None

    def take_body(self, content: bytes) -> Any:
        """take(), done by the compiled scanner on the raw body: the JSON with the unasked fields set
        to null, or None when the scanner is unsure (then the SDK parses the body and take() runs)."""
        cut = _vllm_tokens.cut(content, self.kind == CHAT, self.strip_ids, self.strip_logprobs)
        if cut is None:
            return None
        text, prompt, completion, logprobs, position = cut
        data = _JSON.decode(text)  # json.loads(text): the scanner checked the bytes as UTF-8 JSON already
        choice = data["choices"][position] if position >= 0 else None
        self.taken = (
            {} if choice is None else packed_attributes(prompt, completion, logprobs, choice.get("finish_reason"))
        )
        self.data = data
        return data

    def watch(self, response: Any) -> Any:
        self.accumulator = StreamAccumulator(self.kind) if self.base_url else None
        return watch(response, self.chunk, self.done)


_JSON = json.JSONDecoder()
_SPAN_NAMES = {CHAT: "ChatCompletion", COMPLETIONS: "Completion"}
_taking: ContextVar[_LeanCall | None] = ContextVar("lightning_otel_openai_taking", default=None)


def taking_wrapper(original):
    """BaseClient._process_response_data, which turns a response's JSON into SDK objects: a lean call
    in progress in this context reads (and trims) the JSON first."""

    def _process_response_data(self, *, data, cast_to, response):
        call = _taking.get()
        if call is not None and type(data) is dict:
            safely(call.take, data)
        return original(self, data=data, cast_to=cast_to, response=response)

    _process_response_data.__wrapped__ = original
    return _process_response_data


def json_wrapper(original):
    """httpx's Response.json, which the SDK calls on a response body: a lean call in progress in this
    context gets the compiled scanner's cut (when it is sure of the body) instead."""

    def json(self, **kwargs):
        call = _taking.get()
        if call is not None and call.taken is None and not kwargs:
            try:
                data = call.take_body(self.content)
            except Exception:
                log.exception("lightning_otel: could not read token fields from a response body")
                data = None
            if data is not None:
                return data
        return original(self, **kwargs)

    json.__wrapped__ = original
    return json


def _lean_call(client: Any, args: tuple, tracer: trace.Tracer, options: Options) -> _LeanCall | None:
    """A lean span for a chat or text completion request, None for anything else (or when
    instrumentation is suppressed)."""
    if len(args) < 2 or not is_instrumentation_enabled():
        return None
    if not hasattr(args[1], "json_data"):  # openai's FinalRequestOptions, laid out differently
        sdk_fallbacks.missing("openai FinalRequestOptions.url/json_data", "calls get OpenInference's span")
        return None
    kind = endpoint_kind(str(getattr(args[1], "url", "")))
    body = getattr(args[1], "json_data", None)
    if kind is None or not isinstance(body, dict):
        return None
    try:
        return _LeanCall(tracer, kind, body, options, client)
    except Exception:
        log.exception("lightning_otel: could not start a lean span; using OpenInference's")
        return None


def lean_sync_wrapper(original, other, tracer: trace.Tracer, options: Options):
    def request(self, *args, **kwargs):
        call = _lean_call(self, args, tracer, options)
        if call is None:
            return other(self, *args, **kwargs)  # other endpoints: OpenInference's span
        with call:
            call.add_token_fields(self, args[1], options.capture_tokens, kwargs.get("stream", False))
            response = original(self, *args, **kwargs)
        return call.watch(response)

    return functools.update_wrapper(request, original, assigned=(), updated=())  # __wrapped__ only


def lean_async_wrapper(original, other, tracer: trace.Tracer, options: Options):
    async def request(self, *args, **kwargs):
        call = _lean_call(self, args, tracer, options)
        if call is None:
            return await other(self, *args, **kwargs)
        await probe_off_loop(self, options.capture_tokens)  # a server's first call: not on the loop
        with call:
            call.add_token_fields(self, args[1], options.capture_tokens, kwargs.get("stream", False))
            response = await original(self, *args, **kwargs)
        return call.watch(response)

    return functools.update_wrapper(request, original, assigned=(), updated=())  # __wrapped__ only
