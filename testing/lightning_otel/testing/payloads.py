"""OTLP request bodies for the collector benchmarks, built with the real protobuf classes.

(a) observability spans: ~20 attributes per LLM span, ~4 KB of prompt text, 1,000 spans per request.
(b) training spans: (a) plus 4,096 prompt token ids, 512 completion token ids and 512 logprobs,
    200 spans per request, encoded as `instrument()` encodes them by default (packed bytes), or
    as plain OTLP int/double arrays (`plain_arrays=True`, what other instrumentation would send).
"""

from __future__ import annotations

import json
import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from lightning_otel.core import schema
from lightning_otel.core.token_encoding import pack_floats, pack_ints

WORDS = [
    "the",
    "agent",
    "calls",
    "a",
    "tool",
    "then",
    "reads",
    "the",
    "result",
    "and",
    "answers",
    "the",
    "user",
    "with",
    "a",
    "short",
    "summary",
]


def _text(rng: random.Random, chars: int) -> str:
    out, size = [], 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def _kv(key: str, value) -> KeyValue:
    if isinstance(value, bytes):
        return KeyValue(key=key, value=AnyValue(bytes_value=value))
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _array_kv(key: str, values: list) -> KeyValue:
    if values and isinstance(values[0], float):
        items = [AnyValue(double_value=v) for v in values]
    else:
        items = [AnyValue(int_value=v) for v in values]
    return KeyValue(key=key, value=AnyValue(array_value=ArrayValue(values=items)))


def llm_attributes(rng: random.Random, index: int, training: bool, plain_arrays: bool = False) -> list[KeyValue]:
    prompt = _text(rng, 4000)
    answer = _text(rng, 300)
    attributes = [
        _kv(schema.OPENINFERENCE_SPAN_KIND, schema.KIND_LLM),
        _kv(schema.LLM_MODEL_NAME, "policy"),
        _kv(schema.LLM_PROVIDER, "vllm"),
        _kv(schema.LLM_SYSTEM, "openai"),
        _kv(schema.LLM_INVOCATION_PARAMETERS, json.dumps({"temperature": 1.0, "max_tokens": 512})),
        _kv(schema.LLM_TOKEN_COUNT_PROMPT, 4096),
        _kv(schema.LLM_TOKEN_COUNT_COMPLETION, 512),
        _kv(schema.LLM_TOKEN_COUNT_TOTAL, 4608),
        _kv(schema.INPUT_VALUE, prompt),
        _kv(schema.INPUT_MIME_TYPE, "text/plain"),
        _kv(schema.OUTPUT_VALUE, answer),
        _kv(schema.OUTPUT_MIME_TYPE, "text/plain"),
        _kv("llm.input_messages.0.message.role", "system"),
        _kv("llm.input_messages.0.message.content", "You are a coding agent."),
        _kv("llm.input_messages.1.message.role", "user"),
        _kv("llm.output_messages.0.message.role", "assistant"),
        _kv(schema.ROLLOUT_ID, f"rollout-{index // 8}"),
        _kv(schema.TASK_ID, f"task-{index // 32}"),
        _kv(schema.ATTEMPT, 0),
        _kv(schema.POLICY_VERSION, "3"),
    ]
    if training:
        prompt_ids = [rng.randrange(150_000) for _ in range(4096)]
        completion_ids = [rng.randrange(150_000) for _ in range(512)]
        logprobs = [-rng.random() * 5 for _ in range(512)]
        if plain_arrays:
            attributes += [
                _array_kv(schema.PROMPT_TOKEN_IDS, prompt_ids),
                _array_kv(schema.COMPLETION_TOKEN_IDS, completion_ids),
                _array_kv(schema.COMPLETION_LOGPROBS, logprobs),
            ]
        else:
            attributes += [
                _kv(schema.PACKED_PROMPT_TOKEN_IDS, pack_ints(prompt_ids)),
                _kv(schema.PACKED_COMPLETION_TOKEN_IDS, pack_ints(completion_ids)),
                _kv(schema.PACKED_COMPLETION_LOGPROBS, pack_floats(logprobs)),
            ]
    return attributes


def build_request(
    spans: int, training: bool, seed: int = 0, service: str = "bench-agent", plain_arrays: bool = False
) -> bytes:
    rng = random.Random(seed)
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.append(_kv(schema.SERVICE_NAME, service))
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "openinference.instrumentation.openai"
    start = 1_790_000_000_000_000_000 + seed * 1_000_000_000
    for index in range(spans):
        span = scope.spans.add()
        span.trace_id = rng.randbytes(16)
        span.span_id = rng.randbytes(8)
        span.parent_span_id = rng.randbytes(8)
        span.name = "ChatCompletion"
        span.kind = 3
        span.start_time_unix_nano = start + index * 1_000_000
        span.end_time_unix_nano = start + index * 1_000_000 + 250_000_000
        span.status.code = 1
        span.attributes.extend(llm_attributes(rng, index, training, plain_arrays))
    return request.SerializeToString()


def observability_request(seed: int = 0) -> bytes:
    """Payload (a): 1,000 spans."""
    return build_request(1000, training=False, seed=seed)


def training_request(seed: int = 0) -> bytes:
    """Payload (b): 200 spans with token ids and logprobs."""
    return build_request(200, training=True, seed=seed)
