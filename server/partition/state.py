"""State access for state procedures: set-based load and write-back of a working set.

The executor decides when: `serial` loads, applies and writes back per TE;
`opchain` loads every key a punctuation interval declared with one query per
table, keeps the working set across the interval's TEs, and writes back once,
or earlier when a barrier TE (SQL) must see the state.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from streamtx.errors import Aborted, InvalidArgument
from streamtx.server.catalog.compile import STREAM_SCHEMA, quote
from streamtx.server.ipc import split_runs
from streamtx.server.statetx import Event, Row, WorkingSet

if TYPE_CHECKING:
    from streamtx.server.partition.engine import Engine


_INT_RANGES = {
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

CACHED_ROWS = 100_000  # rows of one table the working set keeps across intervals
SMALL = 4  # rows (or keys) few enough for one parameterized statement each, rather than a registered relation
SPLIT_WRITE_BACK = 64  # new rows of a table that pay for a separate INSERT beside its upsert
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

    def __init__(self, schema: pa.Schema, checks: list[tuple[type, int | None, int | None]]) -> None:
        self.schema = schema
        self.names = tuple(schema.names)
        self.stored_schema = schema.append(pa.field("batch_id", pa.int64()))
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
        checks: list[tuple[type, int | None, int | None]] = []
        for field in schema:
            bounds = _INT_RANGES.get(field.type)
            if bounds is not None:
                checks.append((int, *bounds))
            elif field.type in _PY_TYPES:
                checks.append((_PY_TYPES[field.type], None, None))
            else:
                return None
        if not checks or len(set(schema.names)) < len(schema.names):
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
            for v, (kind, lo, hi) in zip(values, checks, strict=True):
                if v is None:
                    continue
                if type(v) is not kind:
                    return None
                if lo is not None and not lo <= v <= hi:
                    return None
                if kind is str and not v.isascii() and not _encodable(v):
                    return None
            out.append(values)
        return out

    def table(self, values: list[Values]) -> pa.Table:
        """The rows as a table of the stream's schema (values from `values`)."""
        return self._table(values, self._struct, self.schema)

    def stored(self, values: list[Values], batch_ids: list[int]) -> pa.Table:
        """The rows with their batch ids, as the stream's storage table takes them."""
        rows = [(*v, b) for v, b in zip(values, batch_ids, strict=True)]
        return self._table(rows, self._stored_struct, self.stored_schema)

    @staticmethod
    def _table(rows: list[Values], struct: pa.StructType, schema: pa.Schema) -> pa.Table:
        # one conversion for all columns: a struct array of the rows, then its fields as the columns
        table = pa.Table.from_struct_array(pa.array(rows, type=struct))
        return table.replace_schema_metadata(schema.metadata) if schema.metadata else table


def _plain(v: Any) -> bool:
    """A value DuckDB binds as a parameter exactly as it reads it from an inferred Arrow column.

    None, a bool, an int64, a float, a str, or a flat list of such values of one kind.
    """
    kind = type(v)
    if kind is list:
        kinds = {type(x) for x in v if x is not None}
        return len(kinds) <= 1 and all(_plain_scalar(x) for x in v)
    return _plain_scalar(v)


def _plain_scalar(v: Any) -> bool:
    kind = type(v)
    if v is None or kind is bool or kind is float or kind is str:
        return True
    return kind is int and -(2**63) <= v < 2**63


def _plain_rows(rows: list[Row], cols: list[str]) -> bool:
    return all(_plain(r.get(c)) for r in rows for c in cols)


def _same_plain_kind(keys: list[Any]) -> bool:
    """Keys all ints or all strs, plain: bound one by one they compare as the list parameter's would."""
    kinds = {type(k) for k in keys}
    return (kinds == {str} or kinds == {int}) and all(_plain(k) for k in keys)


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate, which Arrow refuses
        return False
    return True


def table_rows(table: pa.Table) -> list[Row]:
    """`table.to_pylist()`, column by column: the same rows for a fraction of the cost."""
    if table.num_columns == 0:
        return table.to_pylist()
    names = table.column_names
    return [
        dict(zip(names, values, strict=True)) for values in zip(*(c.to_pylist() for c in table.columns), strict=True)
    ]


def run_values(runs: list[list[int]], tables: list[pa.Table]) -> tuple[list[pa.Table], list[list[Values]]]:
    """The batches `join_runs` joined (server/ipc.py), and each one's rows as values in column order.

    One conversion to Python per run of batches, not one per batch.
    """
    batches, _ = split_runs(runs, tables)
    values: list[list[Values]] = []
    for counts, table in zip(runs, tables, strict=False):
        rows = list(zip(*(c.to_pylist() for c in table.columns), strict=True)) if table.num_columns else []
        rows = rows or [()] * table.num_rows
        at = 0
        for n in counts:
            values.append(rows[at : at + n])
            at += n
    return batches, values


