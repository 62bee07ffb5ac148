"""Compiles the SQL of procedures and triggers into what a partition executes.

Users write against logical names: inside a procedure `ON STREAM s`, `s` is the
atomic batch being processed; `INSERT INTO t` on a stream `t` emits tuples on
it. Partitions store streams physically (schema `streams`, with a `__ts`
column: the timestamp of the TE that emitted the tuple). Compilation rewrites
each statement once, at deploy time, so that no statement is parsed or
rewritten on the hot path:

- a read of the input stream `s` reads `__batch__s`, the Arrow relation the
  engine binds for the TE (server/partition/relations.py);
- `INSERT INTO t ...` on a stream becomes a SELECT of the emitted tuples:
  the engine hands them to t's EE triggers and to the TEs t feeds, in the same
  transaction, so they are never stored; only a stream nothing consumes
  (an output stream, read by Subscribe) is stored, in `streams.t` with its
  batch id, by a plain INSERT;
- an emit that only copies columns of the input batch (`INSERT INTO t SELECT *
  FROM s`, or a list of its columns; no WHERE, DISTINCT, join, or
  expression) also names them in `copies`: the engine then takes them from
  the batch's Arrow table, as DuckDB would, without a statement (a dataflow
  step that moves batches on costs no SQL);
- every other name must be a table, an owned window, or a CTE.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp
from sqlglot.errors import ParseError

from streamtx.errors import InvalidArgument
from streamtx.server import sqltree

TS_PARAM = "ts"  # `$ts`: the global timestamp of the running TE (its batch's, or its call's)
TS_PARAMS = frozenset({TS_PARAM, "batch_id"})  # `$batch_id`: the older name of `$ts`, still accepted
STREAM_SCHEMA = "streams"
TS_COLUMN = "__ts"  # a stored tuple's timestamp, in `streams.*`, `windows.*` and the stream views
TS_COLUMN_BEFORE = "batch_id"  # its name in command logs of format 0 and 1 and in their checkpoints
SYSTEM_COLUMNS = (TS_COLUMN, "__seq", "__staged")  # no stream may name a column so (window tables add the other two)
WINDOW_SCHEMA = "windows"
SYSTEM_SCHEMA = "streamtx"


def batch_relation(stream: str) -> str:
    """The name under which a TE's input batch of `stream` is registered."""
    return f"__batch__{stream}"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Compiled:
    """One executable statement.

    `emits` names the stream the statement inserts into (its result rows are the
    emitted tuples, or for a retained stream the count of stored ones),
    `params` the `$name` parameters it binds, `returns_rows` whether it yields
    a result table for an OLTP caller. `copies`, for an emit that only copies
    input columns: the input column each of the emitted stream's columns is.
    """

    sql: str
    params: tuple[str, ...]
    emits: str | None
    returns_rows: bool
    source: str
    copies: tuple[str, ...] | None = None
    writes: frozenset[str] | None = frozenset()
    """The user tables it may write (None: it cannot be told): what the working set must forget after it."""


@dataclass(frozen=True)
class Scope:
    """What a statement may name: the catalog as seen by one procedure or trigger."""

    owner: str  # "procedure p" / "trigger t", for messages
    tables: frozenset[str]
    streams: dict[str, tuple[str, ...]]  # stream -> its column names
    windows: dict[str, str]  # window -> owning procedure (or "" if none yet)
    input_stream: str | None  # the stream whose batch this code reads
    owned_windows: frozenset[str]
    params: frozenset[str]
    retained: frozenset[str] = frozenset()  # streams nothing consumes: stored for subscribers
    param_types: tuple[tuple[str, str], ...] = ()  # declared (name, DuckDB type) of $params
    views: frozenset[str] = frozenset()  # readable like tables, written only by the server (catalog/views.py)


