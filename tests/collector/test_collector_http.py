"""The OTLP/HTTP receiver at the wire: chunked bodies, keep-alive, `Expect: 100-continue`,
gzip/deflate inflated as they arrive under the size cap, and clients that stall or crawl.

Requests are written byte by byte on raw sockets (http.client where it does the same), so each
test controls exactly what the collector sees and when.
"""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time
import zlib

import pytest
from google.rpc import status_pb2
from helpers import local_collector
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect

pytestmark = pytest.mark.integration

READ_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 3.0
MAX_BODY = 256 * 1024


def _body(prefix: str, n: int = 3) -> bytes:
    return request_bytes(make_spans(lambda t: [t.start_span(f"{prefix}-{i}").end() for i in range(n)]))


def _count(collector, prefix: str) -> int:
    collector.flush()
    return (
        connect(collector.data_dir)
        .execute("SELECT count(*) FROM spans WHERE name LIKE ?", [prefix + "-%"])
        .fetchone()[0]
    )


@pytest.fixture
def collector(tmp_path):
    with local_collector(
        tmp_path / "data",
        max_body_bytes=MAX_BODY,
        http_read_timeout_s=READ_TIMEOUT_S,
        http_body_timeout_s=BODY_TIMEOUT_S,
    ) as running:
        yield running


def _connect(collector) -> socket.socket:
    host, port = collector.http.server_address
    return socket.create_connection((host, port), timeout=10)


