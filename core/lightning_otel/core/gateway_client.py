"""The gateway's admin routes from the caller's side (the trainer, tests, benchmarks): a weight swap
the gateway coordinates so that no request fails and every response's version is exact. Standard
library only. The routes themselves: lightning_otel.gateway.admin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_otel.core.http_json import HttpError, get_json, post_json
from lightning_otel.core.vllm_admin import SwapError


class GatewayAdminClient:
    def __init__(self, url: str, token: str | None, timeout_s: float = 900.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s  # a full swap waits for requests in flight, then reloads every replica
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def swap_full(self, weights_dir: str | Path, version: str, rollback_dir: str | Path) -> dict[str, Any]:
        """Every replica, one at a time, to `weights_dir` (rolled back to `rollback_dir` if one fails to load)."""
        body = {
            "mode": "full",
            "weights_path": str(weights_dir),
            "version": version,
            "rollback_path": str(rollback_dir),
        }
        return self._request("POST", "/admin/swap", body)

    def swap_lora(self, adapter_dir: str | Path | None, version: str, model: str) -> dict[str, Any]:
        """Load the adapter as `<model>@<version>` on every replica and point `model` at it (None:
        point `model` back at the base weights, and unload the adapter it had)."""
        path = None if adapter_dir is None else str(adapter_dir)
        body = {"mode": "lora", "adapter_path": path, "version": version, "model": model}
        return self._request("POST", "/admin/swap", body)

    def state(self) -> dict[str, Any]:
        return self._request("GET", "/admin/state", None)

    def _request(self, method: str, path: str, body: dict | None) -> dict[str, Any]:
        url, timeout = self.url + path, self.timeout_s
        try:
            if method == "GET":
                return get_json(url, timeout=timeout, headers=self.headers)
            return post_json(url, body, timeout=timeout, headers=self.headers)
        except HttpError as exc:
            raise SwapError(f"gateway {exc}") from None
