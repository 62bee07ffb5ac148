"""A top K of a small table's rows kept up to date as the rows change: a leaderboard without a sort per run.

A compiled `row_number() OVER (ORDER BY ...)` capped by `WHERE r <= K`, over
a scan of a table joined to other tables by their primary keys (server/sqlc
query.py), would read and sort every row on every run: the SQL voter's
boards did it for 25 contestants, twice per vote. `Ranked` keeps each row's
sort key in a sorted list instead, and before a run recomputes only the rows
the working set's logs say were written since (`WorkingSet.logs`): the scanned
table's own rows, and the rows whose lookups read a row written since. A
vote for one contestant re-ranks one entry.

What it returns is what the full scan and sort returned: rows with equal
sort keys keep the scan's order (the working set's order of the table's
keys). Whatever no key names — a rollback, rows forgotten and reloaded, SQL
writing a table in DuckDB, a key new to the table — makes the next run
rebuild from a full scan, as does an exception while rows were recomputed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any

from streamtx.server.partition.opchain import WorkingSet
from streamtx.server.sqlc.ctx import SCAN_MAX, Fallback, Key, Row

Getter = Callable[[str, Key], Row | None]
RowFn = Callable[[Row, Getter], tuple[Any, tuple[Any, ...]] | None]
"""One scanned row to its (sort key, joined rows), None if it is filtered out; its lookups go through the getter."""


class Ranked:
    """The rows of `table` that `row_fn` keeps, ordered by their sort keys, and what each read to get there."""

    def __init__(self, table: str, looked_up: tuple[str, ...], row_fn: RowFn) -> None:
        self.table = table
        self.tables = tuple(dict.fromkeys((table, *looked_up)))
        self.row_fn = row_fn
        self.ws: WorkingSet | None = None  # the working set it reflects; None: rebuild
        self.generation = -1
        self.seen: dict[str, int] = {}  # each table's version when last brought up to date
        self.order: list[tuple[Any, int]] = []  # (sort key, position in the scan), sorted
        self.entry: dict[Key, tuple[Any, int]] = {}  # kept key -> its item in `order`
        self.joined: dict[int, tuple[Any, ...]] = {}  # position -> the joined rows
        self.position: dict[Key, int] = {}  # every key of the table held, in the scan's order
        self.reads: dict[Key, list[tuple[str, Key]]] = {}  # key -> the rows its lookups read
        self.readers: dict[tuple[str, Key], set[Key]] = {}  # a row read -> the keys whose lookups read it

    def top(self, store: Any, k: int) -> tuple[list[tuple[Any, ...]], list[list[int]]]:
        """The first `k` rows by sort key, in the scan's order, with their row numbers (1 = first by sort key).

        `store` is the partition's StateStore (rows, row, ws)."""
        ws: WorkingSet = store.ws
        try:
            if self.ws is not ws or self.generation != ws.generation or not self._catch_up(store, ws):
                self._build(store, ws)
                store.engine.counters["ranked_built"] += 1
            else:
                store.engine.counters["ranked_kept"] += 1
        except BaseException:
            self.ws = None
            raise
        kept = sorted([(position, rank) for rank, (_, position) in enumerate(self.order[:k], 1)])
        joined = self.joined
        return [joined[position] for position, _ in kept], [[rank] for _, rank in kept]

    def _build(self, store: Any, ws: WorkingSet) -> None:
        self.ws = None
        for t in self.tables:
            ws.watch(t)
        if store.rows(self.table, SCAN_MAX) is None:
            raise Fallback(f"table {self.table!r} holds more than {SCAN_MAX} rows")
        have = ws.rows[self.table]
        self.order = []
        self.entry, self.joined, self.reads, self.readers = {}, {}, {}, {}
        self.position = {key: i for i, key in enumerate(have)}
        self.seen = {}
        order = self.order
        for key, row in have.items():
            if row is not None:
                item = self._compute(store, key, row)
                if item is not None:
                    order.append(item)
        order.sort()
        self._seen(ws)

    def _catch_up(self, store: Any, ws: WorkingSet) -> bool:
        """Recomputes the rows written since; False if the working set cannot say which (rebuild instead)."""
        stale: dict[Key, None] = {}
        logs, seen, readers = ws.logs, self.seen, self.readers
        for t in self.tables:
            start, written = logs[t]
            since = seen[t]
            if since < start:
                return False
            if len(written) == since - start:
                continue
            keys = written[since - start :]
            if t == self.table:
                stale.update(dict.fromkeys(keys))
            for key in keys:
                found = readers.get((t, key))
                if found:
                    stale.update(dict.fromkeys(found))
        if stale:
            have = ws.rows[self.table]
            position = self.position
            if any(key not in position for key in stale):
                return False  # a key new to the table: its place in the scan's order is the working set's
            for key in stale:
                self._forget(key)
                row = have.get(key)
                item = None if row is None else self._compute(store, key, row)
                if item is not None:
                    insort(self.order, item)
        self._seen(ws)
        return True

    def _compute(self, store: Any, key: Key, row: Row) -> tuple[Any, int] | None:
        """The row's item for `order` (None: filtered out), noting what its lookups read; `order` is the caller's."""
        reads: list[tuple[str, Key]] = []
        get = store.row

        def read(table: str, k: Key) -> Row | None:
            reads.append((table, k))
            return get(table, k)

        out = self.row_fn(row, read)
        self.reads[key] = reads
        for r in reads:
            self.readers.setdefault(r, set()).add(key)
        if out is None:
            return None
        item = (out[0], self.position[key])
        self.entry[key] = item
        self.joined[item[1]] = out[1]
        return item

    def _forget(self, key: Key) -> None:
        item = self.entry.pop(key, None)
        if item is not None:
            order = self.order
            del order[bisect_left(order, item)]
            del self.joined[item[1]]
        for r in self.reads.pop(key, ()):
            readers = self.readers[r]
            readers.discard(key)
            if not readers:
                del self.readers[r]

    def _seen(self, ws: WorkingSet) -> None:
        self.ws = ws
        self.generation = ws.generation
        versions, seen = ws.versions, self.seen
        for t in self.tables:
            seen[t] = versions.get(t, 0)
