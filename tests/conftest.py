"""Shared fixtures. Servers run on 127.0.0.1 with free ports and are always stopped.

- `tiny_model_dir`: the offline tiny model, built once per session.
- `vllm_server`: one real vLLM(-cpu) server for the whole session (~30 s, ~3 GB to start).
- `session_collector` + `instrumented`: a real collector process, and this test process's
  `lightning_otel.instrument()` exporting to it (instrument() is once per process by design).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_otel.servers import CollectorProcess, VLLMServer

# No internet here: LiteLLM would try to fetch its price list at import, with retries and sleeps.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from lightning_otel.trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(tiny_model_dir, log_path=log, lora_rank=8)  # LoRA on: the swap tests load adapters
    try:
        server.start()
    except Exception:
        print(log.read_text()[-4000:] if log.exists() else "(no vLLM log)")
        raise
    yield server
    server.stop()


@pytest.fixture(scope="session")
def session_collector(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("session-traces")
    with CollectorProcess(data_dir, flush_interval_s=0.2, log_path=data_dir.parent / "collector.log") as collector:
        yield collector


@pytest.fixture(scope="session")
def instrumented(session_collector):
    import lightning_otel

    instrumentation = lightning_otel.instrument(endpoint=session_collector.traces_endpoint, service_name="tests")
    yield instrumentation
    instrumentation.flush()  # before the collector stops, so nothing is left to export at exit
