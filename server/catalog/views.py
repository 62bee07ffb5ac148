"""Views kept up to date by every write to their table: `CREATE VIEW v AS SELECT k, count(*), sum(x) FROM t GROUP BY k`.

A view is stored as a table of one row per group, keyed by its GROUP BY
columns, that procedures read like any table (by key, compiled) and Query
reads like any table. Every write to its table changes the view in the same
transaction (partition/views.py): a compiled write or a state procedure's
adds its row's part to its group and takes back the old row's; a statement
run in DuckDB recomputes the view. So a view always equals its query.

What a view may compute is what can be kept exactly that way, as in VoltDB:
plain columns of the table to group by (NOT NULL, so each group has a key),
`count(*)` (required: it tells when a group has no row left), `count(col)`
and `sum(col)` of an integer NOT NULL column. No WHERE, join or other
aggregate: those are queries, answered by Query or a procedure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import duckdb
import sqlglot
from sqlglot import exp

from streamtx.errors import InvalidArgument
from streamtx.server import sqltree
from streamtx.server.catalog.compile import quote
from streamtx.server.catalog.defs import TableDef, ViewDef

_INTEGERS = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
)


@dataclass(frozen=True)
class Aggregate:
    column: str  # the view's column
    fn: str  # "count" or "sum"
    arg: str | None  # the table's column (None: count(*))


@dataclass(frozen=True)
class ViewPlan:
    """How one view follows its table: the view's key columns and aggregates, by the table's columns."""

    name: str
    table: str
    groups: tuple[tuple[str, str], ...]  # (view column, table column), in key order
    aggregates: tuple[Aggregate, ...]
    query: str  # the SELECT, in DuckDB's spelling

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.groups)

    def refresh_sql(self) -> list[str]:
        """Recomputes the view from its table (after a statement DuckDB ran may have written the table)."""
        return [f"DELETE FROM {quote(self.name)}", f"INSERT INTO {quote(self.name)} {self.query}"]


def _fail(view: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"deploy: view {view!r}: {message}")


def _shape(view: ViewDef) -> tuple[exp.Select, str, list[str], list[tuple[str, exp.Expression]]]:
    """(the parsed SELECT, its table, its GROUP BY columns, [(alias or "", expression)]), from its SQL alone.

    InvalidArgument names what is outside what a view keeps.
    """
    name = view.name
    try:
        tree = sqltree.parse(view.query)
    except sqlglot.errors.ParseError as e:
        raise _fail(name, f"SQL syntax error: {e.errors[0]['description'] if e.errors else e}") from None
    if not isinstance(tree, exp.Select):
        raise _fail(name, "a view is one SELECT ... FROM table GROUP BY columns")
    for arg, what in (
        ("joins", "a join"),
        ("where", "WHERE"),
        ("having", "HAVING"),
        ("order", "ORDER BY"),
        ("limit", "LIMIT"),
        ("offset", "OFFSET"),
        ("distinct", "DISTINCT"),
        ("with", "WITH"),
        ("qualify", "QUALIFY"),
    ):
        if tree.args.get(arg):
            raise _fail(name, f"{what} is not kept incrementally; a view is SELECT ... FROM table GROUP BY columns")
    source = tree.args.get("from_")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or table.db or not table.name:
        raise _fail(name, "a view reads one table: SELECT ... FROM table GROUP BY columns")
    outputs: list[tuple[str, exp.Expression]] = []
    for e in tree.expressions:
        inner = e.this if isinstance(e, exp.Alias) else e
        outputs.append((e.alias_or_name if isinstance(e, exp.Alias) else "", inner))
    group = tree.args.get("group")
    grouped = []
    for g in group.expressions if group is not None else []:
        if not isinstance(g, exp.Column) or g.table not in ("", table.name):
            raise _fail(name, f"GROUP BY {g.sql('duckdb')}: a view groups by columns of {table.name!r}")
        grouped.append(g.name)
    if not grouped:
        raise _fail(name, "a view needs GROUP BY columns: they are its key")
    shown = {inner.name for _, inner in outputs if isinstance(inner, exp.Column)}
    missing = [g for g in grouped if g not in shown]
    if missing:
        raise _fail(name, f"GROUP BY column {missing[0]!r} must be a column of the view too: it is part of its key")
    return tree, table.name, grouped, outputs


def source_table(view: ViewDef) -> str:
    """The table a view reads."""
    return _shape(view)[1]


def key_columns(view: ViewDef) -> tuple[str, ...]:
    """The view's columns that are its GROUP BY columns (its primary key), from its SQL alone."""
    _, _, grouped, outputs = _shape(view)
    return tuple(
        alias or inner.name for alias, inner in outputs if isinstance(inner, exp.Column) and inner.name in grouped
    )


