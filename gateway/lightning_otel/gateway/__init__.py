"""The recording gateway: an OpenAI-compatible proxy in front of vLLM (`lightning-otel gateway`).

`GatewayConfig` loads without aiohttp; `Gateway` and `serve` need the gateway's extras."""

from lightning_otel.gateway.config import GatewayConfig

__all__ = ["GatewayConfig"]
