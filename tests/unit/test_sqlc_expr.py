"""Compiled scalar expressions (server/sqlc/expr.py) against DuckDB, value by value.

Random expressions over typed columns holding random values (NULLs and
the ends of each range included) are evaluated both ways. Where the
compiled code gives a value, DuckDB must give the same value of the same
type without an error; where it falls back (an overflow, a division by
zero, a cast DuckDB must judge), DuckDB is the one that answers, so there is
nothing to compare. The type rules themselves are checked pair by pair.
"""

from __future__ import annotations

import math
import os
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp, parse_one

from streamtx.server.sqlc import relational
from streamtx.server.sqlc import types as T
from streamtx.server.sqlc.ctx import Fallback
from streamtx.server.sqlc.errors import Unsupported
from streamtx.server.sqlc.expr import Code, compile_expr

EXAMPLES = int(os.environ.get("SQLC_EXAMPLES", "300"))

COLUMNS = {
    "a": T.BIGINT,
    "b": T.INTEGER,
    "c": T.TINYINT,
    "u": T.UTINYINT,
    "d": T.DOUBLE,
    "s": T.VARCHAR,
    "t": T.VARCHAR,
    "f": T.BOOLEAN,
}


class _Env:
    def column(self, node: exp.Column) -> Code:
        if node.name not in COLUMNS:
            raise Unsupported(f"unknown column {node.name}")
        return Code(f"R[{node.name!r}]", COLUMNS[node.name])

    def param(self, name: str) -> Code:
        raise Unsupported("no parameters here")

    def other(self, node: exp.Expression) -> Code:
        raise Unsupported(f"{node.sql('duckdb')} runs in DuckDB")


def _int_values(t: T.SqlType) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(-5, 5).filter(t.holds), st.sampled_from([t.lo, t.hi, t.lo + 1, t.hi - 1]))


VALUES = {
    "a": _int_values(T.BIGINT),
    "b": _int_values(T.INTEGER),
    "c": _int_values(T.TINYINT),
    "u": _int_values(T.UTINYINT),
    "d": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 2.5, -2.5, 1e300])),
    "s": st.sampled_from(["", "a", "B", "12", "-7", "ä", "x y", "ß"]),
    "t": st.sampled_from(["a", "zz", "007", "ǅ"]),
    "f": st.booleans(),
}
ROWS = st.fixed_dictionaries({k: st.one_of(st.none(), v) for k, v in VALUES.items()})

LEAVES = st.sampled_from(
    [*COLUMNS, "0", "1", "-1", "2", "100", "3000000000", "'a'", "'12'", "NULL", "TRUE", "FALSE", "2.5"]
)
UNARY = ["-({})", "NOT ({})", "({}) IS NULL", "({}) IS NOT NULL", "upper({})", "lower({})", "length({})", "abs({})"]
UNARY += [f"CAST({{}} AS {t})" for t in ("INTEGER", "BIGINT", "TINYINT", "UTINYINT", "DOUBLE", "VARCHAR", "BOOLEAN")]
UNARY += ["TRY_CAST({} AS TINYINT)", "TRY_CAST({} AS INTEGER)"]
BINARY = ["+", "-", "*", "//", "%", "/", "=", "<>", "<", "<=", ">", ">=", "AND", "OR", "||", "IS DISTINCT FROM"]
CALLS = ["coalesce({}, {})", "least({}, {})", "greatest({}, {})", "concat({}, {})", "({}) IN ({}, 1, NULL)"]
CALLS += ["CASE WHEN {} THEN {} END", "({}) BETWEEN 0 AND ({})", "CASE {} WHEN 1 THEN 'one' ELSE {} END"]


def expressions() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(st.sampled_from(UNARY), inner).map(lambda p: p[0].format(p[1])),
            st.tuples(inner, st.sampled_from(BINARY), inner).map(lambda p: f"({p[0]}) {p[1]} ({p[2]})"),
            st.tuples(st.sampled_from(CALLS), inner, inner).map(lambda p: p[0].format(p[1], p[2])),
        )

    return st.recursive(LEAVES, extend, max_leaves=6)


def _duckdb(con: duckdb.DuckDBPyConnection, sql: str, row: dict[str, Any]) -> tuple[Any, str]:
    cols = ", ".join(f"CAST(${k} AS {t.name}) AS {k}" for k, t in COLUMNS.items())
    return con.execute(f"SELECT ({sql}), typeof({sql}) FROM (SELECT {cols})", row).fetchone()


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
    return type(x) is type(y) and x == y


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    return duckdb.connect()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(sql=expressions(), rows=st.lists(ROWS, min_size=1, max_size=4))
def test_compiled_expressions_give_duckdbs_values(con: duckdb.DuckDBPyConnection, sql: str, rows: list) -> None:
    try:
        code = compile_expr(parse_one(sql, read="duckdb"), _Env())
    except Unsupported:
        return
    ns = relational.namespace()
    fn = eval(compile(f"lambda R: {code.source}", "<test>", "eval"), ns)
    for row in rows:
        try:
            got = fn(row)
        except Fallback:
            continue  # DuckDB answers this one
        try:
            want, typ = _duckdb(con, sql, row)
        except duckdb.Error as e:
            pytest.fail(f"{sql} on {row}: compiled gave {got!r}, DuckDB raised {e}")
        assert _same(got, want), f"{sql} on {row}: compiled {got!r}, DuckDB {want!r}"
        if code.type.kind != "null":
            assert typ == code.type.name, f"{sql}: compiled type {code.type.name}, DuckDB {typ}"


@pytest.mark.parametrize("a", T.INTEGERS, ids=lambda t: t.name)
def test_integer_result_types_are_duckdbs(con: duckdb.DuckDBPyConnection, a: T.SqlType) -> None:
    for b in T.INTEGERS:
        (plus, both) = con.execute(
            f"SELECT typeof(1::{a.name} + 1::{b.name}), typeof(coalesce(1::{a.name}, 1::{b.name}))"
        ).fetchone()
        assert T.max_type(T.Arg(a), T.Arg(b), arithmetic=True).name == plus, (a.name, "+", b.name)
        assert T.max_type(T.Arg(a), T.Arg(b)).name == both, (a.name, "coalesce", b.name)
    for value in (-1, 200, 70000, 3_000_000_000, -3_000_000_000, 10**19):
        (plus, both) = con.execute(
            f"SELECT typeof(1::{a.name} + {value}), typeof(coalesce(1::{a.name}, {value}))"
        ).fetchone()
        lit = T.Arg(T.literal_type(value), value)
        assert T.max_type(T.Arg(a), lit, arithmetic=True).name == plus, (a.name, "+", value)
        assert T.max_type(T.Arg(a), lit).name == both, (a.name, "coalesce", value)


def test_what_is_not_compiled_says_why() -> None:
    for sql, why in [
        ("a + 2.5", "decimal"),
        ("d // 2", "DOUBLE"),
        ("s = 1", "comparing VARCHAR with INTEGER"),
        ("md5(s)", "runs in DuckDB"),
    ]:
        with pytest.raises(Unsupported, match=why):
            compile_expr(parse_one(sql, read="duckdb"), _Env())
