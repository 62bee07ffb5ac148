"""State access for state procedures: set-based load and write-back of a working set.

The executor decides when: `serial` loads, applies and writes back per TE;
`opchain` loads every key a punctuation interval declared with one query per
table, keeps the working set across the interval's TEs, and writes back once,
or earlier when a barrier TE (SQL) must see the state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamtx.errors import InvalidArgument
from streamtx.server.catalog.compile import STREAM_SCHEMA, quote
from streamtx.server.statetx import Event, WorkingSet

if TYPE_CHECKING:
    from streamtx.server.partition.engine import Engine


class StateStore:
    """The partition's working set and the two statements per table that move it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ws = WorkingSet()
        self.keys: dict[str, str] = {}  # table -> its one-column primary key
        self.columns: dict[str, list[str]] = {}
        self.pending_out: dict[str, list[tuple[int, pa.Table]]] = {}  # retained-stream tuples to store

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
        self.ws.clear()

    def key_of(self, table: str) -> str:
        key = self.keys.get(table)
        if key is None:
            if table not in self.engine.catalog.tables:
                raise InvalidArgument(f"state access to unknown table {table!r}")
            raise InvalidArgument(f"state access to table {table!r}: it needs a one-column PRIMARY KEY")
        return key

    def load_for(self, events: list[Event]) -> None:
        """Loads every key the events' operations touch and the working set lacks: one query per table."""
        wanted: dict[str, set[Any]] = {}
        for ev in events:
            for op in ev.ops:
                wanted.setdefault(op.table, set()).add(op.key)
                for table, key in op.reads:
                    wanted.setdefault(table, set()).add(key)
        for table, keys in wanted.items():
            missing = self.ws.missing(table, keys)
            if missing:
                self._load(table, missing)

    def _load(self, table: str, keys: list[Any]) -> None:
        pk = self.key_of(table)
        cols = self.columns[table]
        rows = self.engine.con.execute(
            f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(table)} "
            f"WHERE {quote(pk)} IN (SELECT unnest($keys))",
            {"keys": keys},
        ).fetchall()
        found: dict[Any, dict[str, Any] | None] = dict.fromkeys(keys)
        pk_index = cols.index(pk)
        for r in rows:
            found[r[pk_index]] = dict(zip(cols, r, strict=True))
        self.ws.load(table, found)

    def write_back(self) -> int:
        """Writes the dirty rows: one INSERT OR REPLACE per table. Returns the rows written."""
        written = 0
        for table, keys in self.ws.dirty.items():
            if not keys:
                continue
            cols = self.columns[table]
            rows = [self.ws.rows[table][k] for k in keys]
            data = pa.table({c: [r.get(c) for r in rows] for c in cols})
            name = f"__state__{table}"
            self.engine.con.register(name, data)
            collist = ", ".join(quote(c) for c in cols)
            self.engine.con.execute(f"INSERT OR REPLACE INTO {quote(table)} ({collist}) SELECT {collist} FROM {name}")
            written += len(rows)
        self.ws.dirty.clear()
        return written

    def barrier(self) -> None:
        """Before SQL that may read or write the tables: write back, then forget the working set."""
        if self.ws.rows:
            self.write_back()
            self.ws.clear()

    def flush(self) -> None:
        """Before a commit: the dirty rows and the buffered output tuples go to DuckDB."""
        self.write_back()
        for stream, parts in self.pending_out.items():
            tables = [t.append_column("batch_id", pa.array([b] * t.num_rows, pa.int64())) for b, t in parts]
            data = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
            name = f"__out__{stream}"
            self.engine.con.register(name, data)
            cols = ", ".join(quote(c) for c in data.column_names)
            self.engine.con.execute(f"INSERT INTO {STREAM_SCHEMA}.{quote(stream)} ({cols}) SELECT {cols} FROM {name}")
        self.pending_out.clear()

    def discard(self) -> None:
        """Forgets the working set and buffered output (after a rollback)."""
        self.ws.clear()
        self.pending_out.clear()
