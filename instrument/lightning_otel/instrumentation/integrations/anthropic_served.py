"""One Anthropic `messages` call served from chat completions (anthropic_sdk.py): its LLM span, the
same one a lean OpenAI chat call gets (OpenInference's attributes of the chat request that ran, token
ids, logprobs, the weight version), and the byte streams that hand the SDK Anthropic's events made
from the chat stream as the caller reads it.

Imported only once the anthropic SDK is (anthropic_sdk.enable())."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from time import monotonic, time_ns
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from lightning_otel.core import gen_ai, schema
from lightning_otel.core.anthropic_stream import MessagesStream
from lightning_otel.core.vllm_endpoint import CHAT, ENDPOINTS, StreamAccumulator, token_attributes
from lightning_otel.instrumentation.direct_span import start_span
from lightning_otel.instrumentation.openinference_attributes import (
    output_attributes,
    request_attributes,
    response_attributes,
    stream_text,
)
from lightning_otel.instrumentation.options import Options

try:  # the HTTP client the anthropic SDK is built on: httpx2 in 2.x releases, httpx before
    import httpx2
except ImportError:  # pragma: no cover - an older SDK
    import httpx as httpx2  # type: ignore[no-redef]  # same API under the older name

log = logging.getLogger(__name__)


class ServedCall:
    """The span of one Messages call served as the chat request `chat` by the vLLM at `base_url`."""

    def __init__(self, tracer: trace.Tracer, chat: dict, options: Options, base_url: str, server: dict) -> None:
        self.hide_outputs, self.gen_ai, self.base_url = options.hide_outputs, options.gen_ai, base_url
        attributes, name = request_attributes(CHAT, chat, options.hide_inputs), "ChatCompletion"
        if self.gen_ai is not None:
            attributes.update(gen_ai.request_attributes(CHAT, chat, self.gen_ai, options.hide_inputs))
            attributes.update(server)
            name = gen_ai.span_name(CHAT, chat.get("model"))
        self.span = start_span(tracer, name, trace.SpanKind.CLIENT, attributes)
        self.accumulator = StreamAccumulator(CHAT)
        self.streamed = gen_ai.StreamedResponse(CHAT) if self.gen_ai is not None else None
        self.texts: list[str] = []
        self.ended = False

    def __enter__(self) -> ServedCall:
        self._token = context_api.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, kind, exc, traceback) -> None:
        context_api.detach(self._token)
        if exc is not None:
            self.fail(exc)

    def chunk(self, chunk: dict) -> None:
        try:
            self.accumulator.add(chunk)
            text = stream_text(CHAT, chunk)
            if text:
                self.texts.append(text)
            if self.streamed is not None:
                self.streamed.add(chunk)
        except Exception:
            log.exception("lightning_otel: could not record a chunk of an Anthropic messages stream")

    def done(self, data: dict | None, completed: bool) -> None:
        """End the span: with the chat response `data`, or (None) with what the stream delivered
        (token ids only when it ran to its end)."""
        if self.ended:
            return
        self.ended = True
        attributes: dict[str, Any] = {}
        try:
            if data is not None:
                attributes = response_attributes(CHAT, data, self.hide_outputs)
                attributes.update(token_attributes(CHAT, data))
                if self.gen_ai is not None:
                    attributes.update(gen_ai.response_attributes(CHAT, data, self.gen_ai, self.hide_outputs))
            else:
                attributes = output_attributes(CHAT, "".join(self.texts), self.hide_outputs)
                if completed:
                    attributes.update(self.accumulator.attributes())
                    attributes.update(self.accumulator.token_counts())
                if self.streamed is not None and self.gen_ai is not None:  # set together
                    streamed = self.streamed.response()
                    attributes.update(gen_ai.response_attributes(CHAT, streamed, self.gen_ai, self.hide_outputs))
                    attributes.update(gen_ai.counted_usage(attributes))
        except Exception:
            log.exception("lightning_otel: could not record an Anthropic messages call")
        span, end_time = self.span, time_ns()

        def labelled(version: str | None) -> None:  # the version that served it, read after it ended
            if version is not None:
                attributes[schema.POLICY_VERSION] = version
            span.set_attributes(attributes)
            span.end(end_time)

        ENDPOINTS.label(self.base_url, monotonic(), labelled)

    def fail(self, exc: BaseException) -> None:
        if self.ended:
            return
        self.ended = True
        if self.gen_ai is not None:
            self.span.set_attributes(gen_ai.error_attributes(exc))
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.span.end()


def translated_response(upstream: httpx2.Response, request: dict, call: ServedCall) -> httpx2.Response:
    """A response whose body is Anthropic's events for the chat stream `upstream`, made as it is read."""
    stream = MessagesStream(request, call.chunk)
    body = _AsyncEvents(upstream, stream, call) if _is_async(upstream) else _Events(upstream, stream, call)
    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=body, request=upstream.request)


def _is_async(response: httpx2.Response) -> bool:
    return isinstance(getattr(response, "stream", None), httpx2.AsyncByteStream)


class _Events(httpx2.SyncByteStream):
    def __init__(self, upstream: httpx2.Response, stream: MessagesStream, call: ServedCall) -> None:
        self.upstream, self.stream, self.call = upstream, stream, call

    def __iter__(self) -> Iterator[bytes]:
        completed = False
        try:
            for data in self.upstream.iter_bytes():
                out = self.stream.feed(data)
                if out:
                    yield out
            completed = True
            yield self.stream.end()
        except Exception as exc:
            self.call.fail(exc)
            raise
        finally:
            self.call.done(None, completed)

    def close(self) -> None:
        self.upstream.close()
        self.call.done(None, False)  # closed before its end (after it, done() did it already)


class _AsyncEvents(httpx2.AsyncByteStream):
    def __init__(self, upstream: httpx2.Response, stream: MessagesStream, call: ServedCall) -> None:
        self.upstream, self.stream, self.call = upstream, stream, call

    async def __aiter__(self) -> AsyncIterator[bytes]:
        completed = False
        try:
            async for data in self.upstream.aiter_bytes():
                out = self.stream.feed(data)
                if out:
                    yield out
            completed = True
            yield self.stream.end()
        except Exception as exc:
            self.call.fail(exc)
            raise
        finally:
            self.call.done(None, completed)

    async def aclose(self) -> None:
        await self.upstream.aclose()
        self.call.done(None, False)
