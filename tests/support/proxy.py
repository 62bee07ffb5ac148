"""A TCP forwarder between a client and a server whose connections a test can cut."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Proxy:
    """A TCP forwarder whose connections can be cut, to break a live PushStream."""

    def __init__(self, upstream: str) -> None:
        self.host, port = upstream.rsplit(":", 1)
        self.upstream_port = int(port)
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.target = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        self._writers |= {writer, up_writer}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(1 << 16):
                    w.write(data)
                    await w.drain()
            w.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        """Breaks every connection; returns once their sockets are closed (an abort closes on the loop's next turn)."""

        async def abort_all() -> None:
            for w in self._writers:
                w.transport.abort()
            self._writers.clear()
            await asyncio.sleep(0.05)

        asyncio.run_coroutine_threadsafe(abort_all(), self.loop).result(5)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