def analyze(
    views: Mapping[str, ViewDef], tables: Mapping[str, TableDef], con: duckdb.DuckDBPyConnection
) -> dict[str, ViewPlan]:
    """Each view's plan, checked against its table as `con` (a scratch database of the catalog) holds it."""
    return {name: _analyze(views[name], tables, con) for name in sorted(views)}


def _analyze(view: ViewDef, tables: Mapping[str, TableDef], con: duckdb.DuckDBPyConnection) -> ViewPlan:
    name = view.name
    tree, table, grouped, outputs = _shape(view)
    if table not in tables:
        raise _fail(name, f"{table!r} is not a table (a view reads one table of the catalog)")
    types = {r[0]: r[1] for r in con.execute(f"DESCRIBE {quote(table)}").fetchall()}
    not_null = {
        c
        for (c,) in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' AND table_name = $t "
            "AND NOT is_nullable",
            {"t": table},
        ).fetchall()
    }
    described = [r[0] for r in con.execute(f"DESCRIBE {tree.sql('duckdb')}").fetchall()]
    groups: list[tuple[str, str]] = []
    aggregates: list[Aggregate] = []
    for column, (_, inner) in zip(described, outputs, strict=True):
        if isinstance(inner, exp.Column):
            if inner.name not in grouped:
                raise _fail(name, f"column {inner.name!r} is neither grouped nor aggregated")
            if inner.name not in types:
                raise _fail(name, f"table {table!r} has no column {inner.name!r}")
            if inner.name not in not_null:
                raise _fail(name, f"GROUP BY column {inner.name!r} may be NULL; declare it NOT NULL in {table!r}")
            groups.append((column, inner.name))
            continue
        aggregates.append(_aggregate(name, table, column, inner, types, not_null))
    if len(set(described)) < len(described):
        raise _fail(name, "two columns have one name; name them with AS")
    if not any(a.fn == "count" and a.arg is None for a in aggregates):
        raise _fail(name, "a view needs a count(*) column: it tells when a group has no row left")
    part = tables[table].partition_by
    if part is not None and part not in {t for _, t in groups}:
        raise _fail(
            name,
            f"table {table!r} is PARTITION BY ({part}): the view must group by {part!r} too, so each "
            "group lives on one partition",
        )
    return ViewPlan(name, table, tuple(groups), tuple(aggregates), tree.sql("duckdb"))


def _aggregate(
    view: str, table: str, column: str, e: exp.Expression, types: dict[str, str], not_null: set[str]
) -> Aggregate:
    supported = "count(*), count(column) and sum(column) of an integer NOT NULL column"
    if isinstance(e, exp.Count):
        arg = e.this
        if isinstance(arg, exp.Star) or arg is None:
            return Aggregate(column, "count", None)
        if isinstance(arg, exp.Column) and arg.table in ("", table) and arg.name in types:
            return Aggregate(column, "count", arg.name)
        raise _fail(view, f"{e.sql('duckdb')}: a view keeps {supported}")
    if isinstance(e, exp.Sum) and isinstance(e.this, exp.Column) and e.this.table in ("", table):
        col = e.this.name
        if col not in types:
            raise _fail(view, f"table {table!r} has no column {col!r}")
        if types[col] not in _INTEGERS:
            raise _fail(view, f"sum({col}) of a {types[col]} column: a view keeps sums of integer columns only")
        if col not in not_null:
            raise _fail(
                view,
                f"sum({col}): {col!r} may be NULL (the sum of a group of NULLs is NULL, which a view cannot "
                f"keep); declare it NOT NULL in {table!r}",
            )
        return Aggregate(column, "sum", col)
    raise _fail(view, f"{e.sql('duckdb')}: a view keeps {supported}")


def as_tables(plans: Mapping[str, ViewPlan], tables: Mapping[str, TableDef]) -> dict[str, TableDef]:
    """Each view as the table it is to readers: placed as its table is, partitioned by the same column."""
    out = {}
    for name, plan in plans.items():
        base = tables[plan.table]
        part = None
        if base.partition_by is not None:
            part = next(v for v, t in plan.groups if t == base.partition_by)
        out[name] = TableDef(name, "", part, base.replicated)
    return out
