"""Physical DDL: the tables and views a partition's database holds for a catalog's relations.

A stream is stored in schema `streams` and a window in schema `windows`, each
with bookkeeping columns, behind a view under the user's name. A deploy sends
the partitions the diff between the old catalog's schema and the new one.
"""

from __future__ import annotations

import functools
import graphlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import sqlglot
from sqlglot import exp

from streamtx.errors import InvalidArgument
from streamtx.server import sqltree
from streamtx.server.catalog import views
from streamtx.server.catalog.compile import (
    STREAM_SCHEMA,
    SYSTEM_SCHEMA,
    TS_COLUMN,
    TS_COLUMN_BEFORE,
    WINDOW_SCHEMA,
    quote,
)
from streamtx.server.catalog.defs import Definition, IndexDef, StreamDef, TableDef, ViewDef, WindowDef

PHYSICAL_KINDS = ("index", "view", "window", "stream", "table")
"""In drop order; creates go in reverse (a view after its table, an index after what it indexes)."""


@dataclass(frozen=True)
class Relations:
    """The definitions that have a physical form."""

    tables: Mapping[str, TableDef]
    streams: Mapping[str, StreamDef]
    windows: Mapping[str, WindowDef]
    indexes: Mapping[str, IndexDef]
    views: Mapping[str, ViewDef]

    def of(self, kind: str) -> Mapping[str, Definition]:
        return {
            "table": self.tables,
            "stream": self.streams,
            "window": self.windows,
            "index": self.indexes,
            "view": self.views,
        }[kind]


@dataclass(frozen=True)
class PhysicalStatement:
    what: str
    sql: str


def create_statements(rel: Relations) -> list[PhysicalStatement]:
    """The DDL that builds the physical schema of `rel` in an empty database."""
    out = [
        PhysicalStatement("system", f"CREATE SCHEMA IF NOT EXISTS {STREAM_SCHEMA}"),
        PhysicalStatement("system", f"CREATE SCHEMA IF NOT EXISTS {WINDOW_SCHEMA}"),
        PhysicalStatement("system", f"CREATE SCHEMA IF NOT EXISTS {SYSTEM_SCHEMA}"),
    ]
    for name in table_order(rel.tables):
        out += _create_object(rel, "table", name)
    for name in sorted(rel.streams):
        out += _create_object(rel, "stream", name)
    for name in sorted(rel.windows):
        out += _create_object(rel, "window", name)
    for name in sorted(rel.views):
        out += _create_object(rel, "view", name)
    for name in sorted(rel.indexes):
        out += _create_object(rel, "index", name)
    return out


def diff(old: Relations, new: Relations, dropped: set[tuple[str, str]] = frozenset()) -> list[str]:
    """DDL that turns `old`'s physical schema into `new`'s (drops first, then creates).

    An object that changed, or was dropped and created again by the deploy, is
    rebuilt empty; an object the deploy did not touch keeps its data. A view
    is rebuilt, from its table, with its table.
    """

    def changed(kind: str, name: str, before: Mapping, after: Mapping) -> bool:
        if (kind, name) in dropped or asdict(after[name]) != asdict(before[name]):
            return True
        if kind == "view":
            table = view_table(after[name])
            return table is not None and table in old.tables and changed("table", table, old.tables, new.tables)
        return False

    def order(rel: Relations, kind: str) -> list[str]:
        return table_order(rel.tables) if kind == "table" else sorted(rel.of(kind))

    out: list[str] = []
    for kind in PHYSICAL_KINDS:
        before, after = old.of(kind), new.of(kind)
        for name in reversed(order(old, kind)):
            if name not in after or changed(kind, name, before, after):
                out += _drop_object(kind, name)
    for kind in reversed(PHYSICAL_KINDS):
        before, after = old.of(kind), new.of(kind)
        for name in order(new, kind):
            if name not in before or changed(kind, name, before, after):
                out += [s.sql for s in _create_object(new, kind, name)]
    return out


def current_ddl(statements: list[str]) -> list[str]:
    """`statements` (a logged deploy's DDL) with stored tuples' timestamp column named as it is now.

    Command logs of format 0 and 1 name it `batch_id`, unquoted, in the
    CREATE TABLE of `streams.*` and `windows.*` and in each stream's view. A
    stream could not then have a column of that name, and user columns are
    always quoted, so only those generated names match.
    """
    tables = (f"CREATE TABLE {STREAM_SCHEMA}.", f"CREATE TABLE {WINDOW_SCHEMA}.")
    out = []
    for sql in statements:
        if sql.startswith(tables):
            sql = sql.replace(f", {TS_COLUMN_BEFORE} BIGINT NOT NULL", f", {TS_COLUMN} BIGINT NOT NULL", 1)
        elif sql.startswith("CREATE VIEW "):
            sql = sql.replace(f", {TS_COLUMN_BEFORE} FROM {STREAM_SCHEMA}.", f", {TS_COLUMN} FROM {STREAM_SCHEMA}.", 1)
        out.append(sql)
    return out


