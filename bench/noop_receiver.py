"""What an OTLP/HTTP receiver in Python costs before it does anything: aiohttp (as the collector's
receiver, no access log) reading each request's body and answering 200 with an empty
ExportTraceServiceResponse, nothing decoded, written or acknowledged durably. `bench/collector_ingest.py
--against noop` sends it the same bodies from the same senders in the same run: the ceiling the
collector's requests/s can reach on this machine.

    python bench/noop_receiver.py PORT
"""

from __future__ import annotations

import sys

from aiohttp import web


async def export(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=b"", content_type="application/x-protobuf")


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", export)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