class StateStore:
    """The partition's working set and the DuckDB statements that load and write it back."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ws = WorkingSet()
        self.keys: dict[str, str] = {}  # table -> its one-column primary key
        self.columns: dict[str, list[str]] = {}
        # retained-stream tuples to store at the commit: tables, or row values of the stream's shape
        self.pending_out: dict[str, list[tuple[int, pa.Table | list[Values]]]] = {}
        self._shapes: dict[str, RowShape | None] = {}

    def refresh_schema(self) -> None:
        """Reads primary keys and columns of the tables (after a deploy)."""
        con = self.engine.con
        self.keys = {}
        for table, cols in con.execute(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type = 'PRIMARY KEY' AND schema_name = 'main'"
        ).fetchall():
            if len(cols) == 1:
                self.keys[table] = cols[0]
        self.columns = {t: list(cols) for t, cols in self.engine.catalog.table_columns.items()}
        self._shapes = {}
        self.ws.clear()

    def shape(self, stream: str) -> RowShape | None:
        """The stream's `RowShape` (None: unknown stream, or no shape for its types)."""
        try:
            return self._shapes[stream]
        except KeyError:
            schema = self.engine.catalog.stream_schemas.get(stream)
            shape = self._shapes[stream] = RowShape.of(schema) if schema is not None else None
            return shape

    def key_of(self, table: str) -> str:
        key = self.keys.get(table)
        if key is None:
            if table not in self.engine.catalog.tables:
                raise InvalidArgument(f"state access to unknown table {table!r}")
            raise InvalidArgument(f"state access to table {table!r}: it needs a one-column PRIMARY KEY")
        return key

    def load_for(self, events: list[Event]) -> None:
        """Loads every key the events' operations touch and the working set lacks: one query per table."""
        rows = self.ws.rows
        empty: dict[Any, Row | None] = {}
        missing: dict[str, set[Any]] = {}
        for ev in events:
            for op in ev.ops:
                if op.key not in rows.get(op.table, empty):
                    missing.setdefault(op.table, set()).add(op.key)
                for table, key in op.reads:
                    if key not in rows.get(table, empty):
                        missing.setdefault(table, set()).add(key)
        for table, keys in missing.items():
            self._load(table, list(keys))

    def _load(self, table: str, keys: list[Any]) -> None:
        pk = self.key_of(table)
        cols = self.columns[table]
        select = f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(table)} WHERE {quote(pk)}"
        if len(keys) <= SMALL and _same_plain_kind(keys):  # a list parameter costs more than a few scalars
            rows = self.engine.con.execute(f"{select} IN ({', '.join('?' * len(keys))})", keys).fetchall()
        else:
            rows = self.engine.con.execute(f"{select} IN (SELECT unnest($keys))", {"keys": keys}).fetchall()
        found: dict[Any, dict[str, Any] | None] = dict.fromkeys(keys)
        pk_index = cols.index(pk)
        for r in rows:
            found[r[pk_index]] = dict(zip(cols, r, strict=True))
        self.ws.load(table, found)
        if len(rows) < len(found):
            self.ws.absent.setdefault(table, set()).update(k for k, row in found.items() if row is None)

    def write_back(self) -> int:
        """Writes the dirty rows, in as few and as cheap DuckDB statements as they allow. Returns the rows written.

        The general way is one INSERT OR REPLACE per table from a registered
        relation, as each statement's fixed cost (and an upsert's) dwarfs its
        per-row cost. Rows the table lacks (`WorkingSet.absent`) are plainly
        inserted, a third of an upsert; and a table with at most `SMALL` rows
        to write, all of plain Python values, writes them one parameterized
        statement each, which costs a fraction of registering a relation. Rows
        whose primary key column differs from their key take the general way.
        """
        ws = self.ws
        written = 0
        for table, keys in ws.dirty.items():
            if not keys:
                continue
            have = ws.rows[table]
            pk = self.keys.get(table)
            rows = [have[k] for k in keys]
            written += len(rows)
            if pk is None or not all(type(r) is dict and r.get(pk) == k for k, r in zip(keys, rows, strict=True)):
                self._write(table, "INSERT OR REPLACE", rows)
                ws.absent.pop(table, None)  # rows went under other keys: nothing is known missing any more
                continue
            absent = ws.absent.get(table)
            new = [have[k] for k in keys if k in absent] if absent else []
            old = [have[k] for k in keys if k not in absent] if new else rows
            if len(old) > SMALL and len(new) < SPLIT_WRITE_BACK:  # one upsert takes them all
                new, old = [], rows
            if new:
                self._insert(table, new)
            if old:
                self._replace(table, pk, old)
            if absent:
                absent.difference_update(keys)  # the table holds them all now
        ws.dirty.clear()
        return written

    def write_back_in(self, procedure: str | None) -> None:
        """`write_back` as the end of a TE: rows a constraint refuses abort it, as its own statement would."""
        try:
            self.write_back()
        except duckdb.Error as e:
            raise Aborted(f"procedure {procedure}: {type(e).__name__}: {e}") from None

    def _insert(self, table: str, rows: list[Row]) -> None:
        cols = self.columns[table]
        if len(rows) > SMALL or not _plain_rows(rows, cols):
            self._write(table, "INSERT", rows)
            return
        sql = f"INSERT INTO {quote(table)} ({', '.join(quote(c) for c in cols)}) VALUES ({', '.join('?' * len(cols))})"
        for r in rows:
            self.engine.con.execute(sql, [r.get(c) for c in cols])

    def _replace(self, table: str, pk: str, rows: list[Row]) -> None:
        """Rows of keys the table holds, or may hold: an UPDATE each that finds no row becomes an INSERT."""
        cols = self.columns[table]
        if len(rows) > SMALL or len(cols) < 2 or not _plain_rows(rows, cols):
            self._write(table, "INSERT OR REPLACE", rows)
            return
        rest = [c for c in cols if c != pk]
        sql = f"UPDATE {quote(table)} SET {', '.join(f'{quote(c)} = ?' for c in rest)} WHERE {quote(pk)} = ?"
        con = self.engine.con
        for r in rows:
            if con.execute(sql, [*(r.get(c) for c in rest), r[pk]]).fetchone()[0] == 0:
                self._insert(table, [r])

    def _write(self, table: str, verb: str, rows: list[Row | None]) -> None:
        cols = self.columns[table]
        data = pa.table({c: [r.get(c) for r in rows] for c in cols})
        name = f"__state__{table}"
        self.engine.con.register(name, data)
        collist = ", ".join(quote(c) for c in cols)
        self.engine.con.execute(f"{verb} INTO {quote(table)} ({collist}) SELECT {collist} FROM {name}")

    def barrier(self) -> None:
        """Before SQL that may read or write the tables: write back, then forget the working set."""
        if self.ws.rows:
            self.write_back()
            self.ws.clear()

    def flush(self) -> None:
        """Before a commit: the dirty rows and the buffered output tuples go to DuckDB.

        The working set stays, as a cache of current rows for the next
        intervals, except a table's rows once they exceed `CACHED_ROWS`: keys
        that are mostly new (a table of events, like the voter's `votes`)
        would otherwise hold every row ever written in memory.
        """
        self.write_back()
        for table in [t for t, rows in self.ws.rows.items() if len(rows) > CACHED_ROWS]:
            self.ws.forget(table)
        for stream, parts in self.pending_out.items():
            data = self._stored(stream, parts)
            name = f"__out__{stream}"
            self.engine.con.register(name, data)
            cols = ", ".join(quote(c) for c in data.column_names)
            self.engine.con.execute(f"INSERT INTO {STREAM_SCHEMA}.{quote(stream)} ({cols}) SELECT {cols} FROM {name}")
        self.pending_out.clear()

    def _stored(self, stream: str, parts: list[tuple[int, pa.Table | list[Values]]]) -> pa.Table:
        """A retained stream's buffered tuples, in order, with their batch ids: consecutive rows build at once."""
        tables: list[pa.Table] = []
        values: list[Values] = []
        batch_ids: list[int] = []
        for batch_id, part in parts:
            if isinstance(part, pa.Table):
                if values:
                    tables.append(self._stored_rows(stream, values, batch_ids))
                    values, batch_ids = [], []
                tables.append(part.append_column("batch_id", pa.array([batch_id] * part.num_rows, pa.int64())))
            else:
                values += part
                batch_ids += [batch_id] * len(part)
        if values:
            tables.append(self._stored_rows(stream, values, batch_ids))
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def _stored_rows(self, stream: str, values: list[Values], batch_ids: list[int]) -> pa.Table:
        shape = self.shape(stream)
        assert shape is not None  # row values are buffered only for a stream with a shape
        return shape.stored(values, batch_ids)

    def discard(self) -> None:
        """Forgets the working set and buffered output (after a rollback)."""
        self.ws.clear()
        self.pending_out.clear()
