"""`lightning-otel gateway`. Imports only the standard library and the settings at load time, so
`--help` works without the gateway's extras."""

from __future__ import annotations

import argparse

from lightning_otel.core.flags import add_flags, from_args
from lightning_otel.core.otlp import SPANS_DESTINATION
from lightning_otel.gateway.config import GatewayConfig


def add_parser(sub: argparse._SubParsersAction, data_dir: str = "") -> None:
    # data_dir: the signature every `lightning_otel.commands` entry point shares (cli.py); the gateway keeps no store
    p = sub.add_parser(
        "gateway",
        help="OpenAI-compatible proxy in front of vLLM that records every call",
        description=f"Sends one LLM span per call over OTLP/HTTP to {SPANS_DESTINATION}.",
    )
    add_flags(p, GatewayConfig, env_prefix="LIGHTNING_OTEL_GATEWAY_")
    p.set_defaults(func=_cmd_gateway)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from lightning_otel.gateway.server import serve

    serve(from_args(GatewayConfig, args))
    return 0
