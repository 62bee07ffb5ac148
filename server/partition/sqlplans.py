"""The compiled form of each SQL statement this partition runs (server/sqlc), or why it runs in DuckDB.

A statement is compiled the first time it runs under a catalog, with the
facts DuckDB holds about the tables (column types, primary keys, NOT NULL,
constraints and defaults), and kept until the next deploy. A statement
outside the compiled subset is remembered with its reason, and runs in
DuckDB every time, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb

from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.compile import TS_PARAMS, Compiled
from streamtx.server.protocol import StatementPlan
from streamtx.server.sqlc import types as T
from streamtx.server.sqlc.errors import Unsupported
from streamtx.server.sqlc.query import Names, Relation
from streamtx.server.sqlc.statement import Statement, compile_statement


@dataclass(frozen=True)
class Choice:
    """How one statement runs: `compiled`, or in DuckDB for `reason`."""

    compiled: Statement | None
    reason: str = ""


class SqlPlans:
    """Compiled statements per (procedure or "trigger t", statement index), for the current catalog."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, enabled: bool = True, windows: Callable[[str], bool] | None = None
    ) -> None:
        self.con = con
        self.enabled = enabled
        self.windows = windows  # whether a window is held in memory (server/partition/windows.py)
        self.catalog = Catalog()
        self._choices: dict[tuple[str, int], Choice] = {}
        self._prefetch: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        self._relations: dict[str, Relation] | None = None

    def reset(self, catalog: Catalog) -> None:
        """After a deploy: every statement is compiled again, against the new tables."""
        self.catalog = catalog
        self._choices = {}
        self._prefetch = {}
        self._relations = None

    def choice(self, unit: str, index: int, compiled: Compiled) -> Choice:
        key = (unit, index)
        found = self._choices.get(key)
        if found is None:
            found = self._choices[key] = self._compile(unit, compiled)
        return found

    def explain(self, unit: str, statements: list[Compiled]) -> list[StatementPlan]:
        """How each statement of a procedure or trigger runs, compiling it now if it has not run yet."""
        out = []
        for i, compiled in enumerate(statements):
            choice = self.choice(unit, i, compiled)
            views = self.catalog.views_of(compiled.writes)
            if choice.compiled is not None:
                lines = [*choice.compiled.describe, *(f"  keeps view {v}" for v in views)]
                plan, reason = "\n".join(lines), choice.reason
            else:
                plan = ""
                reason = choice.reason + "".join(f"; then recomputes view {v} from its table" for v in views)
            out.append(StatementPlan(unit, i, compiled.source, choice.compiled is not None, plan, reason))
        return out

    def prefetch(self, procedure: str, statements: list[Compiled]) -> list[tuple[str, Callable[..., Any]]]:
        """The keys a procedure's compiled statements look up straight from its batch rows: (table, key fn)."""
        found = self._prefetch.get(procedure)
        if found is None:
            found = []
            for i, compiled in enumerate(statements):
                chosen = self.choice(procedure, i, compiled).compiled
                if chosen is not None:
                    found += chosen.prefetch
            self._prefetch[procedure] = found
        return found

    def _compile(self, unit: str, compiled: Compiled) -> Choice:
        if not self.enabled:
            return Choice(None, "the SQL compiler is off (--sql-compiler off)")
        if compiled.copies is not None:
            return Choice(None, "a copy of input columns: taken from the batch's Arrow table")
        try:
            names = self._names(unit)
            # only a call returns its results
            results = compiled.returns_rows and names.input_stream is None and not unit.startswith("trigger ")
            return Choice(compile_statement(compiled.source, names, results))
        except Unsupported as e:
            return Choice(None, str(e))
        except RecursionError:
            return Choice(None, "the statement nests too deep for the compiler")

    def _names(self, unit: str) -> Names:
        cat = self.catalog
        in_memory = self.windows or (lambda w: False)
        if unit.startswith("trigger "):
            trig = cat.triggers[unit[8:]]
            if trig.target_kind != "stream" and not in_memory(trig.target):
                raise Unsupported(f"trigger on RANGE window {trig.target!r}: RANGE windows are read in DuckDB")
            input_stream = trig.target if trig.target_kind == "stream" else None
            declared: list[tuple[str, str]] = []
        else:
            proc = cat.procedures[unit]
            input_stream, declared = proc.on_stream, list(proc.params)
        params = {name: T.parse_type(type_sql) for name, type_sql in declared}
        params.update(dict.fromkeys(TS_PARAMS, T.BIGINT))
        relations = dict(self._tables())
        unsupported = {}
        for name, w in cat.windows.items():
            if in_memory(name):
                stream = cat.streams[w.stream]
                cols = tuple((c, T.parse_type(t)) for c, t in stream.columns)
                relations[name] = Relation(name, cols, window=True)
            else:
                unsupported[name] = f"RANGE window {name!r} is read in DuckDB"
        return Names(relations, input_stream, params, unsupported)

    def _tables(self) -> dict[str, Relation]:
        if self._relations is not None:
            return self._relations
        con = self.con
        columns: dict[str, list[tuple[str, T.SqlType]]] = {}
        not_null: dict[str, list[str]] = {}
        refuse: dict[str, str] = {}
        for table, name, type_sql, default in con.execute(
            "SELECT table_name, column_name, data_type, column_default FROM duckdb_columns() "
            "WHERE schema_name = 'main' AND NOT internal ORDER BY table_name, column_index"
        ).fetchall():
            columns.setdefault(table, []).append((name, T.parse_type(type_sql)))
            if default is not None:
                refuse[table] = f"table {table!r} has column defaults: written in DuckDB"
        keys: dict[str, tuple[str, ...]] = {}
        for table, kind, cols in con.execute(
            "SELECT table_name, constraint_type, constraint_column_names FROM duckdb_constraints() "
            "WHERE schema_name = 'main' ORDER BY table_name, constraint_index"
        ).fetchall():
            if kind == "PRIMARY KEY":
                keys[table] = tuple(cols)
            elif kind == "NOT NULL":
                not_null.setdefault(table, []).append(cols[0])
            elif kind == "UNIQUE":
                refuse[table] = f"table {table!r} has UNIQUE constraints: written in DuckDB"
        out = {
            t: Relation(t, tuple(cols), keys.get(t, ()), False, tuple(not_null.get(t, ())), refuse.get(t, ""))
            for t, cols in columns.items()
            if t in self.catalog.readable
        }
        for s, stream in self.catalog.streams.items():
            out[s] = Relation(s, tuple((c, T.parse_type(t)) for c, t in stream.columns), (), True)
        self._relations = out
        return out
