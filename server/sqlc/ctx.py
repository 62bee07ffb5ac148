"""What a compiled statement runs against: the working set of the partition, the TE's batch and parameters.

Compiled statements read and write rows by primary key in the working set
(server/partition/opchain.py `WorkingSet`), which holds the rows of the
running punctuation interval and writes them back to DuckDB at its commit, so
a statement costs a few dictionary operations instead of a DuckDB round trip.
A key the working set does not hold is loaded from DuckDB (one point query;
`prefetch` loads an interval's keys in one query per table). A scan needs the
whole table in the working set: tables of at most `SCAN_MAX` rows are loaded
whole once, and a larger one makes the statement fall back to DuckDB
(`Fallback`, raised before the statement wrote anything).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

SCAN_MAX = 10_000
"""Rows of a table a compiled statement may scan; a larger table's statement runs in DuckDB."""

Row = dict[str, Any]
Key = Any


class Fallback(Exception):  # noqa: N818 - a signal, not an error: the statement runs in DuckDB instead
    """The compiled plan cannot run this time (a scan of a large table): DuckDB runs the statement."""


class Store(Protocol):
    """The partition's working set, as compiled statements need it (server/partition/state.py `StateStore`)."""

    def row(self, table: str, key: Key) -> Row | None: ...

    def rows(self, table: str, limit: int) -> list[Row] | None: ...

    def put(self, table: str, key: Key, row: Row | None) -> None: ...

    def load(self, table: str, keys: list[Key]) -> None: ...

    def window(self, name: str) -> list[Row]: ...

    def window_groups(
        self, name: str, key: str, tables: tuple[str, ...], part: Callable[[list[Row]], dict[Any, list[int]]]
    ) -> dict[Any, list[int]]: ...

    def inserted_here(self, table: str, key: Key) -> bool: ...

    def top_rows(
        self, key: str, table: str, looked_up: tuple[str, ...], row_fn: Callable[..., Any], k: int
    ) -> tuple[list[tuple[Any, ...]], list[list[int]]]: ...


class Ctx:
    """One execution of a compiled statement: the store, the TE's input batch (rows), parameters, timestamp."""

    __slots__ = ("store", "batch", "params", "ts", "get")

    def __init__(self, store: Store, batch: list[Row] | None, params: dict[str, Any], ts: int) -> None:
        self.store = store
        self.batch = batch
        self.params = params
        self.ts = ts
        self.get = store.row
        """`get(table, key)`: the row of `table` with primary key `key` (a tuple for a composite key), or None."""

    def many(self, table: str, keys: Iterable[Key]) -> Iterator[Row]:
        """The rows of `table` with the given keys (each once; NULLs and missing keys give none)."""
        get = self.store.row
        for key in dict.fromkeys(k for k in keys if k is not None):
            row = get(table, key)
            if row is not None:
                yield row

    def window(self, name: str) -> list[Row]:
        """The visible tuples of a window held in memory, oldest first."""
        return self.store.window(name)

    def window_groups(
        self, name: str, key: str, tables: tuple[str, ...], part: Callable[[list[Row]], dict[Any, list[int]]]
    ) -> dict[Any, list[int]]:
        """An aggregate over a window that adds up, from the tuples that entered and left it (query.py `_grouped`).

        `part(rows)` gives the groups of `rows` alone, reading no table but
        `tables`; `key` names the aggregate (equal for equal `part`s).
        """
        return self.store.window_groups(name, key, tables, part)

    def top_rows(
        self, key: str, table: str, looked_up: tuple[str, ...], row_fn: Callable[..., Any], k: int
    ) -> tuple[list[tuple[Any, ...]], list[list[int]]]:
        """A top K over a scan of `table` kept up to date as rows change (partition/ranked.py): the joined rows
        of the first `k` by `row_fn`'s sort key, in the scan's order, and their row numbers."""
        return self.store.top_rows(key, table, looked_up, row_fn, k)

    def scan(self, table: str) -> Iterator[Row]:
        return iter(self._rows(table))

    def count(self, table: str) -> int:
        """`SELECT count(*) FROM table`, without a loop over its rows."""
        return len(self._rows(table))

    def _rows(self, table: str) -> list[Row]:
        rows = self.store.rows(table, SCAN_MAX)
        if rows is None:
            raise Fallback(f"table {table!r} holds more than {SCAN_MAX} rows")
        return rows


def one(row: Row | None) -> tuple[Row, ...]:
    """A lookup as a loop of zero or one row (an inner join, or a point read)."""
    return () if row is None else (row,)


def opt(row: Row | None) -> tuple[Row | None]:
    """A lookup as a loop of exactly one row, None when missing (a LEFT JOIN)."""
    return (row,)
