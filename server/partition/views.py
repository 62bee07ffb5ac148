"""Views (catalog/views.py) kept equal to their query as the partition writes their tables.

A row written in the working set moves its part of each view of its table:
the old row's part leaves its group, the new row's joins its group. The view's
rows are working-set rows like any others, so a rollback takes the change
back, a later statement of the TE reads it, and the write-back stores it. A
statement DuckDB runs recomputes the views of the tables it may write
(`StateStore.refresh_views`), as nothing tells which rows it changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from streamtx.errors import Internal
from streamtx.procedure import Row
from streamtx.server.catalog.views import ViewPlan
from streamtx.server.partition.opchain import WorkingSet


class Rows(Protocol):
    """The rows a view's change reads and writes: the working set, a missing row loaded from DuckDB."""

    ws: WorkingSet

    def row(self, table: str, key: Any) -> Row | None: ...


class Follower:
    """One view's arithmetic: a row's group key and what it adds to each aggregate."""

    def __init__(self, plan: ViewPlan) -> None:
        self.name = plan.name
        self.groups = plan.groups
        table_cols = [t for _, t in plan.groups]
        if len(table_cols) == 1:
            col = table_cols[0]
            self.key: Callable[[Row], Any] = lambda r: r[col]
        else:
            self.key = lambda r: tuple(r[c] for c in table_cols)
        self.aggregates = [(a.column, a.fn, a.arg) for a in plan.aggregates]
        self.count_at = next(i for i, a in enumerate(plan.aggregates) if a.fn == "count" and a.arg is None)
        self.count = plan.aggregates[self.count_at].column

    def part(self, row: Row) -> list[int]:
        """What `row` adds to each aggregate of its group."""
        out = []
        for _, fn, arg in self.aggregates:
            if arg is None:
                out.append(1)
            elif fn == "count":
                out.append(0 if row[arg] is None else 1)
            else:
                out.append(row[arg])
        return out

    def change(self, store: Rows, old: Row | None, new: Row | None) -> None:
        """`old` became `new` in the view's table (None: no row)."""
        if old is not None and new is not None:
            key = self.key(new)
            if self.key(old) == key:
                delta = [n - o for n, o in zip(self.part(new), self.part(old), strict=True)]
                if any(delta):
                    self._add(store, key, delta, new)
                return
        if old is not None:
            self._add(store, self.key(old), [-v for v in self.part(old)], old)
        if new is not None:
            self._add(store, self.key(new), self.part(new), new)

    def _add(self, store: Rows, key: Any, delta: list[int], source: Row) -> None:
        row = store.row(self.name, key)
        if row is None:
            if delta[self.count_at] <= 0:
                raise Internal(f"view {self.name!r}: group {key!r} is missing, yet a row of it changed")
            row = {v: source[t] for v, t in self.groups}
            row.update({col: d for (col, _, _), d in zip(self.aggregates, delta, strict=True)})
        else:
            row = dict(row)
            for (col, _, _), d in zip(self.aggregates, delta, strict=True):
                row[col] += d
            if row[self.count] == 0:
                store.ws.write(self.name, key, None)
                return
        store.ws.write(self.name, key, row)
