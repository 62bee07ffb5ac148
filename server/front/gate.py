"""The gate: nothing reaches a partition while a coordinated command holds it.

Local commands are written to their partition's queue at once (in timestamp
order, so each partition executes in timestamp order). A coordinated command
needs several round trips, during which its partitions hold an open DuckDB
transaction; anything sent to them meanwhile would run inside it. So while
one runs, every later request waits here, in order, and is sent when it
ends. With one partition nothing is ever coordinated and the gate is free.

Requests that are state batches carry an item (front/spans.py). When the
next waiting request is a coordinated one with an item, it and the requests
with items right behind it, local or not, up to `span_limit`, run as one
span; the requests behind them keep waiting, in order. A span's runner may
take in the requests with items that came to the head of the line meanwhile
(`Span.more`), and answer requests before the span ends (`Span.answer`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Start = Callable[[], "asyncio.Future[Any]"]
StartCoordinated = Callable[[], Awaitable[Any]]
SpanRunner = Callable[["Span"], Awaitable[list[Any]]]
"""Runs items together; returns each one's result, or the exception it failed with, in order
(those it took in with `Span.more` included)."""


@dataclass
class _Waiting:
    coordinated: bool
    start: Callable[[], Any]
    fut: asyncio.Future
    item: Any = None


class Span(list):
    """The items of the requests a span runs, in order."""

    def __init__(self, gate: Gate, waiting: list[_Waiting]) -> None:
        super().__init__(w.item for w in waiting)
        self._gate = gate
        self.waiting = waiting
        self._futures = {id(w.item): w.fut for w in waiting}

    def more(self, limit: int, kind: type) -> list[Any]:
        """Takes in the requests now first in line whose items are `kind`, up to `limit`: they join the
        span, in order (a request without an item, or of another kind, stops it)."""
        line = self._gate._waiting
        taken: list[Any] = []
        while line and len(taken) < limit and isinstance(line[0].item, kind) and not self._gate._held:
            w = line.popleft()
            self.waiting.append(w)
            self._futures[id(w.item)] = w.fut
            taken.append(w.item)
        self.extend(taken)
        return taken

    def answer(self, item: Any, result: Any) -> None:
        """Answers the request of `item` now (a result, or the exception it failed with)."""
        fut = self._futures.pop(id(item), None)
        if fut is not None:
            _answer(fut, result)


class Gate:
    def __init__(self, span_runner: SpanRunner | None = None, span_limit: int = 1) -> None:
        self._busy = False
        self._held = False  # the partitions are being restarted (front/supervisor.py)
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self.span_runner = span_runner
        self.span_limit = span_limit

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def hold(self) -> None:
        """Requests made from now on wait (in order) until `resume`; a running coordinated command goes on."""
        self._held = True

    def resume(self) -> None:
        self._held = False
        if not self._busy:
            self._release(None)

    def run(self, start: Start, item: Any = None) -> asyncio.Future:
        """Sends now (`start` writes to partition queues synchronously) or after the coordinated command."""
        if not self._busy and not self._held:
            return _started(start)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(False, start, fut, item))
        return fut

    def run_coordinated(self, start: StartCoordinated, item: Any = None) -> asyncio.Future:
        """Runs the coroutine alone (or `item` in a span): requests made after it wait until it ends."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        waiting = _Waiting(True, start, fut, item)
        if not self._busy and not self._held:
            self._launch(waiting)
        else:
            self._waiting.append(waiting)
        return fut

    def _launch(self, first: _Waiting) -> None:
        self._busy = True
        if first.item is None or self.span_runner is None:
            task = asyncio.ensure_future(first.start())
            forward(task, first.fut)
        else:
            span = [first]
            while self._waiting and self._waiting[0].item is not None and len(span) < self.span_limit:
                span.append(self._waiting.popleft())
            running = Span(self, span)
            task = asyncio.ensure_future(self.span_runner(running))
            task.add_done_callback(lambda t: _settle(t, running.waiting))
        task.add_done_callback(self._release)

    def _release(self, _: asyncio.Future | None) -> None:
        self._busy = False
        while self._waiting and not self._busy and not self._held:
            waiting = self._waiting.popleft()
            if waiting.coordinated:
                self._launch(waiting)
            else:
                forward(_started(waiting.start), waiting.fut)


def _settle(task: asyncio.Future, span: list[_Waiting]) -> None:
    """Each request of a span gets its own result (or exception), or all the span's failure."""
    if task.cancelled() or task.exception() is not None:
        for w in span:
            if not w.fut.done():
                if task.cancelled():
                    w.fut.cancel()
                else:
                    w.fut.set_exception(task.exception())
        return
    for w, result in zip(span, task.result(), strict=True):
        _answer(w.fut, result)


def _answer(fut: asyncio.Future, result: Any) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


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
