"""Partition worker processes, as seen from the front: start, request, watch, stop.

Each worker is a real OS process (`python -m streamtx.server.partition.worker`)
connected by a Unix socket pair. Requests are written in the order they are
made (so in timestamp order).

When a worker dies while the front supervises it (front/supervisor.py), the
requests it had not answered are held, not failed: once a new worker has
recovered, `replay` sends them again, in their order, marked `again`, so the
worker can tell one its predecessor applied (and made durable) from one it
must run. Steps of a multi-round command (`COMMAND_STEPS`) are not sent again:
they fail with `Restarted`, and the command's runner starts it over. Without
supervision (start-up, shutdown), requests fail at once with UNAVAILABLE
naming the partition and its exit status: a client never hangs on a dead
partition.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from streamtx.errors import Unavailable, error_for
from streamtx.server import log
from streamtx.server import protocol as pr
from streamtx.server.config import ServerConfig
from streamtx.server.ipc import Frame, encode, pack, read_frame, unpack
from streamtx.server.launch import Spawned, remove_partitions_from

Reply = tuple[Any, list[pa.Table]]
"""A reply body (server/protocol.py) or `pr.Failed`, and the relations that came with it."""


class Restarted(Unavailable):
    """The partitions were restarted under a multi-round command: run it again (or find it done)."""


@dataclass
class _Request:
    fut: asyncio.Future[Any]
    command: pr.Command
    tables: list[pa.Table]
    again: bool = False
    then: Callable[[Reply], Any] | None = None  # what the future resolves to: `then(reply)`, else the reply
    parts: list[asyncio.Future] | None = None  # a PushRun's batches: each gets `then` of its own reply
    left: int = 0  # parts not answered yet


class Partition:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Request] = {}
        self._held: dict[int, _Request] = {}  # unanswered by a worker that died, to replay
        self._writer: asyncio.StreamWriter | None = None
        self._outbox: list[Frame] = []
        self._reader_task: asyncio.Task | None = None
        self.hold_on_exit = False  # supervised: a death holds the unanswered requests
        self.on_death: Callable[[Partition], None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    @property
    def alive(self) -> bool:
        return self.error is None and self.proc is not None and self.proc.poll() is None

    @property
    def queued(self) -> int:
        return len(self._pending) + len(self._held)

    async def attach(self, spawned: Spawned) -> None:
        """Takes over a started worker (launch.py) and reads its replies from now on."""
        self.proc = spawned.proc
        self.error = None
        reader, self._writer = await asyncio.open_unix_connection(sock=spawned.sock, limit=1 << 24)
        self._reader_task = asyncio.create_task(self._read_replies(reader), name=f"partition-{self.index}")

    def send(
        self, command: pr.Command, tables: list[pa.Table] | None = None, then: Callable[[Reply], Any] | None = None
    ) -> asyncio.Future[Any]:
        """Queues a request now (call order = execution order); the future is its reply, or `then(reply)`.

        `then` runs as the reply is read (an exception it raises is the future's): one future per
        request, not a second one chained to it. A worker that died unseen still takes the request:
        its reader sees the end of the socket and holds or fails what is pending (`_on_exit`).
        """
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue(_Request(fut, command, tables or [], then=then))
        return fut

    def send_run(
        self, command: pr.PushRun, table: pa.Table, parts: list[asyncio.Future], then: Callable[[Reply], Any]
    ) -> asyncio.Future[None]:
        """Queues a run of batches as one request: `parts[i]` resolves to `then` of batch i's reply, as it
        comes; the returned future when every part has (it fails if the request does, leaving parts to
        the caller)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue(_Request(fut, command, [table], then=then, parts=parts, left=len(parts)))
        return fut

    def _queue(self, req: _Request) -> None:
        if self.error is not None or self.proc is None or self._writer is None:
            if self.hold_on_exit and not _recovering(req.command):  # sent to the next worker (or failed: `replay`)
                self._held[next(self._ids)] = req
            else:
                req.fut.set_exception(Unavailable(self._dead_message()))
            return
        self._write(next(self._ids), req)

    def _write(self, rid: int, req: _Request) -> None:
        self._pending[rid] = req
        if not self._outbox:  # one write (one syscall) for all frames sent in this loop iteration
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append((pr.Request(rid, req.command, req.again), req.tables))

    def replay(self) -> int:
        """Sends the requests a dead worker left unanswered to this (recovered) one, in their order.

        Returns how many were sent; command steps fail with `Restarted` instead.
        """
        held, self._held = self._held, {}
        sent = 0
        for rid in sorted(held):
            req = held[rid]
            if req.fut.done():
                continue
            if type(req.command) in pr.COMMAND_STEPS:
                req.fut.set_exception(Restarted(f"partition {self.index} was restarted during this command"))
                continue
            req.again = True
            self._write(rid, req)
            sent += 1
        return sent

    def hold(self) -> None:
        """Keeps the unanswered requests for `replay`; nothing queued is written to the dead worker.

        Requests of a recovery fail instead: the supervisor starts it over.
        """
        error = Unavailable(self._dead_message())
        for rid, req in self._pending.items():
            if _recovering(req.command):
                if not req.fut.done():
                    req.fut.set_exception(error)
            else:
                self._held[rid] = req
        self._pending.clear()
        self._outbox.clear()

    def fail_all(self, error: Exception) -> None:
        """Every request waiting on this partition, held or pending, fails with `error`."""
        for req in [*self._held.values(), *self._pending.values()]:
            if not req.fut.done():
                req.fut.set_exception(error)
        self._held.clear()
        self._pending.clear()
        self._outbox.clear()

    def _flush(self) -> None:
        frames, self._outbox = self._outbox, []
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(pack(frames))

    async def request(self, command: pr.Command, tables: list[pa.Table] | None = None) -> Reply:
        """Sends and awaits; a failed reply raises the mapped StreamTxError."""
        return checked(await self.send(command, tables))

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        while True:
            frame = await read_frame(reader)
            if frame is None:
                break
            for response, tables in unpack(frame):
                if isinstance(response.body, pr.RunReplies):
                    self._run_replies(response.id, response.body)
                    continue
                req = self._pending.pop(response.id, None)
                if req is None or req.fut.done():
                    continue
                reply = (_as_original(req, response.body), tables)
                if req.then is None:
                    req.fut.set_result(reply)
                    continue
                try:
                    req.fut.set_result(req.then(reply))
                except Exception as e:  # the reply's failure, whatever it is, is the caller's
                    req.fut.set_exception(e)
        await self._on_exit()

    def _run_replies(self, rid: int, replies: pr.RunReplies) -> None:
        req = self._pending.get(rid)
        if req is None or req.parts is None:
            return
        command = req.command
        assert isinstance(command, pr.PushRun) and req.then is not None
        for i, body in enumerate(replies.items, replies.first):
            part = req.parts[i]
            if part.done():  # answered by the worker before a restart, and again by this one
                continue
            if req.again and isinstance(body, pr.Outcome):
                body = body.first(command.first_ts + i)
            try:
                part.set_result(req.then((body, [])))
            except Exception as e:
                part.set_exception(e)
            req.left -= 1
        if req.left == 0:
            del self._pending[rid]
            if not req.fut.done():
                req.fut.set_result(None)

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
            log.event("partition_lost", self.error, level="error", pid=self.pid)  # the message names the partition
        if self.hold_on_exit:
            self.hold()
        else:  # what it held from a dead predecessor stays for the next one
            error = Unavailable(self._dead_message())
            for req in self._pending.values():
                if not req.fut.done():
                    req.fut.set_exception(error)
            self._pending.clear()
            self._outbox.clear()
        if self.on_death is not None:
            self.on_death(self)

    def _dead_message(self) -> str:
        if self.error is None and self.proc is not None and self.proc.poll() is not None:
            return self._death(self.proc.poll())
        return self.error or f"partition {self.index} is not running"

    def _death(self, code: int | None) -> str:
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        return f"partition {self.index} (pid {self.pid}) died: {how}"

    async def stop(self, timeout: float = 5.0) -> None:
        """Asks the worker to finish what it was sent and exit (log flushed, replies read); kills it after `timeout`."""
        if self.proc is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.alive and self._writer is not None:
            self._flush()
            self.error = f"partition {self.index} is shutting down"
            try:
                self._writer.write(encode(pr.Request(0, pr.Shutdown())))
                await self._writer.drain()
            except (ConnectionError, RuntimeError):
                pass
        if self._reader_task is not None:
            try:  # its last replies, then end of stream
                await asyncio.wait_for(asyncio.shield(self._reader_task), timeout)
            except TimeoutError:
                pass
        while self.proc.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self.hold_on_exit:
            self.hold()


def _recovering(command: pr.Command) -> bool:
    return type(command) in pr.RECOVERY or (isinstance(command, pr.Install) and command.startup)


def _as_original(req: _Request, body: Any) -> Any:
    """A replayed batch the dead worker had taken: the outcome it had then (`Outcome.first`).

    The front sends a batch id as new only once, so DUPLICATE on the second
    run means the first one was made durable before the restart (a
    rejection, or a local batch whose ack was lost with the worker).
    """
    if req.again and isinstance(req.command, pr.Push | pr.Reject) and isinstance(body, pr.Outcome):
        return body.first(req.command.ts)
    return body


class Partitions:
    """All partition workers of this server."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.all = [Partition(i) for i in range(config.partitions)]

    async def attach(self, spawned: list[Spawned]) -> None:
        """Takes over started workers, one per partition (more than there were: partitions added)."""
        self.all += [Partition(i) for i in range(len(self.all), len(spawned))]
        await asyncio.gather(*(p.attach(s) for p, s in zip(self.all, spawned, strict=True)))

    def add(self, added: list[Partition]) -> None:
        """Partitions started and recovered while the server runs (a grow): they take every request from now."""
        self.all += added

    async def retire(self, first: int) -> None:
        """Stops partitions `first` and after, forgets them and deletes their directories (none owns a bin:
        a shrink, or an added partition whose step did not finish); they leave the list before this awaits."""
        gone, self.all = self.all[first:], self.all[:first]
        for p in gone:
            p.hold_on_exit = False
            p.on_death = None
        await asyncio.gather(*(p.stop() for p in gone), return_exceptions=True)
        await asyncio.to_thread(remove_partitions_from, self.config, first)

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.all), return_exceptions=True)

    def __getitem__(self, i: int) -> Partition:
        return self.all[i]

    def __len__(self) -> int:
        return len(self.all)

    async def broadcast(self, command: pr.Command, tables: list[pa.Table] | None = None) -> list[Reply]:
        """Sends to every partition at once (same position in every queue), awaits all."""
        futs = [p.send(command, tables) for p in self.all]
        replies = await asyncio.gather(*futs, return_exceptions=True)
        for r in replies:
            if isinstance(r, BaseException):
                raise r
        return [checked(r) for r in replies]


def checked(reply: Reply) -> Reply:
    """The reply, or the StreamTxError it carries."""
    if isinstance(reply[0], pr.Failed):
        raise error_for(reply[0].code, reply[0].message)
    return reply
