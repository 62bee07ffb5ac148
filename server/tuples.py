"""A batch of a stream inside a command: an Arrow table, or tuples kept as Python values until one is needed.

Tuples a TE emits flow to the TEs its output triggers, in the same command on
the same partition, and those read them as Python rows (compiled statements,
state procedures, in-memory windows). Building a 1-tuple Arrow table costs
about 20 µs in a loop and 60-80 µs inside a running partition, where pyarrow's
conversion code is cold: more than the compiled statements of the TE that
reads it. So emitted tuples that fit their stream's shape exactly
(`RowShape`) travel as `Tuples`; an Arrow table is built when something needs
one (a statement run in DuckDB, a Python procedure's `tx.batch`, the command
log, output leaving the partition), and the log builds one for all the tuples
of a punctuation interval on one stream at once (server/ipc.py `join_runs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from streamtx.server.partition.state import RowShape, Values


class Tuples:
    """Tuples of one stream in column order, each value of its column's exact Python type (`RowShape.fits`)."""

    __slots__ = ("shape", "values", "_table")

    def __init__(self, shape: RowShape, values: list[Values]) -> None:
        self.shape = shape
        self.values = values
        self._table: pa.Table | None = None

    @property
    def num_rows(self) -> int:
        return len(self.values)

    @property
    def column_names(self) -> list[str]:
        return list(self.shape.names)

    @property
    def schema(self) -> pa.Schema:
        return self.shape.schema

    def table(self) -> pa.Table:
        """The tuples as a table of the stream's schema, built once."""
        if self._table is None:
            self._table = self.shape.table(self.values)
        return self._table

    def slice(self, offset: int, length: int) -> Tuples:
        return Tuples(self.shape, self.values[offset : offset + length])

    def rows(self) -> list[dict[str, Any]]:
        names = self.shape.names
        return [dict(zip(names, v, strict=True)) for v in self.values]


Batch = pa.Table | Tuples


def arrow(batch: Batch) -> pa.Table:
    """`batch` as an Arrow table."""
    return batch.table() if isinstance(batch, Tuples) else batch


def concat(parts: list[Batch]) -> Batch:
    """The parts as one batch, in order: Tuples when all are Tuples of one shape."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, Tuples) and all(isinstance(p, Tuples) and p.shape is first.shape for p in parts):
        return Tuples(first.shape, [v for p in parts for v in p.values])  # type: ignore[union-attr]
    return pa.concat_tables([arrow(p) for p in parts])
