"""Arize Phoenix as a comparison receiver for bench/collector_ingest.py (`--against phoenix`).

Phoenix runs from its own virtual environment (it pins versions of its own), e.g.

    python3.11 -m venv /work/phoenix-venv && /work/phoenix-venv/bin/pip install arize-phoenix==20.26.1

and is started as `python -m phoenix.server.main serve` with a fresh working directory (SQLite
there). It acknowledges `POST /v1/traces` once the body parses and stores the spans from a
background queue, so "stored" is counted from its database: rows in its `spans` table, read with
SQLite read-only.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

from lightning_otel.core.servers import ManagedProcess, free_port


class PhoenixProcess(ManagedProcess):
    what = "Phoenix"

    def __init__(self, python: str, working_dir: Path, log_path: Path, startup_timeout_s: float = 180.0) -> None:
        super().__init__("127.0.0.1", None, log_path, startup_timeout_s)
        self.python = python
        self.working_dir = Path(working_dir)
        self.working_dir.mkdir(parents=True, exist_ok=True)
        self.grpc_port = free_port()

    @property
    def health_url(self) -> str:
        return self.url + "/healthz"

    @property
    def traces_endpoint(self) -> str:
        return self.url + "/v1/traces"

    def command(self) -> list[str]:
        return [self.python, "-m", "phoenix.server.main", "serve"]

    def environment(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PHOENIX_", "PYTHON"))}
        return {
            **env,
            "PHOENIX_WORKING_DIR": str(self.working_dir),
            "PHOENIX_HOST": self.host,
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }

    def version(self) -> str:
        return subprocess.run(
            [self.python, "-c", "import phoenix; print(phoenix.__version__)"],
            capture_output=True,
            text=True,
            check=True,
            env=self.environment(),
        ).stdout.strip()

    def stored_spans(self) -> int:
        """Rows in Phoenix's spans table (0 before it exists)."""
        try:
            with sqlite3.connect(f"file:{self.working_dir / 'phoenix.db'}?mode=ro", uri=True, timeout=5) as conn:
                return conn.execute("SELECT count(*) FROM spans").fetchone()[0]
        except sqlite3.Error:
            return 0
