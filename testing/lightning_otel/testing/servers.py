"""The collector and the gateway as child processes, started and always stopped, for tests,
benchmarks and examples: each runs the `lightning-otel` command on 127.0.0.1 (a free port unless
given) and `start()` returns once its /health answers 200.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lightning_otel.core.servers import ManagedProcess


class CollectorProcess(ManagedProcess):
    """`lightning-otel collector` as a child process (OTLP/HTTP on `port`)."""

    what = "collector"

    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        flush_interval_s: float = 0.5,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 60.0,
        extra_args: list[str] | None = None,
    ) -> None:
        super().__init__(host, port, log_path, startup_timeout_s)
        self.data_dir = Path(data_dir)
        self.flush_interval_s = flush_interval_s
        self.extra_args = extra_args or []

    @property
    def traces_endpoint(self) -> str:
        return self.url + "/v1/traces"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "lightning_otel",
            "collector",
            "--data-dir",
            str(self.data_dir),
            "--host",
            self.host,
            "--http-port",
            str(self.port),
            "--grpc-port",
            "0",
            "--flush-interval-s",
            str(self.flush_interval_s),
            *self.extra_args,
        ]


class GatewayProcess(ManagedProcess):
    """`lightning-otel gateway` as a child process; spans go to `traces_endpoint`."""

    what = "gateway"

    def __init__(
        self,
        upstreams: list[str],
        traces_endpoint: str,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | Path | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        super().__init__(host, port, log_path, startup_timeout_s=60.0)
        self.upstreams = upstreams
        self.traces_endpoint = traces_endpoint
        self.extra_args = extra_args or []

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def command(self) -> list[str]:
        upstreams = [arg for url in self.upstreams for arg in ("--upstream", url)]
        return [
            sys.executable,
            "-m",
            "lightning_otel",
            "gateway",
            *upstreams,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.traces_endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
