"""Collector: OTLP receivers, durable Parquet trace store, DuckDB views (`connect`).

Names load lazily, so `lightning_otel.collector.config` (and the CLI's --help) works without the
collector extra installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Collector", "CollectorConfig", "connect"]

if TYPE_CHECKING:
    from lightning_otel.collector.config import CollectorConfig
    from lightning_otel.collector.query import connect
    from lightning_otel.collector.service import Collector


def __getattr__(name: str) -> Any:
    if name == "connect":
        from lightning_otel.collector.query import connect

        return connect
    if name == "Collector":
        from lightning_otel.collector.service import Collector

        return Collector
    if name == "CollectorConfig":
        from lightning_otel.collector.config import CollectorConfig

        return CollectorConfig
    raise AttributeError(name)
