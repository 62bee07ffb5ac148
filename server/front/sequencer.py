"""The sequencer: global timestamps, and batch-id order per producer and stream.

Every command (batch, call, deploy) gets the next timestamp when it is
dispatched to the partitions; since dispatch writes to every partition queue
synchronously, each partition sees commands in timestamp order.

A producer's batch ids on a stream start at 1 and increase by one. A batch is
dispatched only after its predecessor was: one that arrives early waits (at
most `order_timeout` seconds, then it is rejected with FAILED_PRECONDITION and
its id stays free). A batch id at or below the last dispatched one is a
re-send: the front answers it DUPLICATE with the original outcome, asking
every partition behind the original (front.py `_resent`), whatever partitions
its rows would route to now.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from streamtx.errors import FailedPrecondition
from streamtx.server.front.gate import forward

Dispatch = Callable[[int], asyncio.Future]
"""Sends a batch to its partitions with the given timestamp, synchronously (so that
queue order is timestamp order); the returned future is the outcome."""


class Sequencer:
    def __init__(self, *, order_timeout: float, last_ts: int = 0, parks: bool = True) -> None:
        self.last_ts = last_ts
        self.order_timeout = order_timeout
        self.parks = parks  # False (cluster mode): an early batch is refused at once, the same on every host
        self.dispatched: dict[tuple[str, str], int] = {}
        self.holes: dict[tuple[str, str], set[int]] = {}  # ids below `dispatched` a crash lost (front.py)
        self._parked: dict[tuple[str, str], dict[int, tuple[Dispatch, asyncio.Future]]] = {}

    def next_ts(self) -> int:
        self.last_ts += 1
        return self.last_ts

    def skip_to(self, ts: int) -> None:
        """The next timestamp given is above `ts` (cluster mode: an entry's timestamps start at its log position)."""
        self.last_ts = max(self.last_ts, ts)

    def load_marks(self, marks: dict[tuple[str, str], int], last_ts: int) -> None:
        for key, batch_id in marks.items():
            self.dispatched[key] = max(self.dispatched.get(key, 0), batch_id)
        self.last_ts = max(self.last_ts, last_ts)

    def take_hole(self, producer: str, stream: str, batch_id: int) -> bool:
        """True (once) if `batch_id` was lost in a crash: it is to be taken as new, out of its order."""
        lost = self.holes.get((producer, stream))
        if not lost or batch_id not in lost:
            return False
        lost.discard(batch_id)
        return True

    def forget_streams(self, keep: set[str]) -> None:
        """Drops the batch-id positions of streams that no longer exist."""
        self.dispatched = {key: b for key, b in self.dispatched.items() if key[1] in keep}
        self.holes = {key: ids for key, ids in self.holes.items() if key[1] in keep}

    def submit(self, producer: str, stream: str, batch_id: int, dispatch: Dispatch) -> asyncio.Future:
        """Dispatches now if in order, else parks; the future resolves with the outcome."""
        key = (producer, stream)
        last = self.dispatched.get(key, 0)
        loop = asyncio.get_running_loop()
        if batch_id <= last + 1:
            fut = dispatch(self.next_ts())
            if batch_id == last + 1:
                self.dispatched[key] = batch_id
                self._release(key)
            return fut
        if not self.parks:  # rejected now, its id left free: the same answer on every host
            early: asyncio.Future = loop.create_future()
            early.set_exception(
                FailedPrecondition(
                    f"batch {batch_id} of producer {key[0]!r} on stream {key[1]!r} reached the cluster's log before "
                    f"batch {last + 1}; in cluster mode a producer's batches must reach the log in batch-id order "
                    "(one PushStream, or one unary Push at a time)"
                )
            )
            return early
        parked = self._parked.setdefault(key, {})
        if batch_id in parked:
            # the same early batch twice: wait for the first copy's outcome
            return _chain(parked[batch_id][1])
        waiter: asyncio.Future = loop.create_future()
        parked[batch_id] = (dispatch, waiter)
        loop.call_later(self.order_timeout, self._expire, key, batch_id, last)
        return waiter

    def submit_run(self, producer: str, stream: str, first: int, count: int, dispatch: Callable[[int], None]) -> bool:
        """Dispatches batches `first`.. `first + count - 1` now, at consecutive timestamps from the one
        given to `dispatch`, if `first` is next in order and none of them is parked; else False (each
        goes by `submit`)."""
        key = (producer, stream)
        if first != self.dispatched.get(key, 0) + 1:
            return False
        parked = self._parked.get(key)
        if parked and min(parked) < first + count:
            return False
        ts = self.last_ts + 1
        self.last_ts += count
        self.dispatched[key] = first + count - 1
        dispatch(ts)
        self._release(key)
        return True

    def _release(self, key: tuple[str, str]) -> None:
        parked = self._parked.get(key)
        while parked:
            nxt = self.dispatched[key] + 1
            entry = parked.pop(nxt, None)
            if entry is None:
                break
            dispatch, waiter = entry
            self.dispatched[key] = nxt
            inner = dispatch(self.next_ts())
            forward(inner, waiter)
        if parked is not None and not parked:
            self._parked.pop(key, None)

    def _expire(self, key: tuple[str, str], batch_id: int, last_when_parked: int) -> None:
        parked = self._parked.get(key)
        if not parked or batch_id not in parked:
            return
        _, waiter = parked.pop(batch_id)
        if not parked:
            self._parked.pop(key, None)
        missing = self.dispatched.get(key, 0) + 1
        if not waiter.done():
            waiter.set_exception(
                FailedPrecondition(
                    f"batch {batch_id} of producer {key[0]!r} on stream {key[1]!r} waited "
                    f"{self.order_timeout:g} s for batch {missing}, which never arrived; batches of "
                    "a producer are taken in batch-id order, starting at 1"
                )
            )

    def awaited(self, producer: str, stream: str, batch_id: int) -> bool:
        """True if a later batch of the producer is parked, waiting for this one."""
        parked = self._parked.get((producer, stream))
        return bool(parked) and max(parked) > batch_id

    def parked_count(self) -> int:
        return sum(len(p) for p in self._parked.values())


def _chain(fut: asyncio.Future) -> asyncio.Future:
    out: asyncio.Future = asyncio.get_running_loop().create_future()
    forward(fut, out)
    return out
