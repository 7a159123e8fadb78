"""Gateway settings: each field is also a flag of `lightning-otel gateway` and an environment variable
(core.flags). Standard library only: `--help` works without aiohttp."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_otel.core.flags import setting
from lightning_otel.core.gen_ai import GEN_AI_HELP
from lightning_otel.core.otlp import ENDPOINT_HELP

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass
class GatewayConfig:
    upstreams: list[str] = setting(
        help="a vLLM server (http://host:port); repeat for replicas (variable: comma-separated)",
        flag="--upstream",
        env="LIGHTNING_OTEL_UPSTREAM",
        repeat=True,
    )
    host: str = setting("127.0.0.1", "interface to bind")
    port: int = setting(8080, "port")
    token: str | None = setting(None, "bearer token clients must send")
    upstream_api_key: str | None = setting(
        None, "sent to vLLM (started with --api-key)", env="LIGHTNING_OTEL_UPSTREAM_API_KEY"
    )
    timeout_s: float = setting(600.0, "seconds per upstream call", flag="--timeout")
    retries: int = setting(2, "extra attempts after the first, on connection errors and 5xx")
    hide_inputs: bool = setting(False, "redact request text in spans (token ids kept)")
    hide_outputs: bool = setting(False, "redact response text in spans (token ids kept)")
    admin_token: str | None = setting(
        None, "enables /admin/swap (weight swaps without dropped requests) behind this bearer token"
    )
    max_body_bytes: int = setting(DEFAULT_MAX_BODY_BYTES, "largest request body accepted; larger ones get 413")
    otlp_endpoint: str | None = setting(None, ENDPOINT_HELP)
    gen_ai_conventions: str = setting("auto", GEN_AI_HELP)
