"""The collector process: OTLP receivers (HTTP, gRPC) + write-ahead log + Parquet pipeline."""

from __future__ import annotations

import logging
from pathlib import Path

from lightning_otel.collector.config import CollectorConfig
from lightning_otel.collector.ingest import Ingestor
from lightning_otel.collector.otlp_grpc import start_grpc_server
from lightning_otel.collector.otlp_http import OTLPHTTPServer
from lightning_otel.collector.pipeline import Pipeline
from lightning_otel.collector.quarantine import QUARANTINE_DIR, summary
from lightning_otel.collector.store import Store
from lightning_otel.collector.wal import WriteAheadLog

log = logging.getLogger(__name__)


class Collector:
    """Start with `start()` (or as a context manager); `stop()` drains the log into Parquet."""

    def __init__(self, config: CollectorConfig | None = None, **overrides) -> None:
        config = config or CollectorConfig()
        for key, value in overrides.items():
            setattr(config, key, value)
        self.config = config
        self.store = Store(config.data_dir)
        if config.wal_dir is None and not self.store.is_local:
            raise ValueError("with an object-store data dir, --wal-dir must name a local directory")
        self.store.ensure_schema_file()
        self.wal = WriteAheadLog(config.wal_dir or Path(self.store.root) / "wal")
        self.ingestor = Ingestor(self.wal, max_inflight=config.max_inflight, max_backlog_bytes=config.max_backlog_bytes)
        self.pipeline = Pipeline(
            self.store,
            self.wal,
            config.flush_interval_s,
            config.workers,
            config.compact_min_files,
            config.compact_interval_s,
            config.compact_grace_s,
            config.retention_hours,
            config.worker_nice,
        )
        self.http: OTLPHTTPServer | None = None
        self.grpc = None
        self.grpc_port = 0

    @property
    def data_dir(self) -> Path | str:
        return Path(self.store.root) if self.store.is_local else self.store.uri

    @property
    def http_endpoint(self) -> str:
        if self.http is None:
            raise RuntimeError("the collector is not started: no HTTP endpoint yet")
        host, port = self.http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Collector:
        config = self.config
        self.pipeline.start()
        if config.http_port:
            self.http = OTLPHTTPServer(config, self.ingestor, self.store.uri).start()
        if config.grpc_port:
            self.grpc, self.grpc_port = start_grpc_server(config.host, config.grpc_port, self.ingestor, config.token)
        return self

    def flush(self) -> None:
        """Make everything acknowledged so far queryable now."""
        self.pipeline.flush()

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
        if self.grpc is not None:
            self.grpc.stop(grace=5).wait()
        self.pipeline.stop()
        self.wal.close()

    def conversion_report(self) -> str:
        """After `stop()`: whether every acknowledged span is in Parquet, and if not, where the rest is."""
        pending = self.wal.segments()
        held = summary(self.wal.directory)
        if not pending and not held.records:
            return "all acknowledged spans are in Parquet"
        parts = []
        if held.records:
            parts.append(
                f"{held.records} acknowledged export(s) could not be converted and are quarantined in"
                f" {held.directory} (reasons: {self.store.root.rstrip('/')}/{QUARANTINE_DIR}/*.json)"
            )
        if pending:
            parts.append(
                f"{len(pending)} write-ahead log segment(s) in {self.wal.directory} are not in Parquet yet;"
                " the next start converts them"
            )
        return "; ".join(parts)

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
