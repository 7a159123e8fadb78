"""The collector process: OTLP/HTTP receiver + write-ahead log + Parquet writer thread."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from lightning_otel.collector.otlp_http import DEFAULT_MAX_BODY, OTLPHTTPServer
from lightning_otel.collector.store import SegmentConverter, ensure_schema_file
from lightning_otel.collector.wal import WriteAheadLog

log = logging.getLogger(__name__)
DEFAULT_DATA_DIR = "./lightning-data"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 4318


class Collector:
    """Start with `start()` (or as a context manager); `stop()` drains the log into Parquet."""

    def __init__(
        self,
        data_dir: str | Path = DEFAULT_DATA_DIR,
        host: str = DEFAULT_HOST,
        http_port: int = DEFAULT_HTTP_PORT,
        flush_interval_s: float = 1.0,
        max_body_bytes: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ensure_schema_file(self.data_dir)
        self.wal = WriteAheadLog(self.data_dir / "wal")
        self.converter = SegmentConverter(self.data_dir, self.wal, flush_interval_s)
        self.http = OTLPHTTPServer(host, http_port, self.wal, max_body_bytes)
        self._thread = threading.Thread(target=self.http.serve_forever, name="lightning-otel-http", daemon=True)

    @property
    def http_endpoint(self) -> str:
        host, port = self.http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "Collector":
        self.converter.start()
        self._thread.start()
        log.info("collector: OTLP/HTTP on %s/v1/traces, data in %s", self.http_endpoint, self.data_dir)
        return self

    def flush(self) -> int:
        """Make everything acknowledged so far queryable now; returns spans written."""
        return self.converter.flush()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.converter.stop()
        self.wal.close()

    def __enter__(self) -> "Collector":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
