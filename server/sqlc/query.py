"""Queries compiled to Python: FROM, JOIN, WHERE, GROUP BY, window functions, ORDER BY, LIMIT.

A query becomes one generated Python function over the working set
(`ctx.py`): nested loops over its sources (the TE's batch, a row looked up by
primary key, a scan of a small table, a subquery's rows), a filter for WHERE,
then, in plain Python, grouping, window functions, projection, DISTINCT,
ORDER BY and LIMIT. Scalar expressions are compiled by `expr.py`, so values,
NULLs, overflows and errors are DuckDB's.

What is refused (`Unsupported`, with the reason `explain` shows) runs in
DuckDB instead: a join that is neither a primary-key lookup nor an inner join
with a scanned table, a correlated subquery that is not a primary-key lookup,
aggregates whose result could differ from DuckDB's by rounding (sums of
floating point numbers), set operations, recursive CTEs, and every function
or type `expr.py` does not compile exactly.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from streamtx.server.sqlc import columns as C
from streamtx.server.sqlc import types as T
from streamtx.server.sqlc.errors import Unsupported
from streamtx.server.sqlc.expr import Code, compile_expr
from streamtx.server.sqlc.types import SqlType

_VARIABLES = re.compile(r"\b[rS]\d+\b|\bctx\b")  # rows, subquery results, the statement's context


def batch_only(source: str, batch_var: str) -> bool:
    """Whether compiled code reads nothing but the batch row `batch_var` (and parameters): a prefetchable key."""
    return set(_VARIABLES.findall(source)) <= {batch_var}


@dataclass(frozen=True)
class Relation:
    """A table or a stream as a compiled statement sees it."""

    name: str
    columns: tuple[tuple[str, SqlType], ...]
    key: tuple[str, ...] = ()  # primary key columns (none: the table can only be scanned)
    stream: bool = False
    not_null: tuple[str, ...] = ()  # in the order DuckDB checks them (its NOT NULL constraints' order)
    refuse_writes: str = ""  # why compiled statements may not write it (UNIQUE constraints, defaults)
    window: bool = False  # a window held in memory: read whole, never written

    @property
    def types(self) -> dict[str, SqlType]:
        return dict(self.columns)


@dataclass(frozen=True)
class Names:
    """Everything a statement may name: the procedure's scope, with types."""

    relations: dict[str, Relation]
    input_stream: str | None
    params: dict[str, SqlType]
    unsupported: dict[str, str] = field(default_factory=dict)  # name -> why it cannot be read compiled (windows)


@dataclass
class Source:
    """One relation of a query's FROM: where its rows come from, and the variable holding the current one."""

    alias: str
    var: str
    columns: dict[str, SqlType]
    loop: str  # the Python iterable its rows come from
    nullable: bool = False  # LEFT JOIN: the row may be None
    describe: str = ""
    not_null: frozenset[str] = frozenset()  # columns never NULL in a row it holds (a table's NOT NULL and key)
    table: str | None = None  # the window read, or the table looked up by primary key
    positions: dict[str, int] | None = None  # a subquery's rows are tuples: each column's position in them


@dataclass
class Query:
    """A compiled query: `source` defines `fn(ctx, outer...)` returning a list of row tuples."""

    names: list[str]
    types: list[SqlType]
    source: str
    fn_name: str
    outer: list[str]  # the outer row variables a correlated subquery takes
    describe: list[str]
    subqueries: list[Query] = field(default_factory=list)
    keys: list[tuple[str, str, str]] = field(default_factory=list)  # (table, key source, batch row variable)
    batch_var: str | None = None  # the variable of the input batch's row, if the batch is the only source
    projections: list[str] | None = None  # each output column's source over the rows (grouped: the key columns')
    single_row: bool = False  # at most one row whatever the data (an aggregate without GROUP BY, a key lookup)