@functools.lru_cache(maxsize=1024)
def referenced_tables(table_sql: str) -> frozenset[str]:
    """Tables a CREATE TABLE's FOREIGN KEYs point at (catalog spelling: unquoted names lower-cased)."""
    try:
        tree = sqltree.parse(table_sql)
    except sqlglot.errors.ParseError:
        return frozenset()  # DuckDB itself reports the statement when the schema is built
    names = set()
    for ref in tree.find_all(exp.Reference):
        table = ref.find(exp.Table)
        if table is not None and isinstance(table.this, exp.Identifier):
            names.add(table.name if table.this.quoted else table.name.lower())
    return frozenset(names)


def table_order(tables: Mapping[str, TableDef]) -> list[str]:
    """Table names with every FOREIGN KEY's target before the table holding it, else by name.

    DuckDB creates a referencing table only after its target and drops it only
    before; creates follow this order, drops the reverse.
    """
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for name in sorted(tables):
        sorter.add(name, *sorted(referenced_tables(tables[name].sql) & tables.keys() - {name}))
    try:
        return list(sorter.static_order())
    except graphlib.CycleError as e:
        raise InvalidArgument(f"deploy: tables {', '.join(sorted(set(e.args[1])))} reference each other") from None


def _create_object(rel: Relations, kind: str, name: str) -> list[PhysicalStatement]:
    what = f"{kind} {name!r}"
    if kind == "table":
        return [PhysicalStatement(what, rel.tables[name].sql)]
    if kind == "stream":
        s = rel.streams[name]
        cols = ", ".join(f"{quote(c)} {t}" for c, t in s.columns)
        names = ", ".join(quote(c) for c, _ in s.columns)
        return [
            PhysicalStatement(
                what,
                f"CREATE TABLE {STREAM_SCHEMA}.{quote(name)} ({cols}, {TS_COLUMN} BIGINT NOT NULL)",
            ),
            PhysicalStatement(
                what,
                f"CREATE VIEW {quote(name)} AS SELECT {names}, {TS_COLUMN} FROM {STREAM_SCHEMA}.{quote(name)}",
            ),
        ]
    if kind == "window":
        w = rel.windows[name]
        s = rel.streams.get(w.stream)
        if s is None:
            raise InvalidArgument(f"deploy: window {name!r} is on unknown stream {w.stream!r}")
        cols = ", ".join(f"{quote(c)} {t}" for c, t in s.columns)
        names = ", ".join(quote(c) for c, _ in s.columns)
        return [
            PhysicalStatement(
                what,
                f"CREATE TABLE {WINDOW_SCHEMA}.{quote(name)} ({cols}, {TS_COLUMN} BIGINT NOT NULL, "
                "__seq BIGINT NOT NULL, __staged BOOLEAN NOT NULL)",
            ),
            PhysicalStatement(
                what,
                f"CREATE VIEW {quote(name)} AS SELECT {names} FROM {WINDOW_SCHEMA}.{quote(name)} WHERE NOT __staged",
            ),
        ]
    if kind == "index":
        return [PhysicalStatement(what, rel.indexes[name].sql)]
    if kind == "view":  # a table of its groups, filled from its table (catalog/views.py)
        v = rel.views[name]
        keys = ", ".join(quote(c) for c in views.key_columns(v))
        return [
            PhysicalStatement(what, f"CREATE TABLE {quote(name)} AS {v.query}"),
            PhysicalStatement(what, f"ALTER TABLE {quote(name)} ADD PRIMARY KEY ({keys})"),
        ]
    return []


def view_table(view: ViewDef) -> str | None:
    """The table a view reads (None: its SQL does not say; the deploy refuses it)."""
    try:
        return views.source_table(view)
    except InvalidArgument:
        return None


def _drop_object(kind: str, name: str) -> list[str]:
    if kind in ("table", "view"):
        return [f"DROP TABLE {quote(name)}"]
    literal = "'" + name.replace("'", "''") + "'"
    if kind == "stream":  # a stream created again under this name starts with fresh dedup marks
        return [
            f"DROP VIEW {quote(name)}",
            f"DROP TABLE {STREAM_SCHEMA}.{quote(name)}",
            f"DELETE FROM {SYSTEM_SCHEMA}.producers WHERE stream = {literal}",
            f"DELETE FROM {SYSTEM_SCHEMA}.rejections WHERE stream = {literal}",
            f"DELETE FROM {SYSTEM_SCHEMA}.taken WHERE stream = {literal}",
        ]
    if kind == "window":
        return [
            f"DROP VIEW {quote(name)}",
            f"DROP TABLE {WINDOW_SCHEMA}.{quote(name)}",
            f"DELETE FROM {SYSTEM_SCHEMA}.window_ends WHERE window_name = {literal}",
        ]
    if kind == "index":
        return [f"DROP INDEX {quote(name)}"]
    return []
