"""A TCP proxy that can drop connections or hold requests: stands in for a network fault or a slow
answer between the gateway and vLLM, which a real vLLM cannot be made to produce on demand. It also
counts HTTP requests."""

from __future__ import annotations

import asyncio
import threading


class FlakyProxy:
    def __init__(
        self, target_host: str, target_port: int, drop_first: int = 0, hold: threading.Event | None = None
    ) -> None:
        self.target = (target_host, target_port)
        self.drop_first = drop_first
        self.hold = hold  # POST requests reach the target only once this is set (GETs, e.g. /weight_info, pass)
        self.connections = 0
        self.requests = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.connections <= self.drop_first:
            await reader.read(1024)  # let the request start, then cut the connection
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(src, dst, count: bool):
            try:
                while data := await src.read(65536):
                    if count:
                        posts = data.count(b"POST /")
                        self.requests += posts
                        while posts and self.hold is not None and not self.hold.is_set():
                            await asyncio.sleep(0.01)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
