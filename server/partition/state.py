"""State access for state procedures: set-based load and write-back of a working set.

The executor decides when: `serial` loads, applies and writes back per TE;
`opchain` loads every key a punctuation interval declared with one query per
table, keeps the working set across the interval's TEs, and writes back once,
or earlier when a barrier TE (SQL) must see the state.

Write-behind (opchain). An interval that commits leaves its written rows in
the working set, not in DuckDB, when each of them certainly fits its table
(`TableCheck`: exact Python types in range, NOT NULL, no other constraint
than the primary key); so do its dedup marks and the tuples it
stored on retained streams (`Pending`). The working set is then the current
state and DuckDB a copy that lags behind it; the command log, not DuckDB,
makes commits durable, so durability is unchanged. DuckDB is brought current
(`sync`, or `flush` inside a transaction) before anything else reads or
writes it: any SQL statement of a TE (`barrier`), every command that is not
a push or a coordinated TE's fragment or decision (calls, queries, stream
reads, checkpoints, status, deploys), recovery records other than pushes,
the isolated path, and whenever more than `DEFER_MAX` rows and outputs
wait. A coordinated TE runs over the working set and commits as an interval
does: at one batch per command, writing everything back each time would cost
more than the TE. A row that might not fit is written at its interval's
commit, as before, so a constraint it breaks still aborts that interval.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import duckdb
import pyarrow as pa

from streamtx.errors import Aborted, Internal, InvalidArgument
from streamtx.procedure import Event, Row
from streamtx.server.catalog.compile import STREAM_SCHEMA, SYSTEM_SCHEMA, TS_COLUMN, quote
from streamtx.server.ipc import split_runs
from streamtx.server.partition.binned import BinnedKeys
from streamtx.server.partition.marks import Mark, Taken
from streamtx.server.partition.opchain import WorkingSet, apply_event
from streamtx.server.partition.ports import Parts
from streamtx.server.partition.ranked import Ranked, RowFn
from streamtx.server.partition.views import Follower
from streamtx.server.tuples import INT_RANGES, Kind, RowShape, Values, fits_kind, kind_of

if TYPE_CHECKING:
    from streamtx.server.partition.windows import Groups, Windows


class Host(Parts, Protocol):
    """The partition as its working set sees it: the windows it syncs with, and transactions (`sync`)."""

    windows: Windows

    def begin(self) -> None: ...
    def commit(self, hold_back: bool = False) -> None: ...
    def rollback(self) -> None: ...


_SQL_INT_RANGES = {
    "TINYINT": INT_RANGES[pa.int8()],
    "SMALLINT": INT_RANGES[pa.int16()],
    "INTEGER": INT_RANGES[pa.int32()],
    "BIGINT": INT_RANGES[pa.int64()],
    "UTINYINT": INT_RANGES[pa.uint8()],
    "USMALLINT": INT_RANGES[pa.uint16()],
    "UINTEGER": INT_RANGES[pa.uint32()],
    "UBIGINT": (0, 2**64 - 1),
}

CACHED_ROWS = 100_000  # rows of one table the working set keeps across intervals
INDEX_AFTER = 64  # keys of a table looked up in DuckDB before its keys are held in memory (`KeyIndex`)
SMALL = 4  # rows (or keys) few enough for one parameterized statement each, rather than a registered relation
SPLIT_WRITE_BACK = 64  # new rows of a table that pay for a separate INSERT beside its upsert
DEFER_MAX = 20_000  # dirty rows and retained output parts held back from DuckDB, at most (write-behind)
TAKEN_HISTORY = 100_000  # batch ids per producer's stream whose timestamps stay known (a re-send's ack)


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


def _same_in_python(t: pa.DataType) -> bool:
    """Whether Arrow gives a value of type `t` as DuckDB would (an integer, float, string or bool)."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_boolean(t)


def _same_plain_kind(keys: list[Any]) -> bool:
    """Keys all ints or all strs, plain: bound one by one they compare as the list parameter's would."""
    kinds = {type(k) for k in keys}
    return (kinds == {str} or kinds == {int}) and all(_plain(k) for k in keys)


