"""Shared fixtures. Servers run on 127.0.0.1 with free ports and are always stopped.

- `tiny_model_dir`: the offline tiny model, built once per session.
- `vllm_server`: one real vLLM(-cpu) server for the whole session (~30 s, ~3 GB to start);
  `base_served`: the same server, put back on the base weights first.
- `demo_run`: one real digit-sum run (`tests/digit_sum_run.py`), small (SFT warm-up, 2 train/swap iterations), whose
  trace store the dashboard, Grafana and report tests read (~1.5 min, its own vLLM).
- `session_collector` + `instrumented`: a real collector process, and this test process's
  `lightning_otel.instrument()` exporting to it (instrument() is once per process by design).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from lightning_otel.core.servers import VLLMServer
from lightning_otel.testing.servers import CollectorProcess

# integration_marker marks every test that starts a server or process; long_context holds the
# coding-CLI tests' shared 32k-context vLLM (`long_context_vllm`, `cli_gateway`).
pytest_plugins = ["integration_marker", "long_context"]

# No internet here: LiteLLM would try to fetch its price list at import, with retries and sleeps.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from lightning_otel.testing.tiny_model import build_tiny_model

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


@pytest.fixture
def base_served(vllm_server, tiny_model_dir):
    """The session server back on the base weights (version "0"): earlier tests leave it on theirs, and
    an adapter or a probe over other base weights would be off by far more than any tolerance."""
    from lightning_otel.core.vllm_admin import VLLMAdmin, hot_swap

    hot_swap(VLLMAdmin(vllm_server.url), tiny_model_dir, "0", rollback_dir=tiny_model_dir)
    return vllm_server


@pytest.fixture(scope="session")
def session_collector(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("session-traces")
    # Compacted inputs stay for the whole session: a test's query that listed a file never finds it gone
    # (deletion after compaction has its own tests, on their own collectors).
    keep = ["--compact-grace-s", "86400"]
    with CollectorProcess(
        data_dir, flush_interval_s=0.2, log_path=data_dir.parent / "collector.log", extra_args=keep
    ) as collector:
        yield collector


@pytest.fixture(scope="session")
def instrumented(session_collector):
    import lightning_otel

    instrumentation = lightning_otel.instrument(endpoint=session_collector.traces_endpoint, service_name="tests")
    yield instrumentation
    instrumentation.flush()  # before the collector stops, so nothing is left to export at exit


@dataclass
class DemoRun:
    workdir: Path
    output: str  # what the demo printed
    returncode: int

    @property
    def data_dir(self) -> Path:
        return self.workdir / "traces"

    @property
    def model_dir(self) -> Path:
        return self.workdir / "sft"  # the warmed-up policy the demo served, with its tokenizer


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    workdir = tmp_path_factory.mktemp("demo")
    result = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parent / "digit_sum_run.py"),
            "--workdir",
            str(workdir),
            "--iterations",
            "2",
            "--tasks",
            "4",
            "--rollouts-per-task",
            "4",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    run = DemoRun(workdir, result.stdout, result.returncode)
    assert run.returncode == 0, run.output[-4000:]
    return run
