"""Collector settings. No third-party imports: the CLI builds its flags from this without the extras."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BODY = 20 * 1024 * 1024  # decompressed bytes
DEFAULT_QUERY_TIMEOUT_S = 30.0
DEFAULT_QUERY_MAX_CONCURRENT = 2


@dataclass
class CollectorConfig:
    """Every field is also a CLI flag and an environment variable (see `lightning-otel collector --help`)."""

    data_dir: str = "./lightning-data"  # local directory or s3://bucket/prefix
    wal_dir: str | None = None  # default DATA_DIR/wal; must be local (fsync)
    host: str = "127.0.0.1"
    http_port: int = 4318  # 0 disables
    grpc_port: int = 4317  # 0 disables
    token: str | None = None  # bearer token required from exporters
    query_token: str | None = None  # enables POST /v1/query, bearer-protected
    flush_interval_s: float = 1.0
    workers: int = 2  # Parquet conversion processes (0: in the collector process)
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_backlog_bytes: int = 2 * 1024**3  # WAL bytes not yet in Parquet before 503s
    max_inflight: int = 64  # concurrent exports before 429s
    http_read_timeout_s: float = 20.0  # longest silence: before a request's headers are complete, or within a body
    http_body_timeout_s: float = 60.0  # longest time to receive one whole body
    query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S  # POST /v1/query statements are stopped after this
    query_max_concurrent: int = DEFAULT_QUERY_MAX_CONCURRENT  # POST /v1/query statements at once before 429s
    retention_hours: float | None = None
    compact_min_files: int = 8
    compact_interval_s: float = 30.0
    compact_grace_s: float = 600.0
