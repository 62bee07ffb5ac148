"""Garbage collection in the server's processes: long-lived state kept out of CPython's full collections.

A partition worker holds its working set in memory (up to `CACHED_ROWS` rows
per table, window tuples, marks, compiled plans), the front its batches in
flight and their producers' state: hundreds of thousands of objects that
live for seconds to minutes. CPython's cyclic collector scans every one of
them in each full (generation 2) collection, which it starts whenever a
quarter more objects have survived since the last one. With the SQL voter's
1-vote batches the worker made 17 full collections in 15 s, 60-100 ms each,
finding no garbage: about a tenth of its time, and a stall for every batch
in flight; the front spent about a seventh of its CPU collecting.

So, at points where no command is half done, objects that have lived a
second are frozen (`gc.freeze`: the collector stops scanning them; reference
counting still frees them as before), and once a minute everything is thawed
and collected in full once, so a reference cycle is still freed, within a
minute.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

FREEZE_EVERY = 1.0  # seconds between freezes of what survived
FULL_EVERY = 60.0  # seconds between full collections of everything
YOUNG = 10_000  # allocations between young collections (CPython's default: 700)


class Collector:
    """Runs the process's collections at its own pace: `between` is called where no command is half done."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.frozen_at = self.full_at = clock()
        self.full_collections = 0
        gc.set_threshold(YOUNG, *gc.get_threshold()[1:])

    def between(self) -> None:
        now = self.clock()
        if now - self.full_at >= FULL_EVERY:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.full_at = self.frozen_at = now
            self.full_collections += 1
        elif now - self.frozen_at >= FREEZE_EVERY:
            gc.collect(1)  # cycles among young objects go before they are frozen
            gc.freeze()
            self.frozen_at = now

    async def run_on_loop(self) -> None:
        """`between`, every `FREEZE_EVERY` seconds, from an asyncio loop (the front's)."""
        while True:
            await asyncio.sleep(FREEZE_EVERY)
            self.between()
