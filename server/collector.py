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
counting still frees them as before). Everything is thawed and collected in
full once the frozen objects have grown by a quarter since the last full
collection (CPython's own rule for its oldest generation, applied to the
frozen ones), and at the latest every ten minutes: a reference cycle among
frozen objects is freed once such garbage reaches a quarter of what lives,
or within ten minutes. A full collection scans every object, the imported
code's too (a worker starts with ~65,000: 25-60 ms a pass here), so one
every minute, as before, stalled every process once a minute for nothing
once its working set had stopped growing.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

FREEZE_EVERY = 1.0  # seconds between freezes of what survived
FULL_EVERY = 600.0  # seconds between full collections of everything, at the most
FULL_GROWTH = 1.25  # frozen objects, as a multiple of those after the last full collection, that start one
YOUNG = 10_000  # allocations between young collections (CPython's default: 700)


class Collector:
    """Runs the process's collections at its own pace: `between` is called where no command is half done."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.frozen_at = self.full_at = clock()
        self.full_collections = 0
        self.frozen_after_full = gc.get_freeze_count()
        gc.set_threshold(YOUNG, *gc.get_threshold()[1:])

    def between(self) -> None:
        now = self.clock()
        if now - self.frozen_at < FREEZE_EVERY and now - self.full_at < FULL_EVERY:
            return
        gc.collect(1)  # cycles among young objects go before they are frozen
        gc.freeze()
        self.frozen_at = now
        frozen = gc.get_freeze_count()
        if now - self.full_at >= FULL_EVERY or frozen > FULL_GROWTH * self.frozen_after_full:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.frozen_after_full = gc.get_freeze_count()
            self.full_at = now
            self.full_collections += 1

    async def run_on_loop(self) -> None:
        """`between`, every `FREEZE_EVERY` seconds, from an asyncio loop (the front's)."""
        while True:
            await asyncio.sleep(FREEZE_EVERY)
            self.between()