def compile_statement(sql: str, scope: Scope, line: int = 0) -> Compiled:
    """Rewrites one statement for `scope`; InvalidArgument names what is wrong."""
    where = f"{scope.owner}" + (f" (line {line})" if line else "")
    try:
        tree = sqltree.parse(sql, where)
    except ParseError as e:
        raise InvalidArgument(f"{where}: SQL syntax error: {_first_error(e)}: {sql!r}") from None
    if tree is None:
        raise InvalidArgument(f"{where}: empty statement")
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    target = _insert_target(tree)
    if isinstance(tree, exp.Update | exp.Delete):
        _check_not_stream_write(tree, scope, where)

    for table in list(tree.find_all(exp.Table)):
        if table is target:
            continue
        name = table.name
        if table.db or not name:
            if table.db in (STREAM_SCHEMA, WINDOW_SCHEMA, SYSTEM_SCHEMA):
                raise InvalidArgument(f"{where}: schema {table.db!r} is internal to streamtx")
            continue
        if name in ctes:
            continue
        if name in scope.streams:
            if name != scope.input_stream:
                expected = (
                    f"its input stream is {scope.input_stream!r}"
                    if scope.input_stream
                    else "it has no input stream (no ON STREAM)"
                )
                raise InvalidArgument(
                    f"{where}: reads stream {name!r}, but {expected}; a stream is visible only "
                    "to the procedures and triggers it feeds"
                )
            alias = table.alias or name
            table.set("this", exp.to_identifier(batch_relation(name), quoted=True))
            table.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
            continue
        if name in scope.windows:
            if name not in scope.owned_windows:
                owner = scope.windows[name]
                raise InvalidArgument(
                    f"{where}: reads window {name!r}, which belongs to procedure {owner!r}; a "
                    "window is visible only to the procedure that owns it"
                )
            continue
        if name not in scope.tables and not isinstance(table.parent, exp.Schema | exp.Drop):
            raise InvalidArgument(f"{where}: unknown table {name!r}")

    params = sorted({p.name for p in tree.find_all(exp.Placeholder) if p.name})
    for p in tree.find_all(exp.Placeholder):
        if not p.name:
            raise InvalidArgument(f"{where}: positional parameter '?' is not supported; use $name")
    unknown = [p for p in params if p not in scope.params and p not in TS_PARAMS]
    if unknown:
        declared = ", ".join(sorted(scope.params)) or "none"
        raise InvalidArgument(f"{where}: unknown parameter ${unknown[0]} (declared parameters: {declared})")

    types = {**dict.fromkeys(TS_PARAMS, "BIGINT"), **dict(scope.param_types)}  # `$ts` is a BIGINT, whatever its value
    for p in list(tree.find_all(exp.Placeholder)):
        if p.name in types:  # a declared parameter has its declared type, whatever Python value comes
            p.replace(exp.Cast(this=p.copy(), to=exp.DataType.build(types[p.name], dialect="duckdb")))
    if target is not None and target.name in scope.streams and not target.db:
        return _compile_emit(tree, target, scope, where, tuple(params), sql)
    if target is not None and target.name in scope.windows and not target.db:
        raise InvalidArgument(
            f"{where}: inserts into window {target.name!r}; a window is fed from its stream, not by INSERT"
        )
    if isinstance(tree, exp.Insert):
        _check_not_stream_write(tree, scope, where)
    returns_rows = isinstance(tree, exp.Query) or bool(tree.args.get("returning"))
    writes = _written(tree)
    views = sorted((writes or frozenset()) & scope.views)
    if views:
        raise InvalidArgument(
            f"{where}: writes view {views[0]!r}; a view follows its table, which is what to write: {sql!r}"
        )
    return Compiled(tree.sql("duckdb"), tuple(params), None, returns_rows, sql, writes=writes)


def _written(tree: exp.Expression) -> frozenset[str] | None:
    """The tables a statement's INSERT, UPDATE or DELETE names (None: a statement of another kind writes)."""
    if not isinstance(tree, exp.Query | exp.Insert | exp.Update | exp.Delete):
        return None
    found: set[str] = set()
    for node in tree.walk():
        if isinstance(node, exp.Insert | exp.Update | exp.Delete):
            target = node.this.this if isinstance(node.this, exp.Schema) else node.this
            if not isinstance(target, exp.Table):
                return None
            found.add(target.name)
    return frozenset(found)