class _Gen:
    """Names for generated functions and variables, unique in one statement."""

    def __init__(self) -> None:
        self._ids = itertools.count()

    def name(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"


AGGREGATES = (exp.Count, exp.Sum, exp.Min, exp.Max)


def plan_query(
    select: exp.Expression,
    names: Names,
    gen: _Gen,
    outer: list[Source] | None = None,
    pushed: list[exp.Expression] | None = None,
) -> Query:
    """Compiles a SELECT (or VALUES) into a function; `outer` are the sources a correlated subquery sees.

    `pushed`: conditions of an enclosing query over this one's output columns, checked before a row is
    built (the outer query's filter on a subquery in its FROM, moved in: `WHERE r <= 3` over a
    `row_number()` builds three rows, not every row).
    """
    if isinstance(select, exp.Subquery):
        select = select.this
    if isinstance(select, exp.Values):
        return _plan_values(select, names, gen)
    if not isinstance(select, exp.Select):
        raise Unsupported(f"{type(select).__name__.upper()} queries run in DuckDB")
    for unsupported in ("with_", "with", "qualify", "distinct_on"):
        if select.args.get(unsupported):
            raise Unsupported(f"{unsupported.rstrip('_').upper()} runs in DuckDB")
    distinct = select.args.get("distinct")
    if distinct is not None and distinct.args.get("on"):
        raise Unsupported("DISTINCT ON runs in DuckDB")
    return _Planner(select, names, gen, outer or [], pushed or []).plan()


class _Planner:
    def __init__(
        self, select: exp.Select, names: Names, gen: _Gen, outer: list[Source], pushed: list[exp.Expression]
    ) -> None:
        self.select = select
        self.pushed = pushed
        self.names = names
        self.gen = gen
        self.outer = outer
        self.sources: list[Source] = []
        self.lines: list[str] = []
        self.describe: list[str] = []
        self.subqueries: list[Query] = []
        self.hoisted: list[str] = []  # uncorrelated subqueries, computed once per run
        self.keys: list[tuple[str, str, str]] = []
        self.used_outer: set[str] = set()
        self.projections: list[str] | None = None
        self.kept: str | None = None  # the variable holding the only rows a top K can output (`_window_code`)

    # ---------------------------------------------------------------- plan
    def plan(self) -> Query:
        sel = self.select
        where = sel.args.get("where")
        conjuncts = _conjuncts(where.this) if where is not None else []
        from_ = sel.args.get("from_") or sel.args.get("from")
        body: list[str] = []
        depth = 1
        if from_ is not None:
            depth = self._from(from_.this, conjuncts, body, depth)
        else:
            body.append(_indent(depth, "for _ in (None,):"))
            depth += 1
            self.describe.append("no FROM: one row")
        for join in sel.args.get("joins") or []:
            depth = self._join(join, conjuncts, body, depth)
        guards: list[tuple[exp.Expression, Code]] = []
        body += self._filter(conjuncts, depth, guards)
        if conjuncts:
            self.describe.append("filter: " + " AND ".join(c.sql("duckdb") for c in conjuncts))
        if guards:  # a row-independent condition that does not hold: no row needs reading
            self.describe.append("checked once, before any row: " + " AND ".join(c.sql("duckdb") for c, _ in guards))
            if any(g.fails for _, g in guards):  # each evaluated, so that an error any of them meets is met
                test = f"all(_x is True for _x in ({''.join(g.source + ', ' for _, g in guards)}))"
            else:
                test = " and ".join(f"({g.source}) is True" for _, g in guards)
            body = [_indent(1, f"if {test}:"), *(_indent(1, line) for line in body)]
            depth += 1
        having = sel.args.get("having")
        grouped = bool(sel.args.get("group")) or any(
            _own_aggregates(e) for e in [*sel.expressions, *([having.this] if having is not None else [])]
        )
        fn = self.gen.name("q")
        row_vars = [s.var for s in self.sources]
        env_tuple = f"({', '.join(row_vars)},)" if row_vars else "()"
        if grouped:
            out_names, out_types, tail = self._grouped(body, depth, row_vars)
        else:
            body.append(_indent(depth, f"E.append({env_tuple})"))
            out_names, out_types, tail = self._ungrouped(row_vars, body)
        outer_vars = sorted(self.used_outer)
        header = [f"def {fn}(ctx{''.join(', ' + v for v in outer_vars)}):", "    P = ctx.params", "    E = []"]
        if any(line.lstrip().startswith(tuple(f"{s.var} = _get(" for s in self.sources)) for line in body):
            header.append("    _get = ctx.get")
        source = "\n".join([*(s.source for s in self.subqueries), *header, *self.hoisted, *body, *tail])
        batch_var = self.sources[0].var if len(self.sources) == 1 and self.sources[0].loop == "ctx.batch" else None
        single = (grouped and not sel.args.get("group")) or (
            len(self.sources) == 1 and self.sources[0].loop.startswith("_one(") and not _windows(sel)
        )
        return Query(
            out_names,
            out_types,
            source,
            fn,
            outer_vars,
            self.describe,
            self.subqueries,
            self.keys,
            batch_var,
            self.projections,
            single,
        )

    # ---------------------------------------------------------------- FROM
    def _from(self, node: exp.Expression, conjuncts: list[exp.Expression], body: list[str], depth: int) -> int:
        return self._source(node, conjuncts, body, depth, on=None, side="")

    def _join(self, join: exp.Join, conjuncts: list[exp.Expression], body: list[str], depth: int) -> int:
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if join.args.get("using") or kind in ("SEMI", "ANTI", "NATURAL", "ASOF") or side in ("RIGHT", "FULL"):
            raise Unsupported(f"{(side + ' ' + kind).strip() or 'this'} JOIN runs in DuckDB")
        on = join.args.get("on")
        if kind == "CROSS" or on is None:
            if side:
                raise Unsupported(f"{side} JOIN without ON runs in DuckDB")
            return self._source(join.this, [], body, depth, on=[], side="")
        return self._source(join.this, conjuncts, body, depth, on=_conjuncts(on), side=side)

    def _source(
        self,
        node: exp.Expression,
        where: list[exp.Expression],
        body: list[str],
        depth: int,
        on: list[exp.Expression] | None,
        side: str,
    ) -> int:
        var = self.gen.name("r")
        alias = node.alias_or_name
        if isinstance(node, exp.Subquery):
            if side:
                raise Unsupported("a LEFT JOIN of a subquery runs in DuckDB")
            q = self._from_subquery(node, alias, where if on is None and not self.sources else [])
            self._correlated(q)
            self.subqueries.append(q)
            cols = dict(zip(q.names, q.types, strict=True))
            loop = f"{q.fn_name}(ctx{''.join(', ' + v for v in q.outer)})"
            positions = {n: i for i, n in enumerate(q.names)}  # a repeated name reads its last, as a dict would
            src = Source(alias, var, cols, loop, describe=f"subquery {alias}", positions=positions)
            self.describe += [f"  {line}" for line in q.describe]
            return self._enter(src, on or [], body, depth)
        if not isinstance(node, exp.Table) or node.db or not node.name:
            raise Unsupported(f"FROM {node.sql('duckdb')} runs in DuckDB")
        name = node.name
        if name in self.names.unsupported:
            raise Unsupported(self.names.unsupported[name])
        rel = self.names.relations.get(name)
        if rel is None:
            raise Unsupported(f"{name!r} is not a table or stream the compiler knows")
        cols = rel.types
        if rel.window:
            src = Source(alias, var, cols, f"ctx.window({name!r})", side == "LEFT", f"{alias}: the window {name}")
            src.table = name
            if side:
                raise Unsupported(f"a LEFT JOIN of window {name!r} runs in DuckDB")
            return self._enter(src, on or [], body, depth)
        if rel.stream:
            if name != self.names.input_stream:
                raise Unsupported(f"stream {name!r} is not this statement's input")
            if side:
                raise Unsupported("a LEFT JOIN of the input batch runs in DuckDB")
            src = Source(alias, var, cols, "ctx.batch", describe=f"{alias}: the input batch")
            return self._enter(src, on or [], body, depth)
        solid = frozenset(rel.not_null) | frozenset(rel.key)
        pinned = self._pinned(rel, alias, (on if on is not None else where))
        if pinned is not None:
            exprs, used = pinned
            for u in used:
                (on if on is not None else where).remove(u)
            key = exprs[0] if len(exprs) == 1 else f"({', '.join(exprs)},)"
            how = "opt" if side == "LEFT" else "one"
            src = Source(alias, var, cols, f"_{how}(ctx.get({name!r}, {key}))", side == "LEFT", not_null=solid)
            src.table = name
            src.describe = f"{alias}: {name} by primary key ({', '.join(rel.key)})" + (" (LEFT)" if side else "")
            if self.sources and self.sources[0].loop == "ctx.batch" and not self.used_outer:
                batch = self.sources[0].var
                if batch_only(key, batch):
                    self.keys.append((name, key, batch))  # a key the batch row alone decides
            remaining = on if on is not None else []
            return self._enter(src, remaining, body, depth)
        if side:
            raise Unsupported(f"LEFT JOIN {name}: not on its whole primary key")
        keyset = self._key_set(rel, alias, on if on is not None else where)
        if keyset is not None:
            keys, used = keyset
            (on if on is not None else where).remove(used)
            how = f"{alias}: {name} by keys in a set"
            src = Source(alias, var, cols, f"ctx.many({name!r}, {keys})", describe=how, not_null=solid)
            return self._enter(src, on or [], body, depth)
        how = f"{alias}: scan of {name} (small tables only)"
        src = Source(alias, var, cols, f"ctx.scan({name!r})", describe=how, not_null=solid)
        return self._enter(src, on or [], body, depth)

    def _key_set(
        self, rel: Relation, alias: str, conjuncts: list[exp.Expression] | None
    ) -> tuple[str, exp.Expression] | None:
        """`pk IN (list)` or `pk IN (subquery)` on a one-column key: the keys to look up, and the conjunct."""
        if len(rel.key) != 1 or not conjuncts:
            return None
        pk, key_type = rel.key[0], rel.types[rel.key[0]]
        for c in conjuncts:
            col = c.this if isinstance(c, exp.In) else None
            if not (isinstance(col, exp.Column) and col.name == pk and col.table in ("", alias)):
                continue
            if col.table == "" and not self._only_here(pk, alias):
                continue
            query = c.args.get("query")
            try:
                if query is not None:
                    q = self._sub(query.this if isinstance(query, exp.Subquery) else query)
                    if len(q.types) != 1 or not C.same_key_kind(q.types[0], key_type):
                        continue
                    if q.batch_var is not None and q.projections is not None:
                        self.keys.append((rel.name, q.projections[0], q.batch_var))
                    return f"_column({self._call(q)})", c
                codes = [self._expr(e, self._row_env()) for e in c.expressions]
            except Unsupported:
                continue
            if all(C.same_key_kind(code.type, key_type) for code in codes):
                return "[" + ", ".join(code.source for code in codes) + "]", c
        return None

    def _from_subquery(self, node: exp.Subquery, alias: str, where: list[exp.Expression]) -> Query:
        """A subquery in FROM, with the conjuncts of `where` (the outer WHERE) it can check itself moved in.

        Only for the one source of a query without outer rows or joins, and a subquery
        without LIMIT/OFFSET (filtering before them would change which rows they
        keep); a conjunct moves when it reads nothing but the subquery's columns.
        """
        select = node.this
        movable = []
        if (
            where
            and not self.outer
            and not self.select.args.get("joins")
            and isinstance(select, exp.Select)
            and not select.args.get("limit")
            and not select.args.get("offset")
        ):
            movable = [c for c in where if _over_columns_of(c, alias)]
        if movable:
            try:
                q = plan_query(select, self.names, self.gen, self.outer + self.sources, movable)
            except Unsupported:
                pass
            else:
                for c in movable:
                    where.remove(c)
                return q
        return plan_query(select, self.names, self.gen, self.outer + self.sources)

    def _enter(self, src: Source, on: list[exp.Expression], body: list[str], depth: int) -> int:
        lookup = _LOOKUP.fullmatch(src.loop)
        self.sources.append(src)
        self.describe.append(src.describe)
        if lookup is not None and depth > 1:  # inside a loop already: a key lookup is a plain read
            how, table_key = lookup.groups()
            body.append(_indent(depth, f"{src.var} = _get({table_key})"))
            if how == "one":
                body.append(_indent(depth, f"if {src.var} is None: continue"))
        else:
            body.append(_loop_line(src, depth))
            depth += 1
        body += self._filter(list(on), depth)
        return depth

    def _pushed_filter(self, codes: list[Code], names: list[str]) -> list[str]:
        """The lines skipping an output row that fails a condition moved in from the enclosing query."""
        if not self.pushed:
            return []
        if len(set(names)) < len(names) or any(c.fails for c in codes):
            raise Unsupported("the enclosing query's filter stays outside")
        env = _Outputs(self.names, dict(zip(names, codes, strict=True)))
        conds = [compile_expr(c, env) for c in self.pushed]
        if any(c.fails for c in conds):
            raise Unsupported("the enclosing query's filter stays outside")
        self.describe.append("filter (from the enclosing query): " + " AND ".join(c.sql("duckdb") for c in self.pushed))
        return [f"        if ({c.source}) is not True: continue" for c in conds]

    def _filter(
        self, conjuncts: list[exp.Expression], depth: int, guards: list[tuple[exp.Expression, Code]] | None = None
    ) -> list[str]:
        """Lines skipping the rows `conjuncts` do not all hold for.

        With `guards` (a WHERE), the conditions that read no row of this FROM
        (parameters, uncorrelated subqueries) go there instead, if the others
        cannot fail: the caller tests them once, before reading any row, as
        their value is the same for every row (the voter's "is it time to
        delete?" then skips scanning and sorting the contestants on all but one
        vote in thousands). One that fails does so there, and DuckDB runs the
        statement, as it would on the first row.

        A condition that may raise an error is evaluated with the others on every row
        (DuckDB may evaluate the conjuncts in any order, so an error it meets is met here
        too, and DuckDB then runs the statement). In a join, where DuckDB may also
        evaluate it before or after joining, or only on the rows an index finds, such a
        condition runs in DuckDB: it is compiled over the batch, a scan or a subquery alone.
        """
        codes = [self._expr(c, self._row_env()) for c in conjuncts]
        if guards is not None:
            row = re.compile(r"\b(" + "|".join(re.escape(src.var) for src in self.sources) + r")\b")
            constant = [not (self.sources and row.search(c.source)) for c in codes]
            if not any(c.fails for c, k in zip(codes, constant, strict=True) if not k):  # else as below
                guards += [(e, c) for e, c, k in zip(conjuncts, codes, constant, strict=True) if k]
                codes = [c for c, k in zip(codes, constant, strict=True) if not k]
        if not any(c.fails for c in codes):
            return [_indent(depth, f"if ({c.source}) is not True: continue") for c in codes]
        whole = ("ctx.batch", "ctx.scan(", "ctx.window(")
        only = self.sources[0] if len(self.sources) + len(self.outer) == 1 else None
        if only is None or not (only.loop.startswith(whole) or only.positions is not None):
            bad = next(c for c, code in zip(conjuncts, codes, strict=True) if code.fails)
            raise Unsupported(f"{bad.sql('duckdb')} may raise an error in a join's condition: it runs in DuckDB")
        values = "".join(f"{c.source}, " for c in codes)
        return [_indent(depth, f"if not all(_x is True for _x in ({values})): continue")]

    def _pinned(
        self, rel: Relation, alias: str, conjuncts: list[exp.Expression] | None
    ) -> tuple[list[str], list[exp.Expression]] | None:
        """Key expressions if `conjuncts` pin every primary key column of `rel` to an expression of earlier rows."""
        if not rel.key or not conjuncts:
            return None
        found: dict[str, tuple[str, exp.Expression]] = {}
        types = rel.types
        for c in conjuncts:
            if not isinstance(c, exp.EQ):
                continue
            for col, other in ((c.this, c.expression), (c.expression, c.this)):
                if not (isinstance(col, exp.Column) and col.name in rel.key and col.table in ("", alias)):
                    continue
                if col.table == "" and not self._only_here(col.name, alias):
                    continue
                if any(
                    isinstance(x, exp.Column) and x.table in ("", alias) and self._names_here(x, alias)
                    for x in other.find_all(exp.Column)
                ):
                    continue
                try:
                    code = self._expr(other, self._row_env())
                except Unsupported:
                    continue
                if not C.same_key_kind(code.type, types[col.name]):
                    continue  # compared after a cast: the filter alone decides
                found.setdefault(col.name, (code.source, c))
        if set(found) != set(rel.key):
            return None
        return [found[k][0] for k in rel.key], [found[k][1] for k in rel.key]

    def _only_here(self, column: str, alias: str) -> bool:
        return not any(column in s.columns for s in self.sources + self.outer)

    def _names_here(self, col: exp.Column, alias: str) -> bool:
        """Whether a column reference inside a key expression names the relation being looked up (not allowed)."""
        if col.table == alias:
            return True
        return col.table == "" and not any(col.name in s.columns for s in self.sources + self.outer)

    # ------------------------------------------------------------- columns
    def _row_env(self) -> _RowEnv:
        return _RowEnv(self)

    def _column(self, node: exp.Column) -> Code:
        table, name = node.table, node.name
        for src in reversed(self.sources):
            if (table and src.alias == table) or (not table and name in src.columns):
                if name not in src.columns:
                    raise Unsupported(f"unknown column {node.sql('duckdb')}")
                if not table and sum(name in s.columns for s in self.sources) > 1:
                    raise Unsupported(f"ambiguous column {name!r}")
                return _read(src, name)
        for src in reversed(self.outer):
            if (table and src.alias == table) or (not table and name in src.columns):
                self.used_outer.add(src.var)
                return _read(src, name)
        raise Unsupported(f"column {node.sql('duckdb')} is not in scope")

    def _expr(self, node: exp.Expression, env: Any) -> Code:
        return compile_expr(node, env)

    # --------------------------------------------------------- subqueries
    def _subquery(self, node: exp.Expression) -> Code:
        """A scalar subquery, EXISTS or IN (subquery): hoisted when uncorrelated, inline when correlated."""
        if isinstance(node, exp.Exists):
            q = self._sub(node.this)
            return Code(f"(len({self._call(q)}) > 0)", T.BOOLEAN, False)
        if isinstance(node, exp.In) and node.args.get("query") is not None:
            q = self._sub(node.args["query"])
            if len(q.types) != 1:
                raise Unsupported("IN (subquery) must select one column")
            left = compile_expr(node.this, self._row_env())
            if not C.same_key_kind(left.type, q.types[0]):
                raise Unsupported("IN (subquery) compares values of different kinds")
            return Code(f"_in_rows({left.source}, {self._call(q)})", T.BOOLEAN, False)
        if isinstance(node, exp.Subquery):
            q = self._sub(node.this)
            if len(q.types) != 1:
                raise Unsupported("a scalar subquery must select one column")
            return Code(f"_scalar({self._call(q)})", q.types[0], not q.single_row)
        raise Unsupported(f"{type(node).__name__} runs in DuckDB")

    def _sub(self, select: exp.Expression) -> Query:
        q = plan_query(select, self.names, self.gen, self.outer + self.sources)
        self._correlated(q)
        self.subqueries.append(q)
        self.describe += [f"  {line}" for line in q.describe]
        return q

    def _correlated(self, q: Query) -> None:
        outer_vars = {s.var for s in self.outer}
        self.used_outer |= set(q.outer) & outer_vars

    def _call(self, q: Query) -> str:
        if not q.outer:
            var = self.gen.name("S")
            self.hoisted.append(f"    {var} = {q.fn_name}(ctx)")
            return var
        return f"{q.fn_name}(ctx{''.join(', ' + v for v in q.outer)})"

    # ------------------------------------------------------------ ungrouped
    def _ungrouped(self, row_vars: list[str], body: list[str]) -> tuple[list[str], list[SqlType], list[str]]:
        sel = self.select
        env = _EnvRows(self, row_vars)
        items = _select_items(sel, self.sources)
        windows = _windows(sel)
        tail: list[str] = []
        if windows and not self._ranked(windows, env, items, body):
            tail += self._window_code(windows, env, "E", items)
        codes = [env.compile(e) for _, e in items]
        self.projections = [c.source for c in codes]
        names = [n for n, _ in items]
        tail.append("    O = []\n" + self._output_loop(f"{', '.join(row_vars)}," if row_vars else "_"))
        tail += self._pushed_filter(codes, names)
        tail.append(f"        O.append(({''.join(c.source + ', ' for c in codes)}))")
        tail += self._finish(sel, codes, names, env, "E")
        return names, [c.type for c in codes], tail

    # -------------------------------------------------------------- grouped
    def _grouped(self, body: list[str], depth: int, row_vars: list[str]) -> tuple[list[str], list[SqlType], list[str]]:
        sel = self.select
        group = sel.args.get("group")
        keys = list(group.expressions) if group is not None else []
        if group is not None and (
            group.args.get("rollup") or group.args.get("cube") or group.args.get("grouping_sets")
        ):
            raise Unsupported("ROLLUP, CUBE and GROUPING SETS run in DuckDB")
        items = _select_items(sel, self.sources)
        keys = [_resolve_position(k, items) for k in keys]
        row_env = self._row_env()
        key_codes = [compile_expr(k, row_env) for k in keys]
        for k, c in zip(keys, key_codes, strict=True):
            if c.type.kind in ("float", "real"):
                raise Unsupported(f"GROUP BY {k.sql('duckdb')}: floating point keys run in DuckDB (NaN groups)")
        # an output column that is a grouping key takes its value from the group's rows: prefetchable
        by_key = {k.sql(): c.source for k, c in zip(keys, key_codes, strict=True)}
        self.projections = [by_key.get(e.sql(), "ctx") for _, e in items]  # "ctx": not from the rows alone
        aggs: list[exp.Expression] = []
        for node in [*(e for _, e in items), *(_having_and_order(sel))]:
            for agg in _own_aggregates(node):
                if not any(agg.sql() == a.sql() for a in aggs):
                    aggs.append(agg)
        specs = [_aggregate(a, row_env) for a in aggs]
        key_tuple = f"({''.join(c.source + ', ' for c in key_codes)})"
        sliding = self._sliding(body, specs)
        if sliding is not None:
            init_slots, steps, finals = _adding_slots(specs)
        else:
            init_slots = [s.init for s in specs]
            steps = [s.step.format(a=f"_a[{j}]") for j, s in enumerate(specs)]
            finals = [f"_fin{j}(_a[{j}])" for j in range(len(specs))]
        inits = f"[{', '.join(init_slots)}]"
        body.append(_indent(depth, f"_k = {key_tuple}"))
        body.append(_indent(depth, "_a = G.get(_k)"))
        body.append(_indent(depth, f"if _a is None: _a = G[_k] = {inits}"))
        for step in steps:
            body += [_indent(depth, line) for line in step.split("\n")]
        self.describe.append(
            "group by "
            + (", ".join(k.sql("duckdb") for k in keys) or "()")
            + ": "
            + ", ".join(a.sql("duckdb") for a in aggs)
        )
        if sliding is not None:
            window, tables = sliding
            part = ["    def _part(_rows):", "        G = {}", f"        for {self.sources[0].var} in _rows:"]
            part += ["    " + line for line in body[1:]] + ["        return G"]
            key = hashlib.sha1("\n".join(part).encode()).hexdigest()[:16]
            body[:] = [*part, f"    G = ctx.window_groups({window!r}, {key!r}, {tables!r}, _part)"]
            self.describe.append(f"kept up to date as tuples enter and leave window {window}")
        else:
            count = self._whole_count(body, keys, aggs)
            body[:] = (
                ["    G = {}", *body] if count is None else [f"    G = {{(): [{', '.join([count] * len(specs))}]}}"]
            )
            for j, s in enumerate(specs):
                self.hoisted.append(f"    _fin{j} = {s.final}")
        env = _EnvGroups(self, keys, key_codes, aggs, specs)
        tail = []
        if not keys:
            tail.append(f"    if not G: G = {{(): {inits}}}")
        tail.append(
            f"    E = [(_k, [{', '.join(finals)}]) for _k, _a in G.items()]"
            if specs
            else "    E = [(_k, []) for _k in G]"
        )
        having = sel.args.get("having")
        if having is not None:
            hc = env.compile(having.this)
            tail.append(f"    E = [(_k, _a) for _k, _a in E if ({hc.source}) is True]")
        windows = _windows(sel)
        if windows:
            tail += self._window_code(windows, env, "E", items)
        codes = [env.compile(e) for _, e in items]
        tail.append("    O = []\n" + self._output_loop("_k, _a"))
        tail += self._pushed_filter(codes, [n for n, _ in items])
        tail.append(f"        O.append(({''.join(c.source + ', ' for c in codes)}))")
        tail += self._finish(sel, codes, [n for n, _ in items], env, "E")
        return [n for n, _ in items], [c.type for c in codes], tail

    def _whole_count(self, body: list[str], keys: list[exp.Expression], aggs: list[exp.Expression]) -> str | None:
        """`SELECT count(*) FROM t` alone (no WHERE, join or GROUP BY): the source of the count, read without a loop."""
        scan = _SCAN.fullmatch(self.sources[0].loop) if len(self.sources) == 1 else None
        if scan is None or keys or not all(isinstance(a, exp.Count) and isinstance(a.this, exp.Star) for a in aggs):
            return None
        if body[:2] != [_loop_line(self.sources[0]), "        _k = ()"]:
            return None
        self.describe.append("count(*) of a whole table: its rows are not read")
        return f"ctx.count({scan.group(1)})"

    def _sliding(self, body: list[str], specs: list[_AggSpec]) -> tuple[str, tuple[str, ...]] | None:
        """The window and the tables read, if this grouping may be kept up to date as the window slides.

        So it may if every aggregate adds up (counts, integer sums) and each
        tuple's part depends on nothing but the tuple and the rows of tables
        it looks up by primary key: no parameter, no subquery, no other source.
        """
        first = self.sources[0] if self.sources else None
        if first is None or first.table is None or not first.loop.startswith("ctx.window("):
            return None
        if self.outer or self.used_outer or self.subqueries or self.hoisted or not body:
            return None
        if body[0] != _loop_line(first) or any(s.adds is None for s in specs):
            return None  # a condition checked once, before any row (a parameter, a subquery): not per tuple
        if any(s.table is None or not _LOOKUP.fullmatch(s.loop) for s in self.sources[1:]):
            return None
        if any(_READS_MORE.search(line) for line in body[1:]):
            return None
        return first.table, tuple(dict.fromkeys(s.table for s in self.sources[1:] if s.table is not None))

    # ------------------------------------------------------- window funcs
    def _window_code(
        self, windows: list[exp.Window], env: Any, rows: str, items: list[tuple[str, exp.Expression]]
    ) -> list[str]:
        caps = [self._row_cap(w, items) for w in windows]
        lines = [f"    W = [[{', '.join('None' if k is None else str(k + 1) for k in caps)}] for _ in {rows}]"]
        env.windows = windows
        for j, w in enumerate(windows):
            kind = _window_kind(w.this)
            if kind is None:
                raise Unsupported(f"window function {w.this.sql('duckdb')} runs in DuckDB")
            if w.args.get("spec") is not None:
                raise Unsupported("window frames run in DuckDB")
            parts = [env.compile(p) for p in (w.args.get("partition_by") or [])]
            orders = _window_orders(w)
            if kind != "rownumber" and not orders:
                raise Unsupported(f"{kind} without ORDER BY runs in DuckDB")
            pkey = f"({''.join(p.source + ', ' for p in parts)})"
            okey = _window_order_key(w, env)
            unpack = env.unpack()
            if parts:
                lines.append(f"    _P = {{}}\n    for _i, {unpack} in enumerate({rows}):")
                lines.append(f"        _P.setdefault({pkey}, []).append(({okey}, _i))")
                lines.append("    for _g in _P.values():\n        _g.sort()")
                lines.append(f"        _number_{kind}(_g, W, {j})")
                continue
            top = "" if caps[j] is None else f"[:{caps[j]}]"
            # (key, index) pairs sort as a stable sort by key would: the indexes are unique and ascending
            lines.append(f"    _g = [({okey}, _i) for _i, {unpack} in enumerate({rows})]")
            lines.append(f"    _g.sort()\n    _number_{kind}(_g{top}, W, {j})")
            if caps[j] is not None:
                self.describe.append(f"numbers only the first {caps[j]} rows (the enclosing query keeps no more)")
                if self.kept is None and self.select.args.get("order") is None:  # `_finish` sorts E with O
                    lines.append(f"    _T = sorted(_x[1] for _x in _g{top})")
                    self.kept = "_T"
        self.describe.append("window: " + ", ".join(w.sql("duckdb") for w in windows))
        return lines

    def _ranked(
        self, windows: list[exp.Window], env: Any, items: list[tuple[str, exp.Expression]], body: list[str]
    ) -> bool:
        """Whether a top K is kept up to date between runs (partition/ranked.py) rather than sorted on each: then
        `body` is rewritten to ask for it.

        So it is for one `row_number()` capped by the enclosing query, over a
        scan of a table joined only by primary-key lookups, each row's part
        (filter, sort key) depending on nothing but its rows: no parameter,
        subquery or outer row, and no ORDER BY of its own.
        """
        if len(windows) != 1 or self.select.args.get("order") is not None or not self.sources:
            return False
        cap = self._row_cap(windows[0], items)
        first = self.sources[0]
        scan = _SCAN.fullmatch(first.loop)
        if cap is None or scan is None or self.outer or self.used_outer or self.subqueries or self.hoisted:
            return False
        if body[0] != _loop_line(first) or not body[-1].startswith("        E.append("):
            return False  # a condition checked once, before any row: not per row
        if any(s.table is None or not _LOOKUP.fullmatch(s.loop) for s in self.sources[1:]):
            return False
        env.windows = windows
        okey = _window_order_key(windows[0], env)
        if any(_READS_MORE.search(line) or line.startswith("         ") for line in [*body[1:], okey]):
            return False  # reads more than its rows, or a nested loop
        row = [f"    def _row({first.var}, _get):"]
        row += [re.sub(r": continue$", ": return None", line) for line in body[1:-1]]
        row.append(f"        return ({okey}, {body[-1].strip()[len('E.append(') : -1]})")
        table = scan.group(1)
        looked_up = tuple(dict.fromkeys(s.table for s in self.sources[1:] if s.table is not None))
        key = hashlib.sha1("\n".join([table, *looked_up, *row]).encode()).hexdigest()[:16]
        body[:] = [
            *row,
            f"    E, W = ctx.top_rows({key!r}, {table}, {looked_up!r}, _row, {cap})",
            "    _T = range(len(E))",
        ]
        self.kept = "_T"
        self.describe.append(f"the first {cap} by {windows[0].sql('duckdb')}, kept up to date as rows change")
        return True

    def _output_loop(self, unpack: str) -> str:
        """The loop over E's rows that builds the output: all of them, or a top K's only, in E's order."""
        if self.kept is None:
            return f"    for _i, ({unpack}) in enumerate(E):"
        return f"    for _i in {self.kept}:\n        {unpack} = E[_i]"

    def _row_cap(self, w: exp.Window, items: list[tuple[str, exp.Expression]]) -> int | None:
        """K when a condition moved in from the enclosing query keeps only rows `w` numbers at most K.

        Only for `row_number()` over the whole input: the rows after the first
        K are then numbered K + 1, which that condition rejects before any use.
        """
        if _window_kind(w.this) != "rownumber" or w.args.get("partition_by") or w.args.get("spec") is not None:
            return None
        names = {n for n, e in items if isinstance(e, exp.Window) and e.sql() == w.sql()}
        caps = []
        for c in self.pushed:
            column, bound, strict = None, None, False
            if isinstance(c, exp.LTE | exp.LT):
                column, bound, strict = c.this, c.expression, isinstance(c, exp.LT)
            elif isinstance(c, exp.GTE | exp.GT):
                column, bound, strict = c.expression, c.this, isinstance(c, exp.GT)
            if not isinstance(column, exp.Column) or column.name not in names:
                continue
            if isinstance(bound, exp.Literal) and not bound.is_string and bound.this.isdigit():
                caps.append(int(bound.this) - (1 if strict else 0))
        return min(caps) if caps else None

    # -------------------------------------------------- DISTINCT, ORDER BY
    def _finish(self, sel: exp.Select, codes: list[Code], names: list[str], env: Any, rows: str) -> list[str]:
        tail: list[str] = []
        if sel.args.get("distinct") is not None:
            tail.append("    O = list(dict.fromkeys(O))")
            self.describe.append("distinct")
        order = sel.args.get("order")
        if order is not None:
            if sel.args.get("distinct") is not None:
                raise Unsupported("DISTINCT with ORDER BY runs in DuckDB")
            keys = []
            for o in order.expressions:
                target = o.this
                pos = _position(target, names)
                if pos is not None:
                    src = f"_o[{pos}]"
                else:
                    if self.pushed:  # E pairs with O by position, and a moved-in filter left rows out of O
                        raise Unsupported("ORDER BY on a column the subquery does not output, under a moved filter")
                    c = env.compile(target)
                    src = None
                    keys.append((c, o))
                    continue
                keys.append((Code(src, codes[pos].type, False), o))
            unpack = env.unpack()
            key = "(" + "".join(_order_key(c, bool(o.args.get("desc")), _nulls_first(o)) for c, o in keys) + ")"
            tail.append(f"    _S = []\n    for _i, ({unpack}, _o) in enumerate(zip({rows}, O)):")
            tail.append(f"        _S.append(({key}, _i, _o))")
            tail.append("    _S.sort()\n    O = [_x[2] for _x in _S]")  # `_i` is unique: `_o` is never compared
            self.describe.append("order by " + ", ".join(o.sql("duckdb") for o in order.expressions))
        offset, limit = sel.args.get("offset"), sel.args.get("limit")
        lo = _constant_int(offset.expression) if offset is not None else 0
        hi = _constant_int(limit.expression) if limit is not None else None
        if lo or hi is not None:
            tail.append(f"    O = O[{lo}:{'' if hi is None else lo + hi}]")
            self.describe.append(f"limit {hi} offset {lo}")
        tail.append("    return O")
        return tail


def _window_kind(fn: exp.Expression) -> str | None:
    """ "rownumber", "rank" or "denserank" (the window functions that run compiled), else None."""
    if isinstance(fn, exp.RowNumber | exp.Rank | exp.DenseRank):
        return type(fn).__name__.lower()
    if isinstance(fn, exp.Anonymous) and fn.name.lower() in ("rank", "dense_rank", "row_number"):
        return fn.name.lower().replace("_", "")
    return None


def _window_orders(w: exp.Window) -> list[exp.Ordered]:
    order = w.args.get("order")
    return list(order.expressions) if order is not None else []


def _window_order_key(w: exp.Window, env: Any) -> str:
    """The sort key of a row for window `w`, as a tuple's source."""
    terms = [_order_key(env.compile(o.this), bool(o.args.get("desc")), _nulls_first(o)) for o in _window_orders(w)]
    return "(" + "".join(terms) + ")"


def _order_key(code: Code, desc: bool, nulls_first: bool) -> str:
    """One ORDER BY term's sort key (with a trailing comma): numbers sort without a wrapper object."""
    kind = code.type.kind
    if code.not_null and kind in ("int", "bool"):  # never NULL, never NaN: the value is its own key
        return f"-({code.source}), " if desc else f"{code.source}, "
    if kind in ("int", "bool"):  # never NaN: NULL's key sorts before or after every (1, value)
        value = "-_t" if desc else "_t"
        return f"((1, {value}) if (_t := {code.source}) is not None else ({0 if nulls_first else 2},)), "
    helper = "_number_key" if kind in ("int", "float", "bool") else "_sort_key"
    return f"{helper}({code.source}, {desc}, {nulls_first}), "


# ------------------------------------------------------------------ envs
_LOOKUP = re.compile(r"_(one|opt)\(ctx\.get\((.*)\)\)")
_SCAN = re.compile(r"ctx\.scan\(('\w+')\)")
_READS_MORE = re.compile(r"\bP\[|\bctx\b|\bS\d+\b")  # a parameter, the context, a subquery's result


def _over_columns_of(cond: exp.Expression, alias: str) -> bool:
    """Whether `cond` reads only columns (of `alias`, or unqualified), literals and parameters: no subquery,
    aggregate or window of its own."""
    if any(cond.find(kind) for kind in (exp.Subquery, exp.Exists, exp.Window, exp.Select, *AGGREGATES)):
        return False
    return all(col.table in ("", alias) for col in cond.find_all(exp.Column))


class _Outputs:
    """Expressions over a query's output columns, by name (each its projection's code)."""

    def __init__(self, names: Names, columns: dict[str, Code]) -> None:
        self.names = names
        self.columns = columns

    def column(self, node: exp.Column) -> Code:
        code = self.columns.get(node.name)
        if code is None:
            raise Unsupported(f"unknown column {node.sql('duckdb')}")
        return code

    def param(self, name: str) -> Code:
        return _param(self.names, name)

    def other(self, node: exp.Expression) -> Code:
        raise Unsupported(f"{node.sql('duckdb')} runs in DuckDB")


class _RowEnv:
    """Expressions over the current source rows (inside the loops)."""

    def __init__(self, planner: _Planner) -> None:
        self.planner = planner

    def column(self, node: exp.Column) -> Code:
        return self.planner._column(node)

    def param(self, name: str) -> Code:
        return _param(self.planner.names, name)

    def other(self, node: exp.Expression) -> Code:
        if isinstance(node, exp.Subquery | exp.Exists | exp.In):
            return self.planner._subquery(node)
        if isinstance(node, AGGREGATES):
            raise Unsupported(f"aggregate {node.sql('duckdb')} outside a grouped SELECT list")
        raise Unsupported(f"{node.sql('duckdb')} runs in DuckDB")


class _EnvRows:
    """Expressions over the environments of an ungrouped query (tuples of source rows), with window values."""

    def __init__(self, planner: _Planner, row_vars: list[str]) -> None:
        self.planner = planner
        self.row_vars = row_vars
        self.windows: list[exp.Window] = []

    def unpack(self) -> str:
        return f"({', '.join(self.row_vars)},)" if self.row_vars else "_"

    def compile(self, node: exp.Expression) -> Code:
        return compile_expr(node, self)

    def column(self, node: exp.Column) -> Code:
        return self.planner._column(node)

    def param(self, name: str) -> Code:
        return _param(self.planner.names, name)

    def other(self, node: exp.Expression) -> Code:
        if isinstance(node, exp.Window):
            return _window_value(self.windows, node)
        return _RowEnv(self.planner).other(node)


class _EnvGroups:
    """Expressions over groups: grouping keys (`_k`), aggregates (`_a`), window values (`W`)."""

    def __init__(
        self,
        planner: _Planner,
        keys: list[exp.Expression],
        key_codes: list[Code],
        aggs: list[exp.Expression],
        specs: list,
    ) -> None:
        self.planner = planner
        self.keys = {k.sql(): i for i, k in enumerate(keys)}
        self.key_codes = key_codes
        self.aggs = {a.sql(): j for j, a in enumerate(aggs)}
        self.specs = specs
        self.windows: list[exp.Window] = []

    def unpack(self) -> str:
        return "(_k, _a)"

    def compile(self, node: exp.Expression) -> Code:
        i = self.keys.get(node.sql())
        if i is not None:
            return Code(f"_k[{i}]", self.key_codes[i].type, False, not_null=self.key_codes[i].not_null)
        return compile_expr(node, self)

    def column(self, node: exp.Column) -> Code:
        i = self.keys.get(node.sql())
        if i is None:
            matches = [j for s, j in self.keys.items() if s.split(".")[-1] == node.name]
            if len(matches) != 1:
                raise Unsupported(f"column {node.sql('duckdb')} is neither grouped nor aggregated")
            i = matches[0]
        return Code(f"_k[{i}]", self.key_codes[i].type, False, not_null=self.key_codes[i].not_null)

    def param(self, name: str) -> Code:
        return _param(self.planner.names, name)

    def other(self, node: exp.Expression) -> Code:
        i = self.keys.get(node.sql())
        if i is not None:
            return Code(f"_k[{i}]", self.key_codes[i].type, False, not_null=self.key_codes[i].not_null)
        j = self.aggs.get(node.sql())
        if j is not None:
            return Code(f"_a[{j}]", self.specs[j].type, False, not_null=self.specs[j].not_null)
        if isinstance(node, exp.Window):
            return _window_value(self.windows, node)
        if isinstance(node, exp.Subquery | exp.Exists | exp.In):
            raise Unsupported("a subquery after GROUP BY runs in DuckDB")
        raise Unsupported(f"{node.sql('duckdb')} after GROUP BY runs in DuckDB")


def _param(names: Names, name: str) -> Code:
    t = names.params.get(name)
    if t is None:
        raise Unsupported(f"unknown parameter ${name}")
    return Code(f"P[{name!r}]", t, False)


def _read(src: Source, name: str) -> Code:
    at = repr(name) if src.positions is None else src.positions[name]
    if src.nullable:
        return Code(f"(None if {src.var} is None else {src.var}[{at}])", src.columns[name], False)
    return Code(f"{src.var}[{at}]", src.columns[name], False, not_null=name in src.not_null)


def _window_value(windows: list[exp.Window], node: exp.Window) -> Code:
    for j, w in enumerate(windows):
        if w is node or w.sql() == node.sql():
            return Code(f"W[_i][{j}]", T.BIGINT, False, not_null=True)
    raise Unsupported(f"window {node.sql('duckdb')}")


# ------------------------------------------------------------- aggregates
@dataclass(frozen=True)
class _AggSpec:
    init: str
    step: str  # a statement with `{a}` for the accumulator slot
    final: str  # a function of the accumulator
    type: SqlType
    not_null: bool = False  # counts
    adds: tuple[tuple[str, ...], str, str] | None = None  # as integer slots that add up: inits, step, final


def _adding_slots(specs: list[_AggSpec]) -> tuple[list[str], list[str], list[str]]:
    """Accumulators of `specs` as integer slots merged by addition, plus a last slot counting the group's rows."""
    inits: list[str] = []
    steps: list[str] = []
    finals: list[str] = []
    for s in specs:
        assert s.adds is not None
        slots, step, final = s.adds
        for i in range(len(slots)):
            step = step.replace(f"{{a{i}}}", f"_a[{len(inits) + i}]")
            final = final.replace(f"{{a{i}}}", f"_a[{len(inits) + i}]")
        inits += slots
        steps.append(step)
        finals.append(final)
    steps.append(f"_a[{len(inits)}] += 1")
    return [*inits, "0"], steps, finals


def _aggregate(node: exp.Expression, env: _RowEnv) -> _AggSpec:
    distinct = isinstance(node.this, exp.Distinct)
    arg = node.this.expressions[0] if distinct else node.this
    if isinstance(node, exp.Count):
        if isinstance(arg, exp.Star):
            return _AggSpec("0", "{a} += 1", "_same", T.BIGINT, True, (("0",), "{a0} += 1", "{a0}"))
        c = compile_expr(arg, env)
        if distinct:
            return _AggSpec("set()", f"_v = {c.source}\nif _v is not None: {{a}}.add(_v)", "len", T.BIGINT, True)
        counted = f"if ({c.source}) is not None: {{a0}} += 1"
        return _AggSpec("0", counted.replace("{a0}", "{a}"), "_same", T.BIGINT, True, (("0",), counted, "{a0}"))
    if distinct:
        raise Unsupported(f"{node.sql('duckdb')}: DISTINCT aggregates other than count run in DuckDB")
    c = compile_expr(arg, env)
    if isinstance(node, exp.Sum):
        if not c.type.is_integer:
            raise Unsupported(f"{node.sql('duckdb')}: a sum of {c.type.name} may round differently; it runs in DuckDB")
        return _AggSpec(
            "None",
            f"_v = {c.source}\nif _v is not None: {{a}} = _v if {{a}} is None else {{a}} + _v",
            "_hugeint",
            C.sum_type(c.type),
            adds=(
                ("0", "0"),
                f"_v = {c.source}\nif _v is not None:\n    {{a0}} += _v\n    {{a1}} += 1",
                "(None if {a1} == 0 else _hugeint({a0}))",
            ),
        )
    if c.type.kind not in ("int", "str", "bool"):
        raise Unsupported(f"{node.sql('duckdb')} over {c.type.name} runs in DuckDB")
    pick = "<" if isinstance(node, exp.Min) else ">"
    return _AggSpec(
        "None",
        f"_v = {c.source}\nif _v is not None and ({{a}} is None or _v {pick} {{a}}): {{a}} = _v",
        "_same",
        c.type,
    )


# --------------------------------------------------------------- helpers
def _plan_values(values: exp.Values, names: Names, gen: _Gen) -> Query:
    rows = values.expressions
    env = _ConstEnv(names)
    codes = [[compile_expr(v, env) for v in row.expressions] for row in rows]
    width = len(codes[0])
    if any(len(r) != width for r in codes):
        raise Unsupported("VALUES rows of different widths")
    types = []
    for i in range(width):
        t = codes[0][i].type
        for r in codes[1:]:
            t = C.common_type(t, r[i].type)
        types.append(t)
    fn = gen.name("q")
    casted = [
        "(" + "".join(f"{C.cast_source(c.source, c.type, t)}, " for c, t in zip(r, types, strict=True)) + ")"
        for r in codes
    ]
    source = f"def {fn}(ctx):\n    P = ctx.params\n    return [{', '.join(casted)}]"
    alias = values.args.get("alias")
    cols = [c.name for c in alias.columns] if alias is not None and alias.columns else [f"col{i}" for i in range(width)]
    return Query(cols, types, source, fn, [], [f"VALUES: {len(rows)} row(s)"])


class _ConstEnv:
    def __init__(self, names: Names) -> None:
        self.names = names

    def column(self, node: exp.Column) -> Code:
        raise Unsupported(f"column {node.sql('duckdb')} in VALUES")

    def param(self, name: str) -> Code:
        return _param(self.names, name)

    def other(self, node: exp.Expression) -> Code:
        raise Unsupported(f"{node.sql('duckdb')} in VALUES runs in DuckDB")


def _select_items(sel: exp.Select, sources: list[Source]) -> list[tuple[str, exp.Expression]]:
    items: list[tuple[str, exp.Expression]] = []
    for e in sel.expressions:
        if isinstance(e, exp.Star):
            for src in sources:
                items += [(c, exp.column(c, table=src.alias)) for c in src.columns]
            continue
        if isinstance(e, exp.Column) and isinstance(e.this, exp.Star):
            src = next((s for s in sources if s.alias == e.table), None)
            if src is None:
                raise Unsupported(f"{e.sql('duckdb')}: unknown relation")
            items += [(c, exp.column(c, table=src.alias)) for c in src.columns]
            continue
        if e.args.get("exclude") or e.args.get("replace"):
            raise Unsupported("* EXCLUDE / REPLACE runs in DuckDB")
        name = e.alias_or_name
        items.append((name, e.this if isinstance(e, exp.Alias) else e))
    return items


def _windows(sel: exp.Select) -> list[exp.Window]:
    found: list[exp.Window] = []
    for e in sel.expressions:
        for w in e.find_all(exp.Window):
            if not any(w.sql() == f.sql() for f in found):
                found.append(w)
    order = sel.args.get("order")
    if order is not None and any(o.find(exp.Window) for o in order.expressions):
        raise Unsupported("a window function in ORDER BY runs in DuckDB")
    return found


def _having_and_order(sel: exp.Select) -> list[exp.Expression]:
    out: list[exp.Expression] = []
    having = sel.args.get("having")
    if having is not None:
        out.append(having.this)
    order = sel.args.get("order")
    if order is not None:
        out += [o.this for o in order.expressions]
    return out


def _own_aggregates(node: exp.Expression) -> list[exp.Expression]:
    """The aggregate calls of this query level: not those of a subquery, nor a window function itself."""
    found: list[exp.Expression] = []
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, exp.Window):  # its function is not an aggregate of this level; its ORDER BY may hold one
            todo += [*(n.args.get("partition_by") or []), *([n.args["order"]] if n.args.get("order") else [])]
            continue
        if isinstance(n, AGGREGATES):
            found.append(n)
            continue
        if isinstance(n, exp.Subquery | exp.Select | exp.Exists) or (isinstance(n, exp.In) and n.args.get("query")):
            if isinstance(n, exp.In):
                todo.append(n.this)
            continue
        todo += [c for c in n.iter_expressions()]
    return found


