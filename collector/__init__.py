"""Collector: OTLP receiver, durable Parquet trace store, DuckDB views (`connect`)."""

from lightning_otel.collector.query import connect
from lightning_otel.collector.service import Collector

__all__ = ["Collector", "connect"]