def _compile_emit(
    tree: exp.Expression,
    target: exp.Table,
    scope: Scope,
    where: str,
    params: tuple[str, ...],
    source: str,
) -> Compiled:
    stream = target.name
    columns = scope.streams[stream]
    schema = tree.this if isinstance(tree.this, exp.Schema) else None
    if schema is not None and schema.expressions:
        given = [c.name for c in schema.expressions]
        unknown = [c for c in given if c not in columns]
        if unknown:
            raise InvalidArgument(f"{where}: stream {stream!r} has no column {unknown[0]!r}")
        missing = [c for c in columns if c not in given]
        if missing:
            raise InvalidArgument(
                f"{where}: INSERT INTO stream {stream!r} must give every column; missing {', '.join(missing)}"
            )
    else:
        given = list(columns)
    if tree.args.get("returning") or tree.args.get("conflict") or tree.args.get("by_name"):
        raise InvalidArgument(f"{where}: INSERT INTO stream {stream!r} takes a plain VALUES or SELECT")
    query = tree.expression
    if query is None:
        raise InvalidArgument(f"{where}: INSERT INTO stream {stream!r} without rows")
    with_ = tree.args.get("with_") or tree.args.get("with")
    prefix = (with_.sql("duckdb") + " ") if with_ is not None else ""
    cols = ", ".join(quote(c) for c in given)
    n = len(given)
    aliased = ", ".join(f"__c{i}" for i in range(n))
    if stream not in scope.retained:
        renamed = ", ".join(f"__c{given.index(c)} AS {quote(c)}" for c in columns)
        sql = f"{prefix}SELECT {renamed} FROM ({query.sql('duckdb')}) AS __q({aliased})"
        copied = None if with_ is not None else _copied_columns(query, scope)
        copies = None
        if copied is not None and len(copied) == n:
            copies = tuple(copied[given.index(c)] for c in columns)
        return Compiled(sql, params, stream, False, source, copies)
    sql = (
        f"{prefix}INSERT INTO {STREAM_SCHEMA}.{quote(stream)} ({cols}, {TS_COLUMN}) "
        f"SELECT {aliased}, ${TS_PARAM} FROM ({query.sql('duckdb')}) AS __q({aliased})"
    )
    return Compiled(sql, tuple(sorted(set(params) | {TS_PARAM})), stream, False, source)


def _copied_columns(query: exp.Expression, scope: Scope) -> list[str] | None:
    """The input columns a `SELECT` copies, in its order; None if it does anything else."""
    if not isinstance(query, exp.Select) or scope.input_stream is None:
        return None
    if any(v for k, v in query.args.items() if k not in ("expressions", "from_")):
        return None
    source = query.args.get("from_")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or table.name != batch_relation(scope.input_stream) or table.db:
        return None
    names = scope.streams[scope.input_stream]
    alias = table.alias_or_name
    copied: list[str] = []
    for e in query.expressions:
        e = e.this if isinstance(e, exp.Alias) else e
        if isinstance(e, exp.Star):
            copied += names
        elif isinstance(e, exp.Column) and isinstance(e.this, exp.Identifier) and e.name in names:
            if e.table not in ("", alias) or e.args.get("db"):
                return None
            copied.append(e.name)
        else:
            return None
    return copied


def _insert_target(tree: exp.Expression) -> exp.Table | None:
    if not isinstance(tree, exp.Insert):
        return None
    this = tree.this
    if isinstance(this, exp.Schema):
        this = this.this
    return this if isinstance(this, exp.Table) else None


def _check_not_stream_write(tree: exp.Expression, scope: Scope, where: str) -> None:
    target = tree.this
    if isinstance(target, exp.Schema):
        target = target.this
    if isinstance(target, exp.Table) and target.name in scope.streams and not target.db:
        raise InvalidArgument(
            f"{where}: {tree.key.upper()} on stream {target.name!r}; streams are append-only (INSERT only)"
        )


def _first_error(e: ParseError) -> str:
    if e.errors:
        err = e.errors[0]
        return f"{err.get('description')} at line {err.get('line')}, column {err.get('col')}"
    return str(e)


def referenced_names(sql: str) -> set[str]:
    """Unqualified table names a statement mentions (used for graph edges and checks)."""
    try:
        tree = sqltree.parse(sql)
    except ParseError:
        return set()
    return {t.name for t in tree.find_all(exp.Table) if not t.db}