def _headers(length: int | None = None, encoding: str | None = None, extra: str = "") -> bytes:
    lines = ["POST /v1/traces HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/x-protobuf"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if encoding:
        lines.append(f"Content-Encoding: {encoding}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


class _Reader:
    """Reads HTTP/1.1 responses (with Content-Length) off a raw socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed before a response: {self.buffer!r}"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            assert self._fill(), "connection closed inside a response body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def closed(self) -> bool:
        """True once the server has closed the connection (EOF or reset)."""
        try:
            return not self._fill()
        except ConnectionResetError:
            return True


def test_chunked_bodies_plain_and_gzip_in_odd_pieces_on_one_kept_alive_connection(collector):
    plain, zipped = _body("chunked-plain"), gzip.compress(_body("chunked-gzip"))
    with _connect(collector) as sock:
        reader = _Reader(sock)
        sock.sendall(_headers() + _chunked([plain[:1], plain[1:8], plain[8:]]))
        status, headers, reply = reader.response()
        assert status == 200 and headers["content-type"] == "application/x-protobuf"
        ExportTraceServiceResponse.FromString(reply)
        # The same connection, a gzip body cut into 5-byte chunks (the inflater sees partial headers).
        sock.sendall(_headers(encoding="gzip") + _chunked([zipped[i : i + 5] for i in range(0, len(zipped), 5)]))
        assert reader.response()[0] == 200
    assert _count(collector, "chunked-plain") == 3 and _count(collector, "chunked-gzip") == 3


def test_empty_bodies_are_answered_every_time(collector):
    # aiohttp hands every empty body the same reader; once read it keeps saying "chunk boundary".
    for _ in range(3):
        assert post(collector.http_endpoint + "/v1/traces", b"")[0] == 200  # an empty export
    assert post(collector.http_endpoint + "/v1/traces", _body("after-empty"))[0] == 200
    assert _count(collector, "after-empty") == 3


def test_keep_alive_serves_many_requests_on_one_connection(collector):
    host, port = collector.http.server_address
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.connect()
    first_socket = connection.sock
    for i in range(5):
        connection.request(
            "POST", "/v1/traces", body=_body(f"kept-{i}", 1), headers={"Content-Type": "application/x-protobuf"}
        )
        reply = connection.getresponse()
        reply.read()
        assert reply.status == 200 and reply.getheader("Connection", "").lower() != "close"
    assert connection.sock is first_socket  # never reconnected
    connection.close()
    assert _count(collector, "kept") == 5


def test_concurrent_exports_on_kept_alive_connections_land_whole(collector):
    """Bodies are read into reused buffers: each must stay its own until its log append is done."""
    host, port = collector.http.server_address
    sent, failures = {}, []

    def client(k: int) -> None:
        connection = http.client.HTTPConnection(host, port, timeout=30)
        for i in range(12):
            names = [f"conc-{k}-{i}-{j}" for j in range(40)]
            text = f"{k}-{i}-" * 600  # ~5 KB a span: bodies of ~200 KB, read in many pieces
            body = request_bytes(
                make_spans(lambda t: [t.start_span(n, attributes={"text": text}).end() for n in names])
            )
            connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
            reply = connection.getresponse()
            reply.read()
            if reply.status != 200:
                failures.append(reply.status)
            sent.update({name: text for name in names})
        connection.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    collector.flush()
    stored = (
        connect(collector.data_dir)
        .execute("SELECT name, attributes['text'] FROM spans WHERE name LIKE 'conc-%'")
        .fetchall()
    )
    assert len(stored) == len(sent) == 6 * 12 * 40 and dict(stored) == sent


def test_expect_100_continue(collector):
    body = _body("expect")
    with _connect(collector) as sock:
        reader = _Reader(sock)
        sock.sendall(_headers(len(body), extra="Expect: 100-continue\r\n"))
        sock.settimeout(5)
        assert reader.response()[0] == 100  # before any body byte was sent
        sock.sendall(body)
        assert reader.response()[0] == 200
    # Settled by the headers: the final answer comes at once, the body is never sent.
    with _connect(collector) as sock:
        reader = _Reader(sock)
        sock.sendall(_headers(MAX_BODY + 1, extra="Expect: 100-continue\r\n"))
        status, headers, reply = reader.response()
        assert status == 413 and headers["connection"].lower() == "close"
        assert "exceeds" in status_pb2.Status.FromString(reply).message
        assert reader.closed()
    assert _count(collector, "expect") == 3


def test_expect_100_continue_is_refused_without_the_token(tmp_path):
    with local_collector(tmp_path / "data", token="t") as collector, _connect(collector) as sock:
        sock.sendall(_headers(10, extra="Expect: 100-continue\r\n"))
        assert _Reader(sock).response()[0] == 401


def test_a_gzip_bomb_is_refused_before_the_client_has_sent_it_all(collector):
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))  # ~64 KB that inflate to 64 MiB; the cap is 256 KiB
    for framing in ("chunked", "length"):
        with _connect(collector) as sock:
            head = _headers(len(bomb) if framing == "length" else None, "gzip")
            first = bomb[: len(bomb) // 4]
            sock.sendall(head + (b"%x\r\n%s\r\n" % (len(first), first) if framing == "chunked" else first))
            sock.settimeout(5)
            status, _, reply = _Reader(sock).response()  # three quarters of the body still unsent
            assert status == 413, framing
            assert "decompressed body exceeds" in status_pb2.Status.FromString(reply).message
    assert post(collector.http_endpoint + "/v1/traces", _body("after-bomb"))[0] == 200


@pytest.mark.parametrize(
    "name,encode",
    [
        ("deflate-zlib", lambda data: zlib.compress(data)),
        ("deflate-raw", lambda data: (lambda c: c.compress(data) + c.flush())(zlib.compressobj(wbits=-15))),
        ("gzip-two-members", lambda data: gzip.compress(data[:10]) + gzip.compress(data[10:])),
    ],
)
def test_deflate_and_multi_member_gzip_are_accepted(collector, name, encode):
    encoding = "gzip" if name.startswith("gzip") else "deflate"
    status, _, _ = post(
        collector.http_endpoint + "/v1/traces", encode(_body(name)), headers={"Content-Encoding": encoding}
    )
    assert status == 200
    assert _count(collector, name) == 3


@pytest.mark.parametrize(
    "encoding,body,expected",
    [
        ("gzip", gzip.compress(b"\x0a\x00") + b"\x00\x00 trailing junk", 400),
        ("deflate", zlib.compress(b"\x0a\x00")[:-3], 400),  # truncated
        ("br", b"\x0a\x00", 415),
    ],
)
def test_bad_encodings_get_a_4xx(collector, encoding, body, expected):
    status, _, reply = post(collector.http_endpoint + "/v1/traces", body, headers={"Content-Encoding": encoding})
    assert status == expected and status_pb2.Status.FromString(reply).message
    assert post(collector.http_endpoint + "/v1/traces", _body("after-bad"))[0] == 200


def test_stalled_and_crawling_clients_are_cut_off_while_others_are_served(tmp_path):
    read_timeout_s, body_timeout_s = 2.0, 4.0  # room for five exports on a busy machine before the first cut
    # One export slot: a client still sending its body must not take it.
    with local_collector(
        tmp_path / "data", max_inflight=1, http_read_timeout_s=read_timeout_s, http_body_timeout_s=body_timeout_s
    ) as collector:
        body = _body("stalled")
        half_body, in_headers, crawler = _connect(collector), _connect(collector), _connect(collector)
        started = time.monotonic()
        half_body.sendall(_headers(len(body)) + body[: len(body) // 2])  # then nothing
        in_headers.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")  # then nothing
        crawler.sendall(_headers(len(body)))

        def crawl() -> None:  # one byte every 0.3 s: never silent for long, never done in time
            for i in range(len(body) // 2):
                try:
                    crawler.sendall(body[i : i + 1])
                except OSError:
                    return
                time.sleep(0.3)

        threading.Thread(target=crawl, daemon=True).start()
        exporter = OTLPSpanExporter(endpoint=collector.http_endpoint + "/v1/traces", timeout=5)
        served = [exporter.export(make_spans(lambda t: t.start_span(f"served-{i}").end())) for i in range(5)]
        assert served == [SpanExportResult.SUCCESS] * 5
        assert time.monotonic() - started < read_timeout_s  # all served while the others hung

        half_body.settimeout(read_timeout_s + 2)
        status, headers, reply = _Reader(half_body).response()
        assert status == 408 and headers["connection"].lower() == "close"
        assert "no body data for 2 s" in status_pb2.Status.FromString(reply).message
        assert time.monotonic() - started < read_timeout_s + 1

        in_headers.settimeout(read_timeout_s + 2)
        assert _Reader(in_headers).closed()  # dropped without a request
        assert time.monotonic() - started < read_timeout_s + 1.5

        crawler.settimeout(body_timeout_s + 2)
        status, _, reply = _Reader(crawler).response()
        assert status == 408 and "longer than 4 s" in status_pb2.Status.FromString(reply).message
        assert body_timeout_s - 0.5 < time.monotonic() - started < body_timeout_s + 1.5
        for sock in (half_body, in_headers, crawler):
            sock.close()
        assert _count(collector, "served") == 5 and _count(collector, "stalled") == 0


def test_client_errors_log_one_line_per_client_per_interval(caplog):
    from lightning_otel.collector.client_errors import ClientErrorLog

    errors = ClientErrorLog(interval_s=0.2)
    with caplog.at_level("WARNING", logger="lightning_otel.collector.clients"):
        logged = [errors.warn("10.0.0.1", f"bad body {i}") for i in range(10)] + [errors.warn("10.0.0.2", "bad")]
        time.sleep(0.25)
        logged.append(errors.warn("10.0.0.1", "bad again " + "x" * 10_000))
    assert logged == [True] + [False] * 9 + [True, True]
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3 and all(record.levelname == "WARNING" and not record.exc_info for record in caplog.records)
    assert "10.0.0.1" in lines[0] and "10.0.0.2" in lines[1]
    assert "and 9 more from it" in lines[2] and len(lines[2]) < 400  # the message is cut
