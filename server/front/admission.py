"""Admission: what pushes may hold in the server at once, in batches and in bytes.

Every pushed batch is admitted before it is sequenced and released when its
outcome is known, so the batches waiting in the sequencer, at the gate and in
the partitions' queues never exceed `--max-in-flight` batches or
`--max-in-flight-bytes` bytes (as received on the wire). That bounds the
server's memory whatever the producers do, and it bounds how long a query
waits behind pushes: a query is one more command in the partitions' queues.

A request is admitted while less than both limits is in flight, so what is
held stays under a limit plus one message (a message's batches are
sequenced together); waiters are admitted first come, first served, so
unary pushes queue with streaming producers. `admit_now` takes a batch over
the limit when later batches of its producer, admitted first, wait for it in
the sequencer: they hold room until it comes.
"""

from __future__ import annotations

import asyncio
import collections
import time

RATE_WINDOW_S = 1.0
"""Releases are counted over this window to estimate when room comes (`retry_after`)."""


class Admission:
    def __init__(self, max_batches: int, max_bytes: int) -> None:
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.batches = 0
        self.bytes = 0
        self.refused = 0
        self._waiters: collections.deque[tuple[int, int, asyncio.Future[None]]] = collections.deque()
        self._released: collections.deque[tuple[float, int]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _fits(self) -> bool:
        return self.batches < self.max_batches and self.bytes < self.max_bytes

    def _take(self, batches: int, nbytes: int) -> None:
        self.batches += batches
        self.bytes += nbytes

    def admit_now(self, batches: int, nbytes: int) -> None:
        """Takes room whatever is in flight: for a request the ones already admitted wait for."""
        self._take(batches, nbytes)

    async def acquire(self, batches: int, nbytes: int, timeout: float | None = None) -> bool:
        """Waits in line for room; False if none came within `timeout` seconds (nothing is taken then)."""
        if not self._waiters and self._fits():
            self._take(batches, nbytes)
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (batches, nbytes, fut)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            if fut.done():  # admitted just as the wait ran out: keep it
                return True
            self._waiters.remove(entry)
            self.refused += 1
            self._wake()
            return False
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(batches, nbytes)
            elif entry in self._waiters:
                self._waiters.remove(entry)
                self._wake()
            raise
        return True

    def release(self, batches: int, nbytes: int) -> None:
        self.batches -= batches
        self.bytes -= nbytes
        now = time.monotonic()
        self._released.append((now, batches))
        while self._released and self._released[0][0] < now - RATE_WINDOW_S:
            self._released.popleft()
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            batches, nbytes, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._fits():
                return
            self._waiters.popleft()
            self._take(batches, nbytes)
            fut.set_result(None)

    def retry_after(self) -> float:
        """Seconds until the batches in line ahead of a new request have likely drained (0.05 to 2)."""
        now = time.monotonic()
        rate = sum(n for t, n in self._released if t >= now - RATE_WINDOW_S) / RATE_WINDOW_S
        ahead = self.batches + sum(b for b, _, _ in self._waiters)
        if rate <= 0:
            return 1.0
        return min(2.0, max(0.05, ahead / rate))
