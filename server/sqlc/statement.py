"""One SQL statement of a procedure or trigger, compiled: INSERT (into a table or a stream), UPDATE, DELETE, SELECT.

`compile_statement(sql, names)` returns a `Statement` or raises `Unsupported`
with the reason. Every statement first computes what it reads (a compiled
query, `query.py`), then applies its writes to the working set, so it reads
the state as it was before it, as in DuckDB, and a `Fallback` (a scan of a
large table) happens before it wrote anything.

Writes are DuckDB's: values are cast to the column's type as an INSERT casts
them; a NULL into a NOT NULL column, a duplicate primary key, or an ON
CONFLICT that would update one row twice are errors (the TE aborts), except
where DuckDB's own outcome is hard to state (several rows of one statement
with one key under OR REPLACE / DO NOTHING / DO UPDATE): that statement runs
in DuckDB. Tables with UNIQUE constraints besides their primary key, or
with column defaults, are written in DuckDB; CHECK and FOREIGN KEY
constraints are checked by DuckDB when the working set is written back
(a violation then aborts the TE that caused it, partition/dataflow.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sqlglot import exp

from streamtx.server import sqltree
from streamtx.server.sqlc import relational
from streamtx.server.sqlc.casts import bind_value, identity
from streamtx.server.sqlc.columns import arrow_type, caster
from streamtx.server.sqlc.ctx import Ctx, Fallback
from streamtx.server.sqlc.errors import SqlError, Unsupported
from streamtx.server.sqlc.expr import Code, compile_expr
from streamtx.server.sqlc.query import Names, Query, Relation, _Gen, batch_only, plan_query


@dataclass(frozen=True)
class Result:
    """What a statement did: rows for an OLTP caller, tuples emitted on a stream.

    Emitted tuples are values in the stream's column order, of its columns'
    types; `emitted_table` makes the Arrow table of them, which the partition
    skips where the rows can travel as they are.
    """

    rows: pa.Table | None = None
    emitted: list[tuple[Any, ...]] | None = None
    schema: pa.Schema | None = None

    def emitted_table(self) -> pa.Table:
        assert self.emitted is not None and self.schema is not None
        return _table(self.emitted, self.schema)


NOTHING = Result()
"""The result of a statement that returns and emits nothing (most of them): one object, not one per run."""


@dataclass
class Statement:
    """A compiled statement: `run(ctx)` does what DuckDB would; `describe` says how, for `explain`."""

    kind: str  # select | insert | emit | update | delete
    target: str | None
    run: Callable[[Ctx], Result]
    describe: list[str]
    source: str
    prefetch: list[tuple[str, Callable[[dict[str, Any]], Any]]] = field(default_factory=list)
    """(table, key of a batch row): the rows it will look up, loaded for a whole interval at once."""


def compile_statement(sql: str, names: Names, returns_rows: bool = False) -> Statement:
    tree = sqltree.parse(sql, "compile")
    if tree is None:
        raise Unsupported("empty statement")
    gen = _Gen()
    if isinstance(tree, exp.Insert):
        statement = _insert(tree, names, gen)
    elif isinstance(tree, exp.Update):
        statement = _update(tree, names, gen)
    elif isinstance(tree, exp.Delete):
        statement = _delete(tree, names, gen)
    elif isinstance(tree, exp.Select | exp.Values | exp.Subquery):
        statement = _select(tree, names, gen, returns_rows)
    else:
        raise Unsupported(f"{type(tree).__name__.upper()} runs in DuckDB")
    used = {p.name: names.params[p.name] for p in tree.find_all(exp.Placeholder) if p.name in names.params}
    if used:
        statement.run = _binding(statement.run, used)
    return statement


def _binding(run: Callable[[Ctx], Result], types: dict[str, Any]) -> Callable[[Ctx], Result]:
    """`run` over the parameters as DuckDB sees them: each value cast to its declared type (`CAST($x AS T)`).

    A value whose cast is not stated exactly here (a string DuckDB must parse,
    a value out of range) makes the statement run in DuckDB, which casts it or
    words the error.
    """

    def bound(ctx: Ctx) -> Result:
        given = ctx.params
        params = dict(given)
        for name, t in types.items():
            params[name] = bind_value(params.get(name), t)
        ctx.params = params
        try:
            return run(ctx)
        finally:
            ctx.params = given  # the TE's next statement may run in this ctx (server/partition/transaction.py)

    return bound


# ------------------------------------------------------------------ SELECT
def _select(tree: exp.Expression, names: Names, gen: _Gen, returns_rows: bool) -> Statement:
    q = plan_query(tree, names, gen)
    fn = _build(q)
    schema = _result_schema(q) if returns_rows else None
    if returns_rows and isinstance(tree, exp.Select):
        for e in tree.expressions:
            if not isinstance(e, exp.Alias | exp.Column | exp.Star):
                raise Unsupported(f"result column {e.sql('duckdb')} needs an alias to be named as DuckDB names it")

    def run(ctx: Ctx) -> Result:
        rows = fn(ctx)
        return Result(rows=_table(rows, schema) if schema is not None else None)

    return Statement("select", None, run, q.describe, q.source, _prefetch(q))


# ------------------------------------------------------------------ INSERT
def _insert(tree: exp.Insert, names: Names, gen: _Gen) -> Statement:
    target = tree.this
    listed: list[str] | None = None
    if isinstance(target, exp.Schema):
        listed = [c.name for c in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table) or target.db:
        raise Unsupported(f"INSERT INTO {target.sql('duckdb')} runs in DuckDB")
    for unsupported in ("returning", "where", "by_name", "partition"):
        if tree.args.get(unsupported):
            raise Unsupported(f"INSERT ... {unsupported.upper()} runs in DuckDB")
    rel = names.relations.get(target.name)
    if rel is None or rel.window:
        raise Unsupported(f"INSERT INTO {target.name!r}: not a table or stream the compiler knows")
    source = tree.expression
    if source is None:
        raise Unsupported("INSERT ... DEFAULT VALUES runs in DuckDB")
    q = plan_query(source, names, gen)
    columns = listed or [c for c, _ in rel.columns]
    if len(columns) != len(q.types):
        raise Unsupported(f"INSERT INTO {rel.name}: {len(q.types)} values for {len(columns)} columns")
    unknown = [c for c in columns if c not in rel.types]
    if unknown:
        raise Unsupported(f"INSERT INTO {rel.name}: unknown column {unknown[0]!r}")
    casts = [caster(t, rel.types[c]) for c, t in zip(columns, q.types, strict=True)]
    fn = _build(q)
    describe = [f"insert into {rel.name} ({', '.join(columns)})", *(f"  {line}" for line in q.describe)]
    if rel.stream:
        if tree.args.get("conflict") or tree.args.get("alternative") or tree.args.get("ignore"):
            raise Unsupported("a stream has no key to conflict on")
        schema = pa.schema([(c, arrow_type(t)) for c, t in rel.columns])
        order = [columns.index(c) if c in columns else None for c, _ in rel.columns]

        build = _row_builder(None, order, casts)

        def emit(ctx: Ctx) -> Result:
            rows = fn(ctx)
            if not rows:
                return NOTHING
            return Result(emitted=list(map(build, rows)), schema=schema)

        return Statement("emit", rel.name, emit, describe, q.source, _prefetch(q))
    if not rel.key:
        raise Unsupported(f"table {rel.name!r} has no primary key: written in DuckDB")
    if rel.refuse_writes:
        raise Unsupported(rel.refuse_writes)
    conflict = _conflict(tree, rel, names)
    apply = _Writer(rel, columns, casts, conflict)

    def insert(ctx: Ctx) -> Result:
        apply(ctx, fn(ctx))
        return NOTHING

    pre = _prefetch(q)
    key_of_batch = _inserted_keys(q, columns, rel)
    if key_of_batch is not None:
        pre.append((rel.name, key_of_batch))
    describe.append(f"  on conflict: {conflict.describe}")
    return Statement("insert", rel.name, insert, describe, q.source, pre)


@dataclass
class _Conflict:
    mode: str  # error | replace | nothing | update
    describe: str
    update: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], dict[str, Any] | None] | None = None


def _conflict(tree: exp.Insert, rel: Relation, names: Names) -> _Conflict:
    alternative = (tree.args.get("alternative") or "").upper()
    if alternative == "REPLACE":
        return _Conflict("replace", "replace the row")
    if alternative == "IGNORE" or tree.args.get("ignore"):
        return _Conflict("nothing", "keep the row")
    if alternative:
        raise Unsupported(f"INSERT OR {alternative} runs in DuckDB")
    conflict = tree.args.get("conflict")
    if conflict is None:
        return _Conflict("error", "error (duplicate key)")
    keys = conflict.args.get("conflict_keys")
    if keys and [k.this.name if isinstance(k, exp.Ordered) else k.name for k in keys] != list(rel.key):
        raise Unsupported("ON CONFLICT on columns other than the primary key runs in DuckDB")
    if conflict.args.get("constraint"):
        raise Unsupported("ON CONFLICT ON CONSTRAINT runs in DuckDB")
    action = conflict.args.get("action")
    text = (action.this if isinstance(action, exp.Var) else str(action or "")).upper()
    if "NOTHING" in text:
        return _Conflict("nothing", "keep the row")
    sets = conflict.expressions
    if not sets:
        raise Unsupported("ON CONFLICT without an action runs in DuckDB")
    env = _ConflictEnv(rel, names)
    assigned: list[tuple[str, Code]] = []
    for s in sets:
        if not isinstance(s, exp.EQ) or not isinstance(s.this, exp.Column):
            raise Unsupported(f"ON CONFLICT DO UPDATE SET {s.sql('duckdb')} runs in DuckDB")
        col = s.this.name
        if col not in rel.types:
            raise Unsupported(f"ON CONFLICT DO UPDATE: unknown column {col!r}")
        if col in rel.key:
            raise Unsupported("ON CONFLICT DO UPDATE of a primary key column runs in DuckDB")
        assigned.append((col, compile_expr(s.expression, env)))
    where = conflict.args.get("where")
    cond = compile_expr(where.this, env) if where is not None else None
    casts = {c: caster(code.type, rel.types[c]) for c, code in assigned}
    body = ", ".join(f"{c!r}: {code.source}" for c, code in assigned)
    guard = f"if ({cond.source}) is not True: return None\n    " if cond is not None else ""
    src = f"def _upd(OLD, NEW, P):\n    {guard}return {{{body}}}"
    ns = relational.namespace()
    exec(compile(src, "<on conflict>", "exec"), ns)
    upd = ns["_upd"]

    def update(old: dict[str, Any], new: dict[str, Any], params: dict[str, Any]) -> dict[str, Any] | None:
        values = upd(old, new, params)
        if values is None:
            return None
        return {**old, **{c: casts[c](v) for c, v in values.items()}}

    return _Conflict("update", "update " + ", ".join(c for c, _ in assigned), update)


class _ConflictEnv:
    """ON CONFLICT DO UPDATE: `excluded.c` is the row inserted, any other column the row in the table."""

    def __init__(self, rel: Relation, names: Names) -> None:
        self.rel = rel
        self.names = names

    def column(self, node: exp.Column) -> Code:
        if node.name not in self.rel.types:
            raise Unsupported(f"unknown column {node.sql('duckdb')}")
        var = "NEW" if node.table == "excluded" else "OLD"
        if node.table not in ("", "excluded", self.rel.name):
            raise Unsupported(f"column {node.sql('duckdb')} in ON CONFLICT")
        return Code(f"{var}[{node.name!r}]", self.rel.types[node.name], False)

    def param(self, name: str) -> Code:
        t = self.names.params.get(name)
        if t is None:
            raise Unsupported(f"unknown parameter ${name}")
        return Code(f"P[{name!r}]", t, False)

    def other(self, node: exp.Expression) -> Code:
        raise Unsupported(f"{node.sql('duckdb')} in ON CONFLICT runs in DuckDB")


_LOCAL_DUPLICATE = 'Constraint Error: PRIMARY KEY or UNIQUE constraint violation: duplicate key "{}"'


class _Writer:
    """Applies the rows of an INSERT to the working set, as DuckDB would apply them to the table."""

    def __init__(self, rel: Relation, columns: list[str], casts: list[Callable[[Any], Any]], conflict: _Conflict):
        self.rel = rel
        self.table = rel.name
        self.all = [c for c, _ in rel.columns]
        self.positions = [(c, columns.index(c) if c in columns else None) for c in self.all]
        self.casts = casts
        self.key = rel.key
        self.not_null = list(rel.not_null)
        self.conflict = conflict
        self.build = _row_builder([c for c, _ in self.positions], [i for _, i in self.positions], casts)
        self.key_of = _row_builder(None, [self.all.index(c) for c in self.key], [], by_name=self.all)
        self.key_null = _row_builder(None, [self.all.index(c) for c in self.key], [], by_name=self.all, test="is None")
        self.has_null = (
            _row_builder(None, [self.all.index(c) for c in self.not_null], [], by_name=self.all, test="is None")
            if self.not_null
            else None
        )

    def __call__(self, ctx: Ctx, rows: list[tuple[Any, ...]]) -> None:
        if len(rows) == 1:
            self._one(ctx, self.build(rows[0]))
            return
        new_rows = list(map(self.build, rows))
        keys = list(map(self.key_of, new_rows))
        store = ctx.store
        mode = self.conflict.mode
        if mode == "error":
            # which clash DuckDB reports first depends on rows only it knows to be its own
            for key, row in zip(keys, new_rows, strict=True):
                if not self.key_null(row) and store.row(self.table, key) is not None:
                    raise Fallback("a key the table holds: DuckDB reports the clash")
            self._not_null(new_rows)
            seen: set[Any] = set()
            for key in keys:
                if key in seen:
                    raise SqlError(_LOCAL_DUPLICATE.format(_plain(key)))
                seen.add(key)
            writes = list(zip(keys, new_rows, strict=True))
        else:
            if len(set(keys)) < len(keys):
                raise Fallback("several rows of one statement with one key")
            writes = []
            for key, row in zip(keys, new_rows, strict=True):
                old = None if self.key_null(row) else store.row(self.table, key)
                if old is None or mode == "replace":
                    writes.append((key, row))
                elif mode == "update":
                    assert self.conflict.update is not None
                    updated = self.conflict.update(old, row, ctx.params)
                    if updated is not None:
                        writes.append((key, updated))
            self._not_null([row for _, row in writes])
        for key, row in writes:
            store.put(self.table, key, row)

    def _one(self, ctx: Ctx, row: dict[str, Any]) -> None:
        """`__call__` of one row (most statements of 1-tuple batches), checked in the same order."""
        key = self.key_of(row)
        store = ctx.store
        mode = self.conflict.mode
        old = None if self.key_null(row) else store.row(self.table, key)
        if mode == "error":
            if old is not None:
                raise Fallback("a key the table holds: DuckDB reports the clash")
        elif old is not None and mode != "replace":
            if mode == "nothing":
                return
            assert self.conflict.update is not None
            row = self.conflict.update(old, row, ctx.params)
            if row is None:
                return
        if self.has_null is not None and self.has_null(row):
            self._not_null([row])
        store.put(self.table, key, row)

    def _not_null(self, rows: list[dict[str, Any]]) -> None:
        """NOT NULL, a constraint at a time over all rows, in the order DuckDB checks its constraints."""
        if self.has_null is None or not any(map(self.has_null, rows)):
            return
        for c in self.not_null:
            if any(row[c] is None for row in rows):
                raise SqlError(f"Constraint Error: NOT NULL constraint failed: {self.table}.{c}")


def _row_builder(
    names: list[str] | None,
    order: list[int | None],
    casts: list[Callable[[Any], Any]],
    *,
    by_name: list[str] | None = None,
    test: str = "",
) -> Callable[[Any], Any]:
    """A generated function of one row: its values at `order` (None: NULL), each through its cast.

    `names`: it returns a dict of them; else a tuple, or the one value of a
    one-column key. `by_name`: the row is a dict, read by these column names.
    `test` ("is None"): it returns whether any value passes it. A function per
    statement, made at deploy: no per-value loop or identity cast at run time.
    """
    ns: dict[str, Any] = {}
    values = []
    for i in order:
        if i is None:
            values.append("None")
            continue
        read = f"r[{by_name[i]!r}]" if by_name is not None else f"r[{i}]"
        cast = casts[i] if casts else identity
        if cast is identity:
            values.append(read)
        else:
            ns[f"c{i}"] = cast
            values.append(f"c{i}({read})")
    if test:
        body = " or ".join(f"{v} {test}" for v in values) or "False"
    elif names is not None:
        body = "{" + ", ".join(f"{n!r}: {v}" for n, v in zip(names, values, strict=True)) + "}"
    elif len(values) == 1 and by_name is not None:
        body = values[0]
    else:
        body = "(" + "".join(f"{v}, " for v in values) + ")"
    exec(compile(f"def build(r):\n    return {body}", "<row builder>", "exec"), ns)
    return ns["build"]


# ------------------------------------------------------------------ UPDATE
def _update(tree: exp.Update, names: Names, gen: _Gen) -> Statement:
    target = tree.this
    if tree.args.get("from") or tree.args.get("from_") or tree.args.get("returning") or tree.args.get("joins"):
        raise Unsupported("UPDATE ... FROM / RETURNING runs in DuckDB")
    rel = _writable(target, names, "UPDATE")
    alias = target.alias_or_name
    sets: list[tuple[str, exp.Expression]] = []
    for s in tree.expressions:
        if not isinstance(s, exp.EQ) or not isinstance(s.this, exp.Column):
            raise Unsupported(f"UPDATE SET {s.sql('duckdb')} runs in DuckDB")
        col = s.this.name
        if col not in rel.types:
            raise Unsupported(f"UPDATE: unknown column {col!r}")
        if col in rel.key:
            raise Unsupported("UPDATE of a primary key column runs in DuckDB")
        sets.append((col, s.expression))
    select = exp.select(*[exp.column(k, table=alias) for k in rel.key], *[e.copy() for _, e in sets]).from_(
        target.copy()
    )
    where = tree.args.get("where")
    if where is not None:
        select = select.where(where.this.copy())
    q = plan_query(select, names, gen)
    fn = _build(q)
    n = len(rel.key)
    casts = [caster(t, rel.types[c]) for (c, _), t in zip(sets, q.types[n:], strict=True)]
    set_at = {c: i for i, (c, _) in enumerate(sets)}
    not_null = [set_at[c] for c in rel.not_null if c in set_at]  # in the order DuckDB checks them

    def update(ctx: Ctx) -> Result:
        changes = [
            (r[0] if n == 1 else tuple(r[:n]), [cast(v) for cast, v in zip(casts, r[n:], strict=True)]) for r in fn(ctx)
        ]
        for i in not_null:  # a constraint at a time over all rows, as DuckDB checks them
            if any(values[i] is None for _, values in changes):
                raise SqlError(f"Constraint Error: NOT NULL constraint failed: {rel.name}.{sets[i][0]}")
        store = ctx.store
        for key, values in changes:
            old = store.row(rel.name, key)
            assert old is not None
            store.put(rel.name, key, {**old, **{c: v for (c, _), v in zip(sets, values, strict=True)}})
        return NOTHING

    describe = [f"update {rel.name} set {', '.join(c for c, _ in sets)}", *(f"  {line}" for line in q.describe)]
    return Statement("update", rel.name, update, describe, q.source, _prefetch(q))


# ------------------------------------------------------------------ DELETE
def _delete(tree: exp.Delete, names: Names, gen: _Gen) -> Statement:
    target = tree.this
    if tree.args.get("using") or tree.args.get("returning"):
        raise Unsupported("DELETE ... USING / RETURNING runs in DuckDB")
    rel = _writable(target, names, "DELETE")
    alias = target.alias_or_name
    select = exp.select(*[exp.column(k, table=alias) for k in rel.key]).from_(target.copy())
    where = tree.args.get("where")
    if where is not None:
        select = select.where(where.this.copy())
    q = plan_query(select, names, gen)
    fn = _build(q)
    single = len(rel.key) == 1

    def delete(ctx: Ctx) -> Result:
        keys = [r[0] if single else tuple(r) for r in fn(ctx)]
        for key in keys:
            ctx.store.put(rel.name, key, None)
        return NOTHING

    describe = [f"delete from {rel.name}", *(f"  {line}" for line in q.describe)]
    return Statement("delete", rel.name, delete, describe, q.source, _prefetch(q))


def _writable(target: exp.Expression, names: Names, verb: str) -> Relation:
    if not isinstance(target, exp.Table) or target.db:
        raise Unsupported(f"{verb} {target.sql('duckdb')} runs in DuckDB")
    rel = names.relations.get(target.name)
    if rel is None or rel.stream or rel.window:
        raise Unsupported(f"{verb} {target.name!r}: not a table the compiler knows")
    if not rel.key:
        raise Unsupported(f"table {rel.name!r} has no primary key: written in DuckDB")
    if rel.refuse_writes:
        raise Unsupported(rel.refuse_writes)
    return rel


# ----------------------------------------------------------------- helpers
def _build(q: Query) -> Callable[[Ctx], list[tuple[Any, ...]]]:
    ns = relational.namespace()
    exec(compile(q.source, "<compiled statement>", "exec"), ns)
    return ns[q.fn_name]


def _prefetch(q: Query) -> list[tuple[str, Callable[[dict[str, Any]], Any]]]:
    """Key functions of the lookups a query makes straight from its batch rows (TStream's pre-processing)."""
    return [(table, _key_function(key, var)) for table, key, var in q.keys]


def _key_function(source: str, var: str, cast: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    ns = relational.namespace()
    exec(compile(f"def _key({var}, P):\n    return {source}", "<prefetch>", "exec"), ns)
    key = ns["_key"]
    if cast is None:
        return key
    return lambda row, params: cast(key(row, params))


def _inserted_keys(q: Query, columns: list[str], rel: Relation) -> Callable[..., Any] | None:
    """How to tell, from a batch row, the key an INSERT ... SELECT FROM the batch inserts (to prefetch it).

    Only for a one-column key whose value the SELECT computes from the batch row alone.
    """
    if len(rel.key) != 1 or rel.key[0] not in columns or q.batch_var is None or q.projections is None:
        return None
    i = columns.index(rel.key[0])
    source = q.projections[i]
    if not batch_only(source, q.batch_var):
        return None
    return _key_function(source, q.batch_var, caster(q.types[i], rel.types[rel.key[0]]))


def _result_schema(q: Query) -> pa.Schema:
    return pa.schema([(n, arrow_type(t)) for n, t in zip(q.names, q.types, strict=True)])


def _table(rows: list[Any], schema: pa.Schema) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    return pa.table([pa.array(list(c), f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)


def _key(row: dict[str, Any], key: tuple[str, ...]) -> Any:
    return row[key[0]] if len(key) == 1 else tuple(row[k] for k in key)


def _text(v: Any) -> str:
    """A value as DuckDB's messages print it."""
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _plain(key: Any) -> str:
    return ", ".join(map(_text, key)) if isinstance(key, tuple) else _text(key)
