"""Collector settings: each field is also a flag of `lightning-otel collector` and a LIGHTNING_OTEL_<FIELD>
variable (core.flags). No third-party imports: `--help` works without the collector's extras."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_otel.core.flags import setting

DEFAULT_MAX_BODY = 20 * 1024 * 1024  # decompressed bytes
DEFAULT_QUERY_TIMEOUT_S = 30.0
DEFAULT_QUERY_MAX_CONCURRENT = 2


@dataclass
class CollectorConfig:
    data_dir: str = setting("./lightning-data", "trace store: a directory or s3://bucket/prefix")
    wal_dir: str | None = setting(None, "write-ahead log directory (local; default DATA_DIR/wal)")
    host: str = setting("127.0.0.1", "interface to bind (default loopback only)")
    http_port: int = setting(4318, "OTLP/HTTP port (0 disables)")
    grpc_port: int = setting(4317, "OTLP/gRPC port (0 disables)")
    token: str | None = setting(None, "bearer token exporters must send (prefer the environment variable)")
    query_token: str | None = setting(None, "enables POST /v1/query (read-only SQL) behind this bearer token")
    flush_interval_s: float = setting(1.0, "seconds between WAL -> Parquet rounds")
    workers: int = setting(2, "Parquet conversion processes (0: inside the collector process)")
    worker_nice: int = setting(
        10,
        "niceness added to the Parquet conversion processes, so that when CPU is short exports are"
        " acknowledged first and conversion catches up after (0: same priority)",
    )
    max_body_bytes: int = setting(DEFAULT_MAX_BODY, "largest accepted request body, after decompression (413 above)")
    max_backlog_bytes: int = setting(2 * 1024**3, "WAL bytes not yet in Parquet before exporters get 503 + Retry-After")
    max_inflight: int = setting(64, "concurrent exports before exporters get 429 + Retry-After")
    http_read_timeout_s: float = setting(
        20.0,
        "OTLP/HTTP: seconds a client may stay silent (sending headers, within a body, idle between requests)"
        " before it gets 408 or the connection closes",
    )
    http_body_timeout_s: float = setting(
        60.0, "OTLP/HTTP: seconds a client may take to send one whole body (408 above)"
    )
    query_timeout_s: float = setting(
        DEFAULT_QUERY_TIMEOUT_S, "POST /v1/query: seconds a statement may run before it is stopped (504)"
    )
    query_max_concurrent: int = setting(
        DEFAULT_QUERY_MAX_CONCURRENT, "POST /v1/query: statements running at once before 429 + Retry-After"
    )
    retention_hours: float | None = setting(None, "delete hour partitions older than this (default: keep everything)")
    compact_min_files: int = setting(8, "compact a live partition once it holds this many small files")
    compact_interval_s: float = setting(30.0, "seconds between compaction and retention rounds")
    compact_grace_s: float = setting(600.0, "seconds compacted inputs stay on disk for readers that listed them")
