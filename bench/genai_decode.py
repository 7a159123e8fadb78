"""Decode cost of GenAI-convention spans: payload (a) as built, and the same spans with their
OpenInference attributes replaced by OpenTelemetry's GenAI ones (what openai-v2 writes), through the
C decoder and the pure-Python reference. Median of 7 rounds of 5 decodes, microseconds per span.

    python bench/genai_decode.py
"""

from __future__ import annotations

import statistics
import sys
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from lightning_otel.collector import span_decoder, span_rows
from lightning_otel.core import schema
from lightning_otel.testing import payloads


def as_gen_ai(body: bytes) -> bytes:
    request = ExportTraceServiceRequest.FromString(body)
    strings = {
        schema.GEN_AI_OPERATION_NAME: schema.GEN_AI_OP_CHAT,
        schema.GEN_AI_PROVIDER_NAME: "openai",
        schema.GEN_AI_REQUEST_MODEL: "policy",
        schema.GEN_AI_RESPONSE_MODEL: "policy",
    }
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                kept = [kv for kv in span.attributes if not kv.key.startswith(("llm.", "openinference."))]
                del span.attributes[:]
                span.attributes.extend(kept)
                for key, value in strings.items():
                    kv = span.attributes.add()
                    kv.key, kv.value.string_value = key, value
                for key, value in ((schema.GEN_AI_USAGE_INPUT_TOKENS, 512), (schema.GEN_AI_USAGE_OUTPUT_TOKENS, 64)):
                    kv = span.attributes.add()
                    kv.key, kv.value.int_value = key, value
                kv = span.attributes.add()
                kv.key = schema.GEN_AI_RESPONSE_FINISH_REASONS
                kv.value.array_value.values.add().string_value = "stop"
    return request.SerializeToString()


def per_span_us(decode, body: bytes, spans: int) -> float:
    decode(body)
    rounds = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(5):
            decode(body)
        rounds.append((time.perf_counter() - start) / 5 / spans * 1e6)
    return statistics.median(rounds)


def main() -> None:
    if not span_decoder.available():
        sys.exit("the C decoder is not built")
    plain = payloads.observability_request(0)
    spans = span_rows.count_spans(span_rows.decode_request(plain))
    paths = {
        "C": span_decoder.batch_from_body,
        "Python": lambda body: span_rows.to_batch([span_rows.decode_request(body)]),
    }
    for label, body in (("payload a (OpenInference)", plain), ("payload a as GenAI spans", as_gen_ai(plain))):
        for path, decode in paths.items():
            print(f"{label:28s} {path:6s} {per_span_us(decode, body, spans):6.2f} µs/span ({spans} spans/request)")


if __name__ == "__main__":
    main()
