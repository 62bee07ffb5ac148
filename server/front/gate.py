"""The gate: nothing reaches a partition while a coordinated command holds it.

Local commands are written to their partition's queue at once (in timestamp
order, so each partition executes in timestamp order). A coordinated command
needs several round trips, during which its partitions hold an open DuckDB
transaction; anything sent to them meanwhile would run inside it. So while
one runs, every later request waits here, in order, and is sent when it
ends. With one partition nothing is ever coordinated and the gate is free.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

Start = Callable[[], "asyncio.Future[Any]"]
StartCoordinated = Callable[[], Awaitable[Any]]


class Gate:
    def __init__(self) -> None:
        self._busy = False
        self._waiting: collections.deque[tuple[bool, Callable[[], Any], asyncio.Future]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def run(self, start: Start) -> asyncio.Future:
        """Sends now (`start` writes to partition queues synchronously) or after the coordinated command."""
        if not self._busy:
            return _started(start)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting.append((False, start, fut))
        return fut

    def run_coordinated(self, start: StartCoordinated) -> asyncio.Future:
        """Runs the coroutine alone: requests made after it wait until it ends."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        if not self._busy:
            self._launch(start, fut)
        else:
            self._waiting.append((True, start, fut))
        return fut

    def _launch(self, start: StartCoordinated, fut: asyncio.Future) -> None:
        self._busy = True
        task = asyncio.ensure_future(start())
        forward(task, fut)
        task.add_done_callback(self._release)

    def _release(self, _: asyncio.Future) -> None:
        self._busy = False
        while self._waiting and not self._busy:
            coordinated, start, fut = self._waiting.popleft()
            if coordinated:
                self._launch(start, fut)
            else:
                forward(_started(start), fut)


def _started(start: Start) -> asyncio.Future:
    try:
        return start()
    except Exception as e:  # a synchronous failure becomes the request's outcome
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        fut.set_exception(e)
        return fut


def forward(inner: asyncio.Future, outer: asyncio.Future) -> None:
    """Settles `outer` like `inner` when it settles."""

    def done(f: asyncio.Future) -> None:
        if outer.done():
            return
        if f.cancelled():
            outer.cancel()
        elif f.exception() is not None:
            outer.set_exception(f.exception())
        else:
            outer.set_result(f.result())

    inner.add_done_callback(done)