class KeyIndex:
    """The keys each table may hold in DuckDB, a superset: a key outside it is certainly not there, no query.

    Keys that are mostly new (the voter's votes, phones) would otherwise cost
    a DuckDB lookup each, dearer as the table grows. A table's set is read
    with one scan of its key columns once `INDEX_AFTER` keys of it were looked
    up since DuckDB's own SQL last wrote it (so a table that SQL keeps writing
    is never scanned for it); every write-back adds its keys; a delete
    removes none, so the set stays a superset whatever commits or rolls back.
    SQL that may write a table drops its set (`StateStore.barrier`), and a
    rollback drops all (a set read inside the transaction may lack a deleted
    row the rollback brings back). Only keys of the column's own Python type
    are judged by it (an int for an integer key, a str for a string key), as
    DuckDB would cast any other before comparing. A migration's keys by bin
    (`binned`, partition/binned.py) follow the same rules.
    """

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[type, ...]] = {}  # table -> its key columns' Python types (indexable tables)
        self.keys: dict[str, set[Any]] = {}
        self.looked_up: dict[str, int] = {}
        self.binned: dict[str, BinnedKeys] = {}

    def reset(self, kinds: dict[str, tuple[type, ...]]) -> None:
        self.kinds = kinds
        self.keys = {}
        self.looked_up = {}
        self.binned = {}

    def forget(self, tables: Iterable[str] | None = None) -> None:
        """DuckDB's SQL may write `tables` (None: any): their sets no longer hold."""
        if tables is None:
            self.keys = {}
            self.looked_up = {}
            self.binned = {}
            return
        for t in tables:
            self.keys.pop(t, None)
            self.looked_up.pop(t, None)
            self.binned.pop(t, None)

    def add(self, table: str, keys: Iterable[Any]) -> None:
        binned = self.binned.get(table)
        if binned is not None:
            if binned.stale:
                del self.binned[table]
            else:
                keys = list(keys)
                binned.pending.update(keys)
        held = self.keys.get(table)
        if held is not None:
            held.update(keys)

    def judged(self, table: str, key: Any) -> bool:
        """Whether `key` is of the type the set holds (else DuckDB decides, casting it)."""
        kinds = self.kinds[table]
        if len(kinds) == 1:
            return type(key) is kinds[0]
        if type(key) is not tuple or len(key) != len(kinds):
            return False
        return all(type(k) is c for k, c in zip(key, kinds, strict=True))


class TableCheck:
    """Which rows a table certainly takes as they are: their write may wait (write-behind, module docstring).

    A row fits when it is a dict whose primary key (one column, or a tuple
    of several) equals its key and each
    column's value is None (where NULL is allowed) or exactly of the
    column's Python type and in its range: int for integer columns, str,
    bool, float for DOUBLE, a list of such for `T[]`. A table with a CHECK,
    UNIQUE or FOREIGN KEY constraint (either end), a generated column, or a
    column of any other type has no check: its rows are written at once.
    """

    def __init__(self, pk: tuple[str, ...], columns: list[tuple[str, Kind, bool, bool]]) -> None:
        self.pk = pk
        self.columns = columns  # (name, kind, is a list, nullable)

    @classmethod
    def of(cls, pk: tuple[str, ...], schema: pa.Schema, not_null: set[str]) -> TableCheck | None:
        """From the table's Arrow schema and its NOT NULL columns; None if some column has no exact check."""
        columns = []
        for field in schema:
            listed = pa.types.is_list(field.type)
            kind = kind_of(field.type.value_type if listed else field.type)
            if kind is None:
                return None
            columns.append((field.name, kind, listed, field.name not in not_null))
        return cls(pk, columns)

    def fits(self, key: Any, row: Row | None) -> bool:
        if type(row) is not dict:
            return False
        pk = self.pk
        if (row.get(pk[0]) if len(pk) == 1 else tuple(row.get(c) for c in pk)) != key:
            return False
        for name, kind, listed, nullable in self.columns:
            v = row.get(name)
            if v is None:
                if not nullable:
                    return False
            elif listed:
                if type(v) is not list or not all(x is None or fits_kind(x, kind) for x in v):
                    return False
            elif not fits_kind(v, kind):
                return False
        return True


@dataclasses.dataclass
class Pending:
    """What committed work left for DuckDB besides dirty rows: retained outputs, dedup marks, trims."""

    out: dict[str, list[tuple[int, pa.Table | list[Values]]]] = dataclasses.field(default_factory=dict)
    marks: dict[Mark, tuple[int, int]] = dataclasses.field(default_factory=dict)  # -> (batch id, ts)
    taken: list[Taken] = dataclasses.field(default_factory=list)  # every batch the marks moved past, in order
    trims: dict[str, int] = dataclasses.field(default_factory=dict)  # stream -> delete its stored batches up to this id

    def __bool__(self) -> bool:
        return bool(self.out or self.marks or self.trims)


