"""What generated query code calls besides scalar helpers: subquery results, ordering, numbering, aggregates.

Each follows DuckDB; where DuckDB raises an error (a scalar subquery of
several rows, a sum past 128 bits) they raise `Fallback`, so DuckDB runs the
statement and words the error itself. NULLs
sort last in both directions unless NULLS FIRST; `x IN (subquery)` is NULL
when x is NULL or when x is not found but the subquery held a NULL; a sum of
integers is a HUGEINT.
"""

from __future__ import annotations

import builtins
from typing import Any

from streamtx.server.sqlc import runtime
from streamtx.server.sqlc.ctx import Fallback, one, opt

HUGEINT_MAX = 2**127 - 1


def scalar(rows: list[tuple[Any, ...]]) -> Any:
    if not rows:
        return None
    if len(rows) > 1:
        raise Fallback("a scalar subquery returned more than one row: DuckDB words the error")
    return rows[0][0]


def in_rows(value: Any, rows: list[tuple[Any, ...]]) -> bool | None:
    if not rows:
        return False
    if value is None:
        return None
    seen_null = False
    for (v,) in rows:
        if v is None:
            seen_null = True
        elif v == value:
            return True
    return None if seen_null else False


def column(rows: list[tuple[Any, ...]]) -> list[Any]:
    """The first column of a subquery's rows (the keys of `pk IN (subquery)`)."""
    return [r[0] for r in rows]


class _Desc:
    """Reverses the order of any comparable value (strings included) for descending sort keys."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _Desc) -> bool:
        return other.v < self.v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.v == other.v

    def __hash__(self) -> int:
        return hash(self.v)


def sort_key(value: Any, desc: bool, nulls_first: bool) -> tuple[int, Any]:
    """Any comparable value (a string); `number_key` is the faster one for numbers and booleans."""
    if value is None:
        return (0, 0) if nulls_first else (2, 0)
    return (1, _Desc(value) if desc else value)


def number_key(value: Any, desc: bool, nulls_first: bool) -> tuple[int, int, Any]:
    """An ascending key even for DESC (negated), in C-level tuple comparisons; NaN above every number."""
    if value is None:
        return (0, 0, 0) if nulls_first else (2, 0, 0)
    if value != value:  # NaN, which DuckDB sorts above +inf
        return (1, -1 if desc else 1, 0)
    return (1, 0, -value if desc else value)


def number_rownumber(group: list[tuple[Any, int]], windows: list[list[Any]], j: int) -> None:
    for n, (_, i) in enumerate(group, 1):
        windows[i][j] = n


def number_rank(group: list[tuple[Any, int]], windows: list[list[Any]], j: int) -> None:
    rank, last = 0, object()
    for n, (key, i) in enumerate(group, 1):
        if key != last:
            rank, last = n, key
        windows[i][j] = rank


def number_denserank(group: list[tuple[Any, int]], windows: list[list[Any]], j: int) -> None:
    rank, last = 0, object()
    for key, i in group:
        if key != last:
            rank, last = rank + 1, key
        windows[i][j] = rank


def same(value: Any) -> Any:
    return value


def hugeint(total: Any) -> Any:
    if total is not None and not -HUGEINT_MAX - 1 <= total <= HUGEINT_MAX:
        raise Fallback("a sum beyond HUGEINT: DuckDB words the error")
    return total


def namespace() -> dict[str, Any]:
    """Globals for generated code: the scalar runtime and these helpers, under the names the generator writes."""
    ns = dict(runtime.NAMESPACE)  # helpers registered while the statement was compiled
    ns["__builtins__"] = builtins
    ns.update(
        {
            "_scalar": scalar,
            "_in_rows": in_rows,
            "_column": column,
            "_sort_key": sort_key,
            "_number_key": number_key,
            "_number_rownumber": number_rownumber,
            "_number_rank": number_rank,
            "_number_denserank": number_denserank,
            "_same": same,
            "_hugeint": hugeint,
            "_one": one,
            "_opt": opt,
        }
    )
    return ns
