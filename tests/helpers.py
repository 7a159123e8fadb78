"""Small helpers shared by tests."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path


def wait_for(query_fn, predicate, timeout_s: float = 20.0, interval_s: float = 0.1):
    """Poll query_fn() until predicate(result) holds; return the last result (assert outside)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = query_fn()
        if predicate(result) or time.monotonic() > deadline:
            return result
        time.sleep(interval_s)


def local_collector(data_dir, **overrides):
    """An in-process collector on a free HTTP port, no gRPC, converting only when flushed."""
    from lightning_otel.collector import Collector
    from lightning_otel.core.servers import free_port

    settings = dict(data_dir=str(data_dir), http_port=free_port(), grpc_port=0, flush_interval_s=3600, workers=0)
    settings.update(overrides)
    return Collector(**settings)


def file_digests(*roots: Path) -> dict[str, str]:
    """Every file under `roots`, by path, with a digest of its bytes (what a read path must not change)."""
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for root in roots
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }
