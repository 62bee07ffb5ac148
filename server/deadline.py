"""A deadline for one read-only DuckDB query: interrupted when it runs longer, never after.

`--query-timeout` bounds a Query (and a gather's reads) where it runs: on a
partition, whose one thread it holds meanwhile, and on the front, over
gathered tables. DuckDB stops a query when `interrupt` is called from another
thread; the lock makes sure the timer never interrupts once the query has
returned (an interrupt while idle is harmless: DuckDB clears it when the next
statement starts). Inside an open transaction an interrupt aborts the whole
transaction, so callers use it only outside one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import duckdb

from streamtx.errors import DeadlineExceeded


@contextmanager
def query_deadline(con: duckdb.DuckDBPyConnection, seconds: float, what: Callable[[], str]) -> Iterator[None]:
    """Runs the block with `con` interrupted after `seconds` (0: no deadline); then DeadlineExceeded."""
    if seconds <= 0:
        yield
        return
    lock = threading.Lock()
    running = True
    fired = False

    def expire() -> None:
        nonlocal fired
        with lock:
            if running:
                fired = True
                con.interrupt()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except duckdb.InterruptException:
        if fired:
            raise DeadlineExceeded(
                f"{what()}: ran longer than --query-timeout ({seconds:g} s) and was stopped; nothing changed"
            ) from None
        raise
    finally:
        with lock:
            running = False
        timer.cancel()
