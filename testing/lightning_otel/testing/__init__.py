"""The development harness (`lightning-otel-testing`): what tests, benchmarks, examples and docs
scripts use to exercise the product; no product part imports it (tests/test_layers.py).

- `servers`: the collector and the gateway as child processes (`CollectorProcess`, `GatewayProcess`).
- `tiny_model`: a tiny chat model built offline (`build_tiny_model`).
- `payloads`: OTLP export requests the collector benchmarks send and some tests decode.
- `digit_sum`, `digit_sum_agent`: a task with a checkable reward, its in-process RL loop and an
  instrumented OpenAI-SDK agent.
"""
