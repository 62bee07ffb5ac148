"""Partition worker processes, as seen from the front: start, request, watch, stop.

Each worker is a real OS process (`python -m streamtx.server.partition.worker`)
connected by a Unix socket pair. Requests are written in the order they are
made (so in timestamp order) and answered in that order. If a worker dies, its
pending and future requests fail at once with UNAVAILABLE naming the partition
and its exit status: a client never hangs on a dead partition.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
from typing import Any

import pyarrow as pa

from streamtx.errors import Unavailable, error_for
from streamtx.server.config import ServerConfig
from streamtx.server.ipc import Frame, encode, pack, read_frame, unpack
from streamtx.server.launch import Spawned

Reply = tuple[dict[str, Any], list[pa.Table]]
HOME = 0
"""The home partition: single tables, windows of single procedures, and the DONE log live there."""


class Partition:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._outbox: list[Frame] = []
        self._reader_task: asyncio.Task | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    @property
    def alive(self) -> bool:
        return self.error is None and self.proc is not None and self.proc.poll() is None

    @property
    def queued(self) -> int:
        return len(self._pending)

    async def attach(self, spawned: Spawned) -> None:
        """Takes over a started worker (launch.py) and reads its replies from now on."""
        self.proc = spawned.proc
        reader, self._writer = await asyncio.open_unix_connection(sock=spawned.sock, limit=1 << 24)
        self._reader_task = asyncio.create_task(self._read_replies(reader), name=f"partition-{self.index}")

    def send(self, header: dict[str, Any], tables: list[pa.Table] | None = None) -> asyncio.Future[Reply]:
        """Queues a request now (call order = execution order); the future is its reply."""
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        if not self.alive or self._writer is None:
            fut.set_exception(Unavailable(self._dead_message()))
            return fut
        rid = next(self._ids)
        header = dict(header, id=rid)
        self._pending[rid] = fut
        if not self._outbox:  # one write (one syscall) for all frames sent in this loop iteration
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append((header, tables or []))
        return fut

    def _flush(self) -> None:
        frames, self._outbox = self._outbox, []
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(pack(frames))

    async def request(self, header: dict[str, Any], tables: list[pa.Table] | None = None) -> Reply:
        """Sends and awaits; a failed reply raises the mapped StreamTxError."""
        return checked(await self.send(header, tables))

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        while True:
            frame = await read_frame(reader)
            if frame is None:
                break
            for header, tables in unpack(frame):
                fut = self._pending.pop(header["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result((header, tables))
        await self._on_exit()

    async def _on_exit(self) -> None:
        code = None
        if self.proc is not None:
            for _ in range(50):
                code = self.proc.poll()
                if code is not None:
                    break
                await asyncio.sleep(0.01)
        if self.error is None:
            self.error = self._death(code)
            print(f"streamtx: {self.error}", file=sys.stderr, flush=True)
        err = Unavailable(self._dead_message())
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()

    def _dead_message(self) -> str:
        if self.error is None and self.proc is not None and self.proc.poll() is not None:
            return self._death(self.proc.poll())
        return self.error or f"partition {self.index} is not running"

    def _death(self, code: int | None) -> str:
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        return f"partition {self.index} (pid {self.pid}) died: {how}"

    async def stop(self, timeout: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.alive and self._writer is not None:
            self.error = f"partition {self.index} is shutting down"
            try:
                self._writer.write(encode({"op": "shutdown", "id": 0}))
                await self._writer.drain()
            except (ConnectionError, RuntimeError):
                pass
        if self._writer is not None:
            self._writer.close()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.proc.poll() is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self._reader_task is not None:
            self._reader_task.cancel()


class Partitions:
    """All partition workers of this server."""

    def __init__(self, config: ServerConfig) -> None:
        self.all = [Partition(i) for i in range(config.partitions)]

    async def attach(self, spawned: list[Spawned]) -> None:
        await asyncio.gather(*(p.attach(s) for p, s in zip(self.all, spawned, strict=True)))

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.all), return_exceptions=True)

    def __getitem__(self, i: int) -> Partition:
        return self.all[i]

    def __len__(self) -> int:
        return len(self.all)

    async def broadcast(self, header: dict[str, Any], tables: list[pa.Table] | None = None) -> list[Reply]:
        """Sends to every partition at once (same position in every queue), awaits all."""
        futs = [p.send(header, tables) for p in self.all]
        replies = await asyncio.gather(*futs, return_exceptions=True)
        for r in replies:
            if isinstance(r, BaseException):
                raise r
        return [checked(r) for r in replies]


def checked(reply: Reply) -> Reply:
    """The reply, or the StreamTxError it carries."""
    if not reply[0].get("ok"):
        raise error_for(reply[0]["code"], reply[0]["message"])
    return reply
