"""The dashboard under test: its server as a process on a free loopback port, and what a test needs
to wait for a view and read it (shared by the dashboard's browser tests)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from lightning_otel.core.servers import free_port, wait_http_ok

RENDERED = """() => { const v = document.getElementById('view');
                      return v.dataset.ready === 'true' && v.dataset.hash === location.hash; }"""
TIMEOUT_MS = 120_000  # two shared cores: a view's queries can take a while
WEB_DIR = Path(__file__).resolve().parents[2] / "dashboards" / "lightning_otel" / "dashboards" / "web"


class Dashboard:
    def __init__(self, data_dir: Path, tokenizer: Path | None = None, query_token: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        command = [
            sys.executable,
            "-m",
            "lightning_otel",
            "dashboard",
            "--data-dir",
            str(data_dir),
            "--port",
            str(self.port),
        ]
        command += ["--tokenizer", str(tokenizer)] if tokenizer else []
        command += ["--query-token", query_token] if query_token else []
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def __enter__(self) -> Dashboard:
        try:
            wait_http_ok(self.url + "health", 60, self.process, "dashboard")
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def post(
        self, route: str, payload: dict, token: str | None = None, content_type: str = "application/json"
    ) -> tuple[int, dict]:
        headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
        request = urllib.request.Request(self.url + route, json.dumps(payload).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


def open_view(page, url: str) -> None:
    page.goto(url)
    page.wait_for_function(RENDERED)


def value_of(page, testid: str) -> str:
    return page.get_attribute(f"[data-testid={testid}]", "data-value")
