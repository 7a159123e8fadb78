"""Micro-benchmarks behind the per-item figures in BENCHMARKS.md: each compiled helper against the
path it replaces, in a tight loop (median of 7 repeats, microseconds of this process's CPU per item:
CPU time rather than wall time, so that other work on a shared machine does not count).

    python bench/micro.py

- collector decoder: OTLP request bytes -> Arrow record batch (decode + columns + Arrow), per span of
  payload (a) and (b) (lightning_otel.testing.payloads), compiled `_spans_codec` vs the pure-Python reference;
- Parquet encoding of payload (a)'s spans with the live files' options (snappy) vs the compacted
  files' (zstd level 1), collector/lightning_otel/collector/store.py;
- vLLM token scanner: `_vllm_tokens.cut` on the look-alike's 5.4 KB chat answer (512 prompt ids, 32
  completion ids and logprobs; bench/stub_vllm.py) vs `json.loads` of it (and of the 0.45 KB answer
  without token fields);
- OTLP span encoding of a lean LLM span (the attributes `instrument()` records for that answer, in a
  DirectSpan as it makes them): the exporter's own encoder (`encode_spans` + serialize) vs
  otlp_encoding.py in Python vs compiled;
- span start to end: the SDK's span vs `DirectSpan`, with one no-op span processor.

The pure-Python figures come from a second run of this script with LIGHTNING_OTEL_PURE_PYTHON=1.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def per_item_us(fn, items: int, number: int) -> float:
    """Median over 7 repeats of `number` calls of fn, in CPU microseconds per item (fn handles `items`)."""
    fn()  # warm caches and lazy imports
    runs = timeit.repeat(fn, number=number, repeat=7, timer=time.process_time)
    return statistics.median(runs) / number / items * 1e6


def lean_span_attributes() -> dict:
    from stub_vllm import response

    from lightning_otel.core.vllm_endpoint import CHAT, token_attributes
    from lightning_otel.instrumentation.openinference_attributes import request_attributes, response_attributes

    answer = json.loads(response(True, True))
    request = {
        "model": "policy",
        "messages": [{"role": "user", "content": "hello " * 500}],
        "max_tokens": 32,
        "logprobs": True,
    }
    return {
        **request_attributes(CHAT, request, False),
        **response_attributes(CHAT, answer, False),
        **token_attributes(CHAT, answer),
    }


def measure() -> dict[str, float]:
    """This process's figures (compiled helpers unless LIGHTNING_OTEL_PURE_PYTHON=1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind
    from stub_vllm import response

    from lightning_otel.collector.span_decoder import batch_from_body
    from lightning_otel.collector.store import LIVE_WRITE_OPTIONS, WRITE_OPTIONS
    from lightning_otel.instrumentation.direct_span import start_span
    from lightning_otel.instrumentation.otlp_encoding import encode_request
    from lightning_otel.testing.payloads import observability_request, training_request

    out: dict[str, float] = {}
    pure = os.environ.get("LIGHTNING_OTEL_PURE_PYTHON") == "1"  # only what the switch changes, then
    a, b = observability_request(), training_request()
    out["decode (a)"] = per_item_us(lambda: batch_from_body(a), 1000, 3)
    out["decode (b)"] = per_item_us(lambda: batch_from_body(b), 200, 5)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    attributes = lean_span_attributes()
    for _ in range(512):  # made as instrument() makes them: a DirectSpan's plain attribute dict
        start_span(tracer, "ChatCompletion", SpanKind.CLIENT, dict(attributes)).end()
    spans = memory.get_finished_spans()
    out["encode lean span, otlp_encoding"] = per_item_us(lambda: encode_request(spans), 512, 10)
    if pure:
        return out
    out["encode lean span, exporter's encoder"] = per_item_us(lambda: encode_spans(spans).SerializeToString(), 512, 3)

    table = pa.Table.from_batches([batch_from_body(a)])
    for label, options in (("parquet snappy (a)", LIVE_WRITE_OPTIONS), ("parquet zstd-1 (a)", WRITE_OPTIONS)):
        out[label] = per_item_us(
            lambda options=options: pq.write_table(table, pa.BufferOutputStream(), **options), 1000, 3
        )

    full, bare = response(True, True), response(False, False)
    out["json.loads 5.4 KB answer"] = per_item_us(lambda: json.loads(full), 1, 2000)
    out["json.loads 0.45 KB answer"] = per_item_us(lambda: json.loads(bare), 1, 20000)
    from lightning_otel.instrumentation.integrations import _vllm_tokens  # the compiled scanner measured here

    assert _vllm_tokens.cut(full, True, False, False) is not None
    out["token scanner 5.4 KB answer"] = per_item_us(lambda: _vllm_tokens.cut(full, True, False, False), 1, 20000)

    timing = TracerProvider()
    timing.add_span_processor(SpanProcessor())  # spans go nowhere: the span's own cost
    timed = timing.get_tracer("bench")
    small = {f"key.{i}": f"value {i}" for i in range(10)}
    out["span start to end, SDK"] = per_item_us(
        lambda: timed.start_span("s", kind=SpanKind.CLIENT, attributes=dict(small)).end(), 1, 5000
    )
    out["span start to end, DirectSpan"] = per_item_us(
        lambda: start_span(timed, "s", SpanKind.CLIENT, dict(small)).end(), 1, 5000
    )
    return out


def main() -> None:
    if "--this-process" in sys.argv:
        print(json.dumps(measure()))
        return

    def run(pure: bool) -> dict[str, float]:
        env = (
            {**os.environ, "LIGHTNING_OTEL_PURE_PYTHON": "1"}
            if pure
            else {k: v for k, v in os.environ.items() if k != "LIGHTNING_OTEL_PURE_PYTHON"}
        )
        out = subprocess.run(
            [sys.executable, __file__, "--this-process"], env=env, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    compiled, pure = run(False), run(True)
    print(f"{'CPU us per item (median of 7)':<40} {'compiled':>10} {'pure Python':>12}")
    for name in list(dict.fromkeys([*compiled, *pure])):
        cells = [f"{d[name]:.2f}" if name in d else "-" for d in (compiled, pure)]
        print(f"{name:<40} {cells[0]:>10} {cells[1]:>12}")


if __name__ == "__main__":
    main()
