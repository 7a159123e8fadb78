"""One WARNING line per client per interval for requests the client got wrong (400s), never a
traceback: a client sending garbage must not be able to fill the collector's log. The line says
how many more that client sent since its last line."""

from __future__ import annotations

import logging
import threading
import time

from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger("lightning_otel.collector.clients")
INTERVAL_S = 60.0
MAX_CLIENTS = 4096  # remembered at once: past that the oldest are forgotten (they may log again)
MAX_MESSAGE_CHARS = 200


class ClientErrorLog:
    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[float, int]] = {}  # peer -> (last line at, errors since)

    def allow(self, peer: str | None) -> int | None:
        """Note an error from `peer`: the number of its errors not logged since its last line when
        this one may be logged (none in the interval), else None."""
        peer = peer or "unknown"
        now = time.monotonic()
        with self._lock:
            last, since = self._clients.get(peer, (float("-inf"), 0))
            if now - last < self.interval_s:
                self._clients[peer] = (last, since + 1)
                return None
            self._clients.pop(peer, None)
            self._clients[peer] = (now, 0)  # re-inserted: dict order is the forgetting order
            while len(self._clients) > MAX_CLIENTS:
                del self._clients[next(iter(self._clients))]
        return since

    def warn(self, peer: str | None, what: str) -> bool:
        """Log a client's error at WARNING unless that client had a line in the interval. True if logged."""
        since = self.allow(peer)
        if since is None:
            return False
        what = what if len(what) <= MAX_MESSAGE_CHARS else what[: MAX_MESSAGE_CHARS - 1] + "…"
        more = f" (and {since} more from it in the last {self.interval_s:.0f} s)" if since else ""
        log.warning("rejected a request from %s: %s%s", peer or "unknown", what, more)
        return True


def grpc_peer(peer: str | None) -> str | None:
    """gRPC's peer string (`ipv4:127.0.0.1:5555`, `ipv6:[::1]:5555`) without the port: one client,
    one entry, whatever port its next connection comes from."""
    if not peer:
        return None
    address = peer.split(":", 1)[1] if ":" in peer else peer
    return address.rsplit(":", 1)[0] if address.count(":") >= 1 and not address.endswith("]") else address


class _MalformedHttp(logging.Filter):
    """aiohttp's "Error handling request from <peer>" (an ERROR with a traceback) for a request it
    could not parse (duplicate Content-Length, a bad chunk, a line too long): the client's error, so
    one WARNING line per client per interval instead; anything else passes through as it was."""

    def __init__(self, errors: ClientErrorLog) -> None:
        super().__init__()
        self.errors = errors

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else None
        self.errors.warn(str(peer) if peer else None, f"malformed HTTP request: {type(error).__name__}: {error}")
        return False


def http_server_logger(errors: ClientErrorLog) -> logging.Logger:
    """The logger an aiohttp server of ours gets (its `logger=`): aiohttp.server's, with malformed
    requests logged through `errors`."""
    logger = logging.getLogger(f"aiohttp.server.lightning_otel.{id(errors):x}")  # one per server: its own `errors`
    if not logger.filters:
        logger.addFilter(_MalformedHttp(errors))
    return logger