def table_rows(table: pa.Table) -> list[Row]:
    """`table.to_pylist()`, its chunks joined first when there are many.

    pyarrow converts a chunk per call: a table concatenated from an
    interval's 1-row batches would pay that call for every row (5.6 µs a row
    for 128 chunks of the voter's votes, 1.4 µs joined first; pyarrow 26).
    """
    if table.num_columns and table.column(0).num_chunks > 4:
        table = table.combine_chunks()
    return table.to_pylist()


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

    def __init__(self, engine: Host) -> None:
        self.engine = engine
        self.ws = WorkingSet()
        self.keys: dict[str, str] = {}  # table -> its one-column primary key
        self.key_columns: dict[str, tuple[str, ...]] = {}  # table -> its primary key columns (compiled SQL)
        self.columns: dict[str, list[str]] = {}
        self.int_columns: dict[str, list[tuple[str, str]]] = {}  # table -> its integer columns and their SQL types
        self.checks: dict[str, TableCheck] = {}  # tables whose rows may wait in the working set
        self.index = KeyIndex()
        # retained-stream tuples (tables, or row values of the stream's shape), marks and trims not yet in DuckDB
        self.pending = Pending()
        self._shapes: dict[str, RowShape | None] = {}
        self._begun: tuple[Pending, dict[str, int], dict[Mark, tuple[int, int]], int, dict[str, int]] | None = None
        self._taken_since_trim = 0
        self.views_on: dict[str, list[Follower]] = {}  # table -> its views (partition/views.py)
        self.ranked: dict[str, Ranked] = {}  # compiled top-K statements' rankings, by the key they name

    def refresh_schema(self) -> None:
        """Reads primary keys and columns of the tables (after a deploy)."""
        con = self.engine.con
        self.keys = {}
        self.key_columns = {}
        for table, cols in con.execute(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type = 'PRIMARY KEY' AND schema_name = 'main'"
        ).fetchall():
            self.key_columns[table] = tuple(cols)
            if len(cols) == 1:
                self.keys[table] = cols[0]
        self.columns = {t: list(cols) for t, cols in self.engine.catalog.table_columns.items()}
        constrained = {
            t
            for kind, t, referenced in con.execute(
                "SELECT constraint_type, table_name, referenced_table FROM duckdb_constraints() "
                "WHERE schema_name = 'main' AND constraint_type IN ('CHECK', 'UNIQUE', 'FOREIGN KEY')"
            ).fetchall()
            for t in (t, referenced)
            if t is not None
        }
        not_null: dict[str, set[str]] = {}
        self.int_columns = {}
        for t, name, nullable, generated, sql_type in con.execute(
            "SELECT table_name, column_name, is_nullable, is_generated, data_type FROM duckdb_columns() "
            "WHERE schema_name = 'main' AND NOT internal"
        ).fetchall():
            if generated:
                constrained.add(t)
            if not nullable:
                not_null.setdefault(t, set()).add(name)
            if sql_type in _SQL_INT_RANGES:
                self.int_columns.setdefault(t, []).append((name, sql_type))
        self.checks = {}
        kinds: dict[str, tuple[type, ...]] = {}
        for t, pk in self.key_columns.items():
            if t not in self.columns:
                continue
            schema = con.sql(f"SELECT * FROM {quote(t)} LIMIT 0").to_arrow_table().schema
            key_kinds = [kind_of(schema.field(c).type) for c in pk]
            if all(k is not None and k[0] in (int, str) for k in key_kinds):
                kinds[t] = tuple(k[0] for k in key_kinds)  # type: ignore[index]
            if t in constrained:
                continue
            check = TableCheck.of(pk, schema, not_null.get(t, set()))
            if check is not None:
                self.checks[t] = check
        self.index.reset(kinds)
        self._shapes = {}
        self.ranked = {}
        self.ws.clear()
        self.views_on = {t: [Follower(p) for p in plans] for t, plans in self.engine.catalog.views_on.items()}

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
            if table not in self.engine.catalog.readable:
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
        if table in self.index.kinds:
            keys = self._unindexed(table, keys)
            if not keys:
                return
        key_cols = self.key_columns.get(table)
        if key_cols is not None and len(key_cols) > 1:
            self._load_composite(table, key_cols, keys)
            return
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
        self._loaded(table, found, len(rows))

    def _unindexed(self, table: str, keys: list[Any]) -> list[Any]:
        """The keys DuckDB must be asked for; those the `KeyIndex` knows absent join the working set as None."""
        index = self.index
        held = index.keys.get(table)
        if held is None:
            index.looked_up[table] = index.looked_up.get(table, 0) + len(keys)
            if index.looked_up[table] < INDEX_AFTER:
                return keys
            held = index.keys[table] = self._read_keys(table)
        absent = [k for k in keys if k not in held and index.judged(table, k)]
        if not absent:
            return keys
        self._loaded(table, dict.fromkeys(absent), 0)
        gone = set(absent)
        return [k for k in keys if k not in gone]

    def _read_keys(self, table: str) -> set[Any]:
        cols = self.key_columns[table]
        data = self.engine.con.execute(
            f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(table)}"
        ).to_arrow_table()
        if len(cols) == 1:
            return set(data.column(0).to_pylist())
        return set(zip(*(c.to_pylist() for c in data.columns), strict=True))

    def _load_composite(self, table: str, key_cols: tuple[str, ...], keys: list[tuple[Any, ...]]) -> None:
        cols = self.columns[table]
        wanted = pa.table({c: [k[i] for k in keys] for i, c in enumerate(key_cols)})
        self.engine.con.register("__keys__", wanted)
        on = " AND ".join(f"t.{quote(c)} = k.{quote(c)}" for c in key_cols)
        rows = self.engine.con.execute(
            f"SELECT {', '.join('t.' + quote(c) for c in cols)} FROM {quote(table)} t JOIN __keys__ k ON {on}"
        ).fetchall()
        self.engine.con.unregister("__keys__")
        found: dict[Any, dict[str, Any] | None] = dict.fromkeys(keys)
        at = [cols.index(c) for c in key_cols]
        for r in rows:
            found[tuple(r[i] for i in at)] = dict(zip(cols, r, strict=True))
        self._loaded(table, found, len(rows))

    def _loaded(self, table: str, found: dict[Any, Row | None], present: int) -> None:
        """Rows read from DuckDB join the working set, without replacing what it holds (written, maybe dirty)."""
        have = self.ws.rows.setdefault(table, {})
        new = {k: r for k, r in found.items() if k not in have}
        self.ws.load(table, new)
        if present < len(found):
            self.ws.absent.setdefault(table, set()).update(k for k, row in new.items() if row is None)

    # -------------------------------------------------- compiled SQL (server/sqlc)
    def row(self, table: str, key: Any) -> Row | None:
        """A row by primary key (a tuple for a composite key), loaded from DuckDB if the working set lacks it."""
        try:
            return self.ws.rows[table][key]
        except KeyError:  # not held: loaded (one point query) unless the whole table is held
            if table in self.ws.complete:
                return None
            self._load(table, [key])
            return self.ws.rows[table][key]

    def rows(self, table: str, limit: int) -> Iterable[Row] | None:
        """Every row of `table`, once loaded whole (None: it holds more than `limit` rows)."""
        ws = self.ws
        if table not in ws.complete:
            con = self.engine.con
            n = con.execute(f"SELECT count(*) FROM {quote(table)}").fetchone()[0]
            if n > limit:
                return None
            cols = self.columns[table]
            key_cols = self.key_columns[table]
            at = [cols.index(c) for c in key_cols]
            rows = con.execute(f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(table)}").fetchall()
            found = {
                (r[at[0]] if len(at) == 1 else tuple(r[i] for i in at)): dict(zip(cols, r, strict=True)) for r in rows
            }
            have = ws.rows.setdefault(table, {})
            ws.load(table, {k: r for k, r in found.items() if k not in have})
            ws.complete.add(table)
        return list(filter(None, ws.rows[table].values()))  # a row is a dict of at least one column: never falsy

    def put(self, table: str, key: Any, row: Row | None) -> None:
        """Sets a row in the working set, and the views of its table with it."""
        views = self.views_on.get(table)
        if views is None:
            self.ws.write(table, key, row)
            return
        old = self.row(table, key)
        self.ws.write(table, key, row)
        for view in views:
            view.change(self, old, row)

    def apply_events(self, events: list[Event], procedure: str | None) -> None:
        """Applies state procedure events (opchain.apply_event) to the working set, moving the views they touch."""
        ws = self.ws
        views_on = self.views_on
        if not views_on:
            for ev in events:
                apply_event(ev, ws)
            return
        rows = ws.rows
        for ev in events:
            olds: dict[tuple[str, Any], Row | None] = {}
            for op in ev.ops:
                if op.kind == "read":
                    continue
                if op.table in self.engine.catalog.view_plans:
                    raise InvalidArgument(
                        f"procedure {procedure}: writes view {op.table!r}; a view follows its table, which is "
                        "what to write"
                    )
                if op.table in views_on:
                    olds.setdefault((op.table, op.key), rows[op.table][op.key])
            apply_event(ev, ws)
            if ev.rejected:
                continue
            for (table, key), old in olds.items():
                new = rows[table][key]
                for view in views_on[table]:
                    view.change(self, old, new)

    def refresh_views(self, writes: frozenset[str] | None) -> None:
        """After DuckDB ran a statement that may write `writes` (None: any table): their views, recomputed."""
        catalog = self.engine.catalog
        for name in catalog.views_of(writes):
            for sql in catalog.view_plans[name].refresh_sql():
                self.engine.con.execute(sql)

    def _with_views(self, writes: frozenset[str] | None) -> frozenset[str] | None:
        """`writes` and the views of those tables (a statement writing a table changes its views)."""
        if not writes or not self.views_on:
            return writes
        return writes | frozenset(self.engine.catalog.views_of(writes))

    def window(self, name: str) -> list[Row]:
        """The visible tuples of an in-memory window (server/partition/windows.py)."""
        return self.engine.windows.visible(name)

    def window_groups(
        self, name: str, key: str, tables: tuple[str, ...], part: Callable[[list[Row]], Groups]
    ) -> Groups:
        """`part` over the visible tuples of an in-memory window, kept up to date while `tables` stay unwritten."""
        return self.engine.windows.groups(name, key, self.ws.stamp(tables), part)

    def top_rows(
        self, key: str, table: str, looked_up: tuple[str, ...], row_fn: RowFn, k: int
    ) -> tuple[list[tuple[Any, ...]], list[list[int]]]:
        """The first `k` rows of a ranking over `table` (partition/ranked.py), kept up to date between calls
        naming the same `key` (equal for equal `row_fn`s)."""
        ranked = self.ranked.get(key)
        if ranked is None:
            ranked = self.ranked[key] = Ranked(table, looked_up, row_fn)
        return ranked.top(self, k)

    def load(self, table: str, keys: list[Any]) -> None:
        """Loads the keys the working set lacks (a punctuation interval's lookups, at once)."""
        if table in self.ws.complete:
            return
        have = self.ws.rows.get(table, {})
        missing = list(dict.fromkeys(k for k in keys if k not in have))
        if missing:
            self._load(table, missing)

    def write_back(self, tables: Iterable[str] | None = None) -> int:
        """Writes the dirty rows (of `tables`; all: None), in as few and as cheap DuckDB statements as they allow.

        Returns the rows written.

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
        chosen = None if tables is None else set(tables)
        for table, dirty in ws.dirty.items():
            if not dirty or (chosen is not None and table not in chosen):
                continue
            have = ws.rows[table]
            keys = [k for k in dirty if have[k] is not None]
            gone = [k for k in dirty if have[k] is None]
            if gone:
                self._delete(table, gone)
                ws.absent.setdefault(table, set()).update(gone)
                written += len(gone)
            if not keys:
                continue
            pk = self.keys.get(table)
            rows = [have[k] for k in keys]
            written += len(rows)
            if pk is None or not all(type(r) is dict and r.get(pk) == k for k, r in zip(keys, rows, strict=True)):
                self._write(table, "INSERT OR REPLACE", rows)
                ws.absent.pop(table, None)  # rows went under other keys: nothing is known missing any more
                if pk is not None or not self._keyed(table, keys, rows):
                    self.index.forget([table])
                else:
                    self.index.add(table, keys)
                continue
            self.index.add(table, keys)
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
        ws.written_back(chosen)
        return written

    def _keyed(self, table: str, keys: list[Any], rows: list[Row]) -> bool:
        """Whether each row's (composite) primary key equals the key it is held under."""
        cols = self.key_columns.get(table)
        if cols is None or len(cols) < 2:
            return False
        return all(type(r) is dict and tuple(r.get(c) for c in cols) == k for k, r in zip(keys, rows, strict=True))

    def write_back_in(self, procedure: str | None) -> None:
        """`write_back` as the end of a TE: rows a constraint refuses abort it, as its own statement would."""
        try:
            self.write_back()
        except duckdb.Error as e:  # without DuckDB's quote of the write-back statement: the server's, not the TE's
            message = self._out_of_range() or str(e).split("\n\nLINE ", 1)[0]
            raise Aborted(f"procedure {procedure}: {type(e).__name__}: {message}") from None

    def _out_of_range(self) -> str | None:
        """The first held integer an integer column cannot store, in the server's words.

        DuckDB names the cast it planned, which differs with the statement the
        write-back chose (an INSERT of a relation, an UPDATE with parameters):
        the same TE would abort with two reasons under two executors.
        """
        ws = self.ws
        for table, dirty in ws.dirty.items():
            ints = self.int_columns.get(table)
            if not ints:
                continue
            have = ws.rows[table]
            for key in dirty:
                row = have[key]
                if type(row) is not dict:
                    continue
                for column, sql_type in ints:
                    v = row.get(column)
                    lo, hi = _SQL_INT_RANGES[sql_type]
                    if type(v) is int and not lo <= v <= hi:
                        return f"value {v} of {table}.{column} is out of range for {sql_type}"
        return None

    def _delete(self, table: str, keys: list[Any]) -> None:
        """Rows deleted in the working set (a compiled DELETE), deleted in DuckDB: one statement."""
        key_cols = self.key_columns[table]
        gone = pa.table({c: [k if len(key_cols) == 1 else k[i] for k in keys] for i, c in enumerate(key_cols)})
        name = f"__gone__{table}"
        self.engine.con.register(name, gone)
        on = " AND ".join(f"{quote(table)}.{quote(c)} = {name}.{quote(c)}" for c in key_cols)
        self.engine.con.execute(f"DELETE FROM {quote(table)} USING {name} WHERE {on}")
        self.engine.con.unregister(name)

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

    def barrier(self, writes: frozenset[str] | None = None, keep_index: bool = False) -> None:
        """Before SQL that may read or write the tables: write everything back, then forget what it may change.

        `writes` names the tables the statement may write (None: any); the
        rows held of the others stay valid, as DuckDB holds them too.
        `keep_index`: the statements only delete rows, or insert rows whose
        keys the caller adds (`index_keys`): the key sets stay supersets.
        """
        writes = self._with_views(writes)
        if not keep_index and (writes is None or writes):
            self.index.forget(writes)
        if self.ws.rows or self.pending or self.engine.windows.dirty():
            self.flush()
        # even with nothing held: rows loaded after the statement must not land in the containers a
        # rollback returns to (they may hold the statement's writes, which the rollback undoes in DuckDB)
        if writes is None:
            self.ws.clear()
        elif writes:
            self.ws.drop(writes)

    def barrier_tables(self, tables: frozenset[str]) -> None:
        """Before SQL that reads and writes only `tables` (a migration step): their rows are written and
        stay held, and the rest stays held back (a full flush writes every mark, stored tuple and other
        table's row, which cost a step more than its own rows). The step then says which rows left and
        came (`moved_out`, `moved_in`): dropping the tables instead would leave one point query per key
        for every key touched after, as a table held whole would no longer be."""
        if self._with_views(tables) != tables:  # a view's refresh may read other tables: all go
            self.barrier(tables, keep_index=True)
            return
        self.write_back(tables)

    def moved_out(self, table: str, rows: pa.Table) -> None:
        """SQL deleted these rows of `table` (after `barrier_tables`)."""
        self.ws.remove(table, self._keys(table, rows) if table in self.ws.rows else ())

    def moved_in(self, table: str, rows: pa.Table) -> None:
        """SQL inserted these rows into `table` (after `barrier_tables`): the table's key set takes their
        keys (`index_keys`) and the working set holds them, so the keys that came need no point query each
        when next touched (while the table's held rows stay within `CACHED_ROWS`; past it they are
        forgotten, to load again)."""
        self.index_keys(table, rows)
        ws = self.ws
        cols, key_cols = self.columns.get(table), self.key_columns.get(table)
        if cols is None or key_cols is None or not set(cols) <= set(rows.column_names):
            ws.add(table, {}, hold=False)  # not a table the working set holds
            return
        keys = self._keys(table, rows)
        if len(ws.rows.get(table, ())) + len(keys) > CACHED_ROWS:
            ws.add(table, dict.fromkeys(keys), hold=False)
            return
        if all(_same_in_python(rows.schema.field(c).type) for c in cols):
            values = zip(*(rows.column(c).to_pylist() for c in cols), strict=True)
        else:  # as DuckDB gives them, which the rows it loads are
            self.engine.con.register("__moved_in__", rows)
            try:
                values = iter(
                    self.engine.con.execute(f"SELECT {', '.join(map(quote, cols))} FROM __moved_in__").fetchall()
                )
            finally:
                self.engine.con.unregister("__moved_in__")
        ws.add(table, {k: dict(zip(cols, v, strict=True)) for k, v in zip(keys, values, strict=True)})

    def _keys(self, table: str, rows: pa.Table) -> list[Any]:
        cols = self.key_columns[table]
        if len(cols) == 1:
            return rows.column(cols[0]).to_pylist()
        return list(zip(*(rows.column(c).to_pylist() for c in cols), strict=True))

    def index_keys(self, table: str, rows: pa.Table) -> None:
        """Rows with these keys were inserted by SQL: the table's key set and keys by bin (if held) take them."""
        cols = self.key_columns.get(table)
        if cols is None:
            return
        binned = self.index.binned.get(table)
        if binned is not None:  # as an array: a step may bring half a partition's keys
            binned.arrived.append(rows.column(cols[0]))
        held = self.index.keys.get(table)
        if held is None:
            return
        if len(cols) == 1:
            held.update(rows.column(cols[0]).to_pylist())
        else:
            held.update(zip(*(rows.column(c).to_pylist() for c in cols), strict=True))

    def flush(self) -> None:
        """Writes everything held back, inside the open transaction: dirty rows, retained outputs, trims, marks.

        The working set stays, as a cache of current rows for the next
        intervals (`committed` forgets a table's rows once they exceed
        `CACHED_ROWS`: keys that are mostly new, like the voter's `votes`,
        would otherwise keep every row ever written in memory).
        """
        self.write_back()
        self.engine.windows.sync()
        pending = self.pending
        if not pending:
            return
        self.pending = Pending()  # replaced, not emptied: a rollback returns to the one `begin` saw
        con = self.engine.con
        for stream, parts in pending.out.items():
            data = self._stored(stream, parts)
            name = f"__out__{stream}"
            con.register(name, data)
            cols = ", ".join(quote(c) for c in data.column_names)
            con.execute(f"INSERT INTO {STREAM_SCHEMA}.{quote(stream)} ({cols}) SELECT {cols} FROM {name}")
        for stream, cut in pending.trims.items():
            con.execute(f"DELETE FROM {STREAM_SCHEMA}.{quote(stream)} WHERE {TS_COLUMN} <= $b", {"b": cut})
        for (producer, stream), (batch_id, ts) in pending.marks.items():
            params = {"p": producer, "s": stream, "b": batch_id, "ts": ts}
            updated = con.execute(
                f"UPDATE {SYSTEM_SCHEMA}.producers SET last_batch_id = $b, last_ts = $ts "
                "WHERE producer_id = $p AND stream = $s",
                params,
            ).fetchone()
            if not updated or not updated[0]:
                con.execute(f"INSERT INTO {SYSTEM_SCHEMA}.producers VALUES ($p, $s, $b, $ts)", params)
        if pending.taken:
            self._write_taken(pending.taken)

    def _write_taken(self, taken: list[Taken]) -> None:
        """Each batch's timestamp, for its re-sends' acks; the latest `TAKEN_HISTORY` ids per producer's stream.

        Older rows are cut once as many rows as the history holds came in
        since the last cut, so the cut's scan is paid once per that many.
        """
        con = self.engine.con
        columns = list(zip(*taken, strict=True))
        data = pa.table(
            [pa.array(columns[0], pa.string()), pa.array(columns[1], pa.string())]
            + [pa.array(columns[2], pa.int64()), pa.array(columns[3], pa.int64())],
            names=["producer_id", "stream", "batch_id", "ts"],
        )
        con.register("__taken__", data)
        con.execute(f"INSERT INTO {SYSTEM_SCHEMA}.taken SELECT * FROM __taken__")
        con.unregister("__taken__")
        self._taken_since_trim += len(taken)
        if self._taken_since_trim > TAKEN_HISTORY:
            con.execute(
                f"DELETE FROM {SYSTEM_SCHEMA}.taken t USING {SYSTEM_SCHEMA}.producers p "
                "WHERE t.producer_id = p.producer_id AND t.stream = p.stream AND t.batch_id <= p.last_batch_id - $n",
                {"n": TAKEN_HISTORY},
            )
            self._taken_since_trim = 0

    def taken_ts(self, producer: str, stream: str, batch_id: int) -> int | None:
        """The timestamp of a batch taken here, if its record is held back or still kept in DuckDB."""
        for p, s, b, ts in reversed(self.pending.taken):
            if b == batch_id and p == producer and s == stream:
                return ts
        row = self.engine.con.execute(
            f"SELECT ts FROM {SYSTEM_SCHEMA}.taken WHERE producer_id = $p AND stream = $s AND batch_id = $b",
            {"p": producer, "s": stream, "b": batch_id},
        ).fetchone()
        return row[0] if row is not None else None

    def end_interval(self, since: int = 0) -> None:
        """An opchain interval's commit: what certainly fits stays held back; the rest is written now.

        Only the rows this interval wrote are checked (the others were when
        their own interval committed); `since`: only those written after that
        many writes of the open transaction (a flow checks each step's own,
        not all its steps' again). Past `DEFER_MAX` held-back rows and
        outputs, or with a table cached beyond `CACHED_ROWS`, everything is
        written, so memory stays bounded.
        """
        ws = self.ws
        assert ws.undo is not None, "end_interval outside a transaction"
        held = sum(map(len, ws.dirty.values())) + sum(map(len, self.pending.out.values())) + len(self.pending.taken)
        if held > DEFER_MAX or any(len(rows) > CACHED_ROWS for rows in ws.rows.values()):
            self.engine.counters["state_full_writes"] += 1
            self.flush()
            return
        table_of = {id(have): t for t, have in ws.rows.items()}
        written: dict[str, set[Any]] = {}
        for have, key, _, _ in ws.undo[since:] if since else ws.undo:
            table = table_of.get(id(have))
            if table is not None:
                keys = written.get(table)
                if keys is None:
                    written[table] = {key}
                else:
                    keys.add(key)
        now = set()
        for table, keys in written.items():
            dirty = ws.dirty.get(table)
            if not dirty:
                continue
            check = self.checks.get(table)
            have = ws.rows[table]
            if check is None or not all(check.fits(k, have[k]) for k in keys if k in dirty):
                now.add(table)
        if now:
            self.write_back(now)

    def held_back(self) -> bool:
        """Whether DuckDB lags behind: rows, outputs, marks or trims not written yet."""
        return bool(self.pending) or any(self.ws.dirty.values()) or self.engine.windows.dirty()

    def sync(self) -> None:
        """Brings DuckDB up to date, in a transaction of its own.

        Inside an open transaction (a coordinated command awaiting its
        decision) there is nothing to do: it began with DuckDB up to date and
        its own commit writes everything it holds.
        """
        if self.ws.undo is not None or not self.held_back():
            return
        eng = self.engine
        eng.begin()
        try:
            self.flush()
        except duckdb.Error as e:  # rows were checked to fit when held back: a bug, not the client's doing
            eng.rollback()
            raise Internal(f"partition {eng.partition}: writing held-back state to DuckDB failed: {e}") from None
        eng.commit()
        eng.counters["state_syncs"] += 1

    def add_marks(self, taken: list[Taken]) -> None:
        """Batches taken, in order: their marks and timestamps, stored with the next write."""
        marks = self.pending.marks
        for producer, stream, batch_id, ts in taken:
            marks[(producer, stream)] = (batch_id, ts)
        self.pending.taken += taken

    def trim(self, stream: str, cut: int) -> None:
        """A retained stream's batches up to `cut` go, after the outputs held back are stored."""
        self.pending.trims[stream] = cut

    # ------------------------------------------------------------ transactions
    def begin(self) -> None:
        """A DuckDB transaction began: from here on, every change can be taken back (`rollback`)."""
        self.ws.begin()
        self.engine.windows.begin()
        p = self.pending
        self._begun = (p, {s: len(parts) for s, parts in p.out.items()}, dict(p.marks), len(p.taken), dict(p.trims))

    def committed(self) -> None:
        """The transaction committed: its changes stay; tables cached beyond `CACHED_ROWS` are forgotten if clean."""
        self.ws.commit()
        self.engine.windows.committed()
        self._begun = None
        ws = self.ws
        for table in [t for t, rows in ws.rows.items() if len(rows) > CACHED_ROWS and not ws.dirty.get(t)]:
            ws.forget(table)

    def rollback(self) -> None:
        """The transaction rolled back: the working set and what was held back return to `begin`."""
        self.ws.rollback()
        self.index.forget()
        self.engine.windows.rolled_back()
        if self._begun is None:
            return
        pending, lengths, marks, taken, trims = self._begun
        for stream, parts in pending.out.items():
            del parts[lengths.get(stream, 0) :]
        pending.out = {s: parts for s, parts in pending.out.items() if parts}
        pending.marks = marks
        del pending.taken[taken:]
        pending.trims = trims
        self.pending = pending
        self._begun = None

    def _stored(self, stream: str, parts: list[tuple[int, pa.Table | list[Values]]]) -> pa.Table:
        """A retained stream's buffered tuples, in order, with their timestamps: consecutive rows build at once."""
        tables: list[pa.Table] = []
        values: list[Values] = []
        stamps: list[int] = []
        for ts, part in parts:
            if isinstance(part, pa.Table):
                if values:
                    tables.append(self._stored_rows(stream, values, stamps))
                    values, stamps = [], []
                tables.append(part.append_column(TS_COLUMN, pa.array([ts] * part.num_rows, pa.int64())))
            else:
                values += part
                stamps += [ts] * len(part)
        if values:
            tables.append(self._stored_rows(stream, values, stamps))
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def _stored_rows(self, stream: str, values: list[Values], stamps: list[int]) -> pa.Table:
        shape = self.shape(stream)
        assert shape is not None  # row values are buffered only for a stream with a shape
        return shape.stored(values, stamps)
