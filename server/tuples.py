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

import operator
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from streamtx.procedure import Row
from streamtx.server.catalog.compile import TS_COLUMN

INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.uint8(): (0, 2**8 - 1),
    pa.uint16(): (0, 2**16 - 1),
    pa.uint32(): (0, 2**32 - 1),
    pa.uint64(): (0, 2**63 - 1),  # what inference reads as int64: larger ints take the general path
}

_PY_TYPES = {pa.string(): str, pa.large_string(): str, pa.bool_(): bool, pa.float64(): float}
Kind = tuple[type, int | None, int | None]
"""A column's exact Python type and, for integers, its range."""

Values = tuple[Any, ...]
"""One row's values in its stream's column order."""


class RowShape:
    """A stream's columns as exact Python types: post_process rows become its tables without inference.

    The general path (`Transaction.emit`) infers Arrow types from the rows,
    then casts to the stream's schema. When a row has exactly the stream's
    columns and each value is None or of its column's own Python type (an int
    in the column's range, a str, a bool, a float), building the columns with
    the schema's types gives the same table, and reading it back gives the
    same values; `values` says whether that holds, so whatever else a
    procedure emits (and every error) still takes the general path.
    """

    def __init__(self, schema: pa.Schema, checks: list[Kind]) -> None:
        self.schema = schema
        self.names = tuple(schema.names)
        self.stored_schema = schema.append(pa.field(TS_COLUMN, pa.int64()))
        self._struct = pa.struct(list(schema))
        self._stored_struct = pa.struct(list(self.stored_schema))
        self._keys = frozenset(self.names)
        self._checks = checks
        name = self.names[0]
        self._get: Callable[[Row], Values] = (
            operator.itemgetter(*self.names) if len(self.names) > 1 else lambda r: (r[name],)
        )

    @classmethod
    def of(cls, schema: pa.Schema) -> RowShape | None:
        """The shape of `schema`, or None if a column's type has no exact Python counterpart here."""
        checks = [kind_of(field.type) for field in schema]
        if not checks or None in checks or len(set(schema.names)) < len(schema.names):
            return None
        return cls(schema, checks)

    def values(self, rows: list[Row]) -> list[Values] | None:
        """Each row's values in column order, or None if any row does not fit the shape exactly."""
        keys, get, checks = self._keys, self._get, self._checks
        out = []
        for row in rows:
            if type(row) is not dict or row.keys() != keys:
                return None
            values = get(row)
            for v, kind in zip(values, checks, strict=True):
                if v is not None and not fits_kind(v, kind):
                    return None
            out.append(values)
        return out

    def fits(self, values: list[Values]) -> bool:
        """Whether values in column order (a compiled statement's tuples) fit the shape exactly."""
        n, checks = len(self.names), self._checks
        for row in values:
            if len(row) != n:
                return False
            for v, kind in zip(row, checks, strict=True):
                if v is not None and not fits_kind(v, kind):
                    return False
        return True

    def table(self, values: list[Values]) -> pa.Table:
        """The rows as a table of the stream's schema (values from `values`)."""
        return self._table(values, self._struct, self.schema)

    def stored(self, values: list[Values], stamps: list[int]) -> pa.Table:
        """The rows with their timestamps, as the stream's storage table takes them."""
        rows = [(*v, ts) for v, ts in zip(values, stamps, strict=True)]
        return self._table(rows, self._stored_struct, self.stored_schema)

    @staticmethod
    def _table(rows: list[Values], struct: pa.StructType, schema: pa.Schema) -> pa.Table:
        # one conversion for all columns: a struct array of the rows, then its fields as the columns
        table = pa.Table.from_struct_array(pa.array(rows, type=struct))
        return table.replace_schema_metadata(schema.metadata) if schema.metadata else table


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate, which Arrow refuses
        return False
    return True


def kind_of(arrow_type: pa.DataType) -> Kind | None:
    """The exact Python type (and range) whose values an Arrow type stores unchanged; None if it has none here."""
    bounds = INT_RANGES.get(arrow_type)
    if bounds is not None:
        return (int, *bounds)
    cls = _PY_TYPES.get(arrow_type)
    return None if cls is None else (cls, None, None)


def fits_kind(v: Any, kind: Kind) -> bool:
    """A value (not None) is exactly of the kind's Python type, in its range; a str Arrow can encode."""
    cls, lo, hi = kind
    if type(v) is not cls:
        return False
    if lo is not None:
        return lo <= v <= hi  # type: ignore[operator]
    return cls is not str or v.isascii() or _encodable(v)


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