def _inside_window(node: exp.Expression | None) -> bool:
    while node is not None:
        if isinstance(node, exp.Window):
            return True
        node = node.parent
    return False


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _position(node: exp.Expression, names: list[str]) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string:
        i = int(node.this) - 1
        if not 0 <= i < len(names):
            raise Unsupported(f"ORDER BY {node.this}: no such column")
        return i
    if isinstance(node, exp.Column) and not node.table and node.name in names and names.count(node.name) == 1:
        return names.index(node.name)
    return None


def _resolve_position(node: exp.Expression, items: list[tuple[str, exp.Expression]]) -> exp.Expression:
    if isinstance(node, exp.Literal) and not node.is_string:
        i = int(node.this) - 1
        if not 0 <= i < len(items):
            raise Unsupported(f"GROUP BY {node.this}: no such column")
        return items[i][1]
    return node


def _nulls_first(o: exp.Ordered) -> bool:
    return bool(o.args.get("nulls_first"))


def _constant_int(node: exp.Expression) -> int:
    if isinstance(node, exp.Literal) and not node.is_string:
        return int(node.this)
    raise Unsupported(f"LIMIT/OFFSET {node.sql('duckdb')}: only a constant runs compiled")


def _loop_line(src: Source, depth: int = 1) -> str:
    """The line opening the loop over `src`'s rows (at depth 1: the query's first source, no condition before it)."""
    return _indent(depth, f"for {src.var} in {src.loop}:")


def _indent(depth: int, line: str) -> str:
    return "    " * depth + line
