"""Scalar SQL expressions compiled to Python source, with DuckDB's types, NULLs and three-valued logic.

`compile_expr(node, env)` turns a sqlglot expression into a `Code`: Python
source over the row variables the environment names, its SQL type, and
whether evaluating it may raise `Fallback` (an overflow, a division by
zero, a cast DuckDB must judge). The environment resolves what the
expression language alone cannot: columns (`env.column`), parameters
(`env.param`), and everything else (`env.other`: subqueries, aggregates,
window functions), which it compiles or refuses.

The subset is what can be stated exactly: integer arithmetic in DuckDB's
result type (overflow falls back), DOUBLE arithmetic, comparisons of values
of one kind, AND/OR/NOT, IS [NOT] NULL, IN (list), BETWEEN, CASE, COALESCE,
LEAST/GREATEST, ||, concat, upper/lower/length, abs, CAST and TRY_CAST (see
`casts.py`), error(). Anything else raises Unsupported and the statement
runs in DuckDB.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Protocol

from sqlglot import exp

from streamtx.server.sqlc import runtime
from streamtx.server.sqlc import types as T
from streamtx.server.sqlc.errors import Unsupported
from streamtx.server.sqlc.types import Arg, SqlType


@dataclass(frozen=True)
class Code:
    """Python source computing a value of `type`; `fails`: it may raise Fallback for some inputs."""

    source: str
    type: SqlType
    fails: bool = False
    literal: int | None = None  # an integer literal's value: DuckDB types it by the other operand
    not_null: bool = False  # never NULL: comparisons and sort keys of integers need no NULL checks


class Env(Protocol):
    def column(self, node: exp.Column) -> Code: ...

    def param(self, name: str) -> Code: ...

    def other(self, node: exp.Expression) -> Code: ...


def compile_expr(node: exp.Expression, env: Any) -> Code:
    """`node` as Python source over `env`'s variables; Unsupported if outside the compiled subset."""
    return _Compiler(env).expr(node)


_PY_OPS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_SIMPLE = re.compile(r"\w+(\[[\w']+\])*|\(None if (\w+) is None else \2\['\w+'\]\)")
"""Sources cheap to evaluate twice and free of effects: a variable, a subscript, a column of a LEFT JOIN."""

_COMPARISONS = {exp.EQ: "eq", exp.NEQ: "ne", exp.LT: "lt", exp.LTE: "le", exp.GT: "gt", exp.GTE: "ge"}
_ARITHMETIC = {exp.Add: "add", exp.Sub: "sub", exp.Mul: "mul"}


class _Compiler:
    def __init__(self, env: Any) -> None:
        self.env = env

    def expr(self, node: exp.Expression) -> Code:
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is not None:
            return handler(node)
        for kind, op in _COMPARISONS.items():
            if isinstance(node, kind):
                return self._compare(op, node.this, node.expression)
        for kind, op in _ARITHMETIC.items():
            if isinstance(node, kind):
                return self._arith(op, node)
        return self.env.other(node)

    # ----------------------------------------------------------- leaves
    def _Column(self, node: exp.Column) -> Code:
        if isinstance(node.this, exp.Star):
            raise Unsupported(f"{node.sql('duckdb')} as a value")
        return self.env.column(node)

    def _Placeholder(self, node: exp.Placeholder) -> Code:
        if not node.name:
            raise Unsupported("positional parameters run in DuckDB")
        return self.env.param(node.name)

    def _Paren(self, node: exp.Paren) -> Code:
        return self.expr(node.this)

    def _Null(self, node: exp.Null) -> Code:
        return Code("None", T.NULL)

    def _Boolean(self, node: exp.Boolean) -> Code:
        return Code("True" if node.this else "False", T.BOOLEAN, not_null=True)

    def _Literal(self, node: exp.Literal) -> Code:
        if node.is_string:
            return Code(repr(node.this), T.VARCHAR, not_null=True)
        text = node.this
        if not text.isdigit():
            raise Unsupported(f"the number {text}: decimal and float literals run in DuckDB")
        return _int_literal(int(text))

    def _Neg(self, node: exp.Neg) -> Code:
        a = self.expr(node.this)
        if a.literal is not None:
            return _int_literal(-a.literal)
        if a.type.is_integer:
            return Code(f"{runtime.checked('neg', a.type.lo, a.type.hi)}({a.source})", a.type, True)
        if a.type == T.DOUBLE:
            return Code(f"_fneg({a.source})", a.type, a.fails)
        raise Unsupported(f"-x of {a.type.name} runs in DuckDB")

    # -------------------------------------------------------- arithmetic
    def _arith(self, op: str, node: exp.Expression) -> Code:
        a, b = self.expr(node.this), self.expr(node.expression)
        t = _result(a, b, node)
        if t.is_integer:
            return Code(f"{runtime.checked(op, t.lo, t.hi)}({a.source}, {b.source})", t, True)
        if t == T.DOUBLE:
            return Code(f"_f{op}({a.source}, {b.source})", t, a.fails or b.fails)
        raise Unsupported(f"{node.sql('duckdb')}: arithmetic on {t.name} runs in DuckDB")

    def _IntDiv(self, node: exp.IntDiv) -> Code:
        return self._division("intdiv", node)

    def _Mod(self, node: exp.Mod) -> Code:
        return self._division("mod", node)

    def _division(self, op: str, node: exp.Expression) -> Code:
        a, b = self.expr(node.this), self.expr(node.expression)
        t = _result(a, b, node)
        if not t.is_integer:
            raise Unsupported(f"{node.sql('duckdb')}: {op} of {t.name} runs in DuckDB")
        safe = b.literal is not None and b.literal not in (0, -1)  # no division by zero, no overflow
        return Code(f"{runtime.checked(op, t.lo, t.hi)}({a.source}, {b.source})", t, a.fails or not safe)

    def _Div(self, node: exp.Div) -> Code:
        a, b = self.expr(node.this), self.expr(node.expression)
        t = _result(a, b, node)
        if not (t.is_integer and t != T.HUGEINT) and t != T.DOUBLE:
            raise Unsupported(f"{node.sql('duckdb')}: / of {t.name} runs in DuckDB")
        return Code(f"_fdiv({a.source}, {b.source})", T.DOUBLE, True)

    def _Abs(self, node: exp.Abs) -> Code:
        a = self.expr(node.this)
        if not a.type.is_integer:
            raise Unsupported(f"abs() of {a.type.name} runs in DuckDB")
        return Code(f"{runtime.checked('abs', a.type.lo, a.type.hi)}({a.source})", a.type, True)

    # -------------------------------------------------------- comparison
    def _compare(self, op: str, left: exp.Expression, right: exp.Expression) -> Code:
        a, b = self.expr(left), self.expr(right)
        t = _comparable(a, b, left.parent)
        if t.kind == "null":
            return Code("None", T.BOOLEAN, a.fails or b.fails)
        if t.kind == "int" and a.not_null and b.not_null:  # two integers: Python compares them as DuckDB does
            return Code(f"({a.source} {_PY_OPS[op]} {b.source})", T.BOOLEAN, a.fails or b.fails, not_null=True)
        prefix = "_f" if t.kind == "float" else "_"
        return Code(f"{prefix}{op}({_as(a, t)}, {_as(b, t)})", T.BOOLEAN, a.fails or b.fails)

    def _NullSafeEQ(self, node: exp.NullSafeEQ) -> Code:
        return self._distinct(node, negate=True)

    def _NullSafeNEQ(self, node: exp.NullSafeNEQ) -> Code:
        return self._distinct(node, negate=False)

    def _distinct(self, node: exp.Expression, negate: bool) -> Code:
        a, b = self.expr(node.this), self.expr(node.expression)
        t = _comparable(a, b, node)
        if t.kind == "float":
            raise Unsupported("IS DISTINCT FROM on floating point values runs in DuckDB")
        src = f"_distinct({_as(a, t)}, {_as(b, t)})"
        return Code(f"(not {src})" if negate else src, T.BOOLEAN, a.fails or b.fails)

    def _Is(self, node: exp.Is) -> Code:
        a = self.expr(node.this)
        target = node.expression
        if _constant(a.source):
            a = Code(f"_same({a.source})", a.type, a.fails)  # `'x' is None` is a Python SyntaxWarning
        if isinstance(target, exp.Null):
            return Code(f"(({a.source}) is None)", T.BOOLEAN, a.fails)
        if isinstance(target, exp.Boolean) and a.type.kind in ("bool", "null"):
            return Code(f"(({a.source}) is {bool(target.this)})", T.BOOLEAN, a.fails)
        raise Unsupported(f"{node.sql('duckdb')} runs in DuckDB")

    def _Between(self, node: exp.Between) -> Code:
        if node.args.get("symmetric"):
            raise Unsupported("BETWEEN SYMMETRIC runs in DuckDB")
        x, lo, hi = self.expr(node.this), self.expr(node.args["low"]), self.expr(node.args["high"])
        t = _comparable(x, lo, node)
        t = _comparable(Code("", t), hi, node)
        if t.kind == "null":
            return Code("None", T.BOOLEAN, x.fails or lo.fails or hi.fails)
        prefix = "_f" if t.kind == "float" else "_"
        xs = _as(x, t)
        src = f"_and({prefix}ge({xs}, {_as(lo, t)}), {prefix}le({xs}, {_as(hi, t)}))"
        return Code(src, T.BOOLEAN, x.fails or lo.fails or hi.fails)

    def _In(self, node: exp.In) -> Code:
        if node.args.get("query") is not None or node.args.get("unnest") or node.args.get("field"):
            return self.env.other(node)
        x = self.expr(node.this)
        options = [self.expr(e) for e in node.expressions]
        t = x.type
        for o in options:
            t = _comparable(Code("", t, literal=x.literal if t == x.type else None), o, node)
        if t.kind in ("float", "other"):
            raise Unsupported(f"IN over {t.name} values runs in DuckDB")
        opts = "".join(f"{_as(o, t)}, " for o in options)
        fails = x.fails or any(o.fails for o in options)
        return Code(f"_in({_as(x, t)}, ({opts}))", T.BOOLEAN, fails)

    # ------------------------------------------------------------ logic
    def _And(self, node: exp.And) -> Code:
        return self._logic("_and", exp.And, node)

    def _Or(self, node: exp.Or) -> Code:
        return self._logic("_or", exp.Or, node)

    def _logic(self, fn: str, kind: type, node: exp.Expression) -> Code:
        """AND/OR with every operand evaluated, as DuckDB evaluates a projection's (an error is not skipped)."""
        parts = [self._boolean(p) for p in _flatten(node, kind)]
        return Code(f"{fn}({', '.join(p.source for p in parts)})", T.BOOLEAN, any(p.fails for p in parts))

    def _Not(self, node: exp.Not) -> Code:
        a = self._boolean(node.this)
        return Code(f"_not({a.source})", T.BOOLEAN, a.fails)

    def _boolean(self, node: exp.Expression) -> Code:
        c = self.expr(node)
        if c.type.kind not in ("bool", "null"):
            raise Unsupported(f"{node.sql('duckdb')} of type {c.type.name} as a condition runs in DuckDB")
        return c

    # ------------------------------------------------------ conditionals
    def _Case(self, node: exp.Case) -> Code:
        subject = node.this
        whens: list[tuple[Code, exp.Expression]] = []
        for branch in node.args.get("ifs") or []:
            cond = branch.this
            if subject is not None:
                whens.append((self._compare("eq", subject, cond), branch.args["true"]))
            else:
                whens.append((self._boolean(cond), branch.args["true"]))
        default = node.args.get("default")
        return self._conditional(whens, default, node)

    def _If(self, node: exp.If) -> Code:
        return self._conditional([(self._boolean(node.this), node.args["true"])], node.args.get("false"), node)

    def _conditional(
        self, whens: list[tuple[Code, exp.Expression]], default: exp.Expression | None, node: exp.Expression
    ) -> Code:
        """CASE: only the chosen branch is evaluated, as DuckDB evaluates each branch on its rows alone."""
        otherwise = self.expr(default) if default is not None else Code("None", T.NULL)
        values = [*(self.expr(v) for _, v in whens), otherwise]
        t = _common(values, node)
        src = _as(values[-1], t)
        for (cond, _), value in zip(reversed(whens), reversed(values[:-1]), strict=True):
            src = f"({_as(value, t)} if ({cond.source}) is True else {src})"
        fails = any(c.fails for c, _ in whens) or any(v.fails for v in values)
        return Code(src, t, fails)

    def _Coalesce(self, node: exp.Coalesce) -> Code:
        args = [self.expr(a) for a in [node.this, *node.expressions]]
        t = _common(args, node)
        sources = [_as(a, t) for a in args]
        fails, not_null = any(a.fails for a in args), any(a.not_null for a in args)
        if len(args) == 2 and _SIMPLE.fullmatch(sources[0]):  # read twice rather than called
            return Code(f"({sources[0]} if {sources[0]} is not None else {sources[1]})", t, fails, not_null=not_null)
        return Code(f"_coalesce({', '.join(sources)})", t, fails, not_null=not_null)

    def _Least(self, node: exp.Least) -> Code:
        return self._extreme("_least", node)

    def _Greatest(self, node: exp.Greatest) -> Code:
        return self._extreme("_greatest", node)

    def _extreme(self, fn: str, node: exp.Expression) -> Code:
        args = [self.expr(a) for a in [node.this, *node.expressions]]
        t = _common(args, node)
        if t.kind not in ("int", "str", "bool"):
            raise Unsupported(f"{node.sql('duckdb')} over {t.name} runs in DuckDB")
        return Code(f"{fn}({', '.join(_as(a, t) for a in args)})", t, any(a.fails for a in args))

    # ------------------------------------------------------------ text
    def _DPipe(self, node: exp.DPipe) -> Code:
        parts = [self._text(p) for p in _flatten(node, exp.DPipe)]
        if any(p.type.kind == "null" for p in parts):  # DuckDB folds `x || NULL` to a NULL of type "NULL"
            return Code("None", T.NULL, any(p.fails for p in parts))
        return Code(f"_concat({', '.join(p.source for p in parts)})", T.VARCHAR, any(p.fails for p in parts))

    def _Concat(self, node: exp.Concat) -> Code:
        parts = [self._text(p) for p in node.expressions]
        return Code(f"_concat_fn({', '.join(p.source for p in parts)})", T.VARCHAR, any(p.fails for p in parts))

    def _text(self, node: exp.Expression) -> Code:
        c = self.expr(node)
        if c.type.kind in ("str", "null"):
            return c
        if c.type.kind in ("int", "bool"):
            return Code(_as(c, T.VARCHAR), T.VARCHAR, c.fails)
        raise Unsupported(f"{node.sql('duckdb')} of type {c.type.name} as text runs in DuckDB")

    def _Upper(self, node: exp.Upper) -> Code:
        return self._string_fn("_upper", node, T.VARCHAR)

    def _Lower(self, node: exp.Lower) -> Code:
        return self._string_fn("_lower", node, T.VARCHAR)

    def _Length(self, node: exp.Length) -> Code:
        return self._string_fn("_length", node, T.BIGINT)

    def _string_fn(self, fn: str, node: exp.Expression, result: SqlType) -> Code:
        a = self.expr(node.this)
        if a.type.kind != "str":
            raise Unsupported(f"{node.sql('duckdb')} of {a.type.name} runs in DuckDB")
        return Code(f"{fn}({a.source})", result, True)

    # ------------------------------------------------------------ casts
    def _Cast(self, node: exp.Cast) -> Code:
        return self._cast(node, False)

    def _TryCast(self, node: exp.TryCast) -> Code:
        return self._cast(node, True)

    def _cast(self, node: exp.Expression, try_: bool) -> Code:
        a = self.expr(node.this)
        target = T.parse_type(node.args["to"].sql("duckdb"))
        if target.kind == "other" or a.type == target:
            if a.type == target:
                return Code(a.source, target, a.fails)
            raise Unsupported(f"CAST to {target.name} runs in DuckDB")
        name = runtime.cast_helper(a.type, target, try_)
        return Code(f"{name}({a.source})", target, True)

    # -------------------------------------------------------- functions
    def _Anonymous(self, node: exp.Anonymous) -> Code:
        if node.name.lower() == "error" and len(node.expressions) == 1:
            a = self.expr(node.expressions[0])
            return Code(f"_error({a.source})", T.NULL, True)
        return self.env.other(node)


def _int_literal(value: int) -> Code:
    t = T.literal_type(value)
    if t.kind != "int":
        raise Unsupported(f"the number {value}: beyond HUGEINT, DuckDB reads a DOUBLE")
    return Code(repr(value), t, False, value, not_null=True)


def _arg(c: Code) -> Arg:
    return Arg(c.type, c.literal)


def _result(a: Code, b: Code, node: exp.Expression) -> SqlType:
    t = T.max_type(_arg(a), _arg(b), arithmetic=True)
    if t is None or t.kind not in ("int", "float"):
        raise Unsupported(f"{node.sql('duckdb')}: arithmetic on {a.type.name} and {b.type.name} runs in DuckDB")
    return t


def _comparable(a: Code, b: Code, node: exp.Expression | None) -> SqlType:
    """The type two operands are compared in; Unsupported if DuckDB would compare them after a cast not done here."""
    t = T.max_type(_arg(a), _arg(b))
    if t is None or t.kind == "other":
        raise Unsupported(f"{_where(node)}: comparing {a.type.name} with {b.type.name} runs in DuckDB")
    if t.kind == "float" and T.FLOAT in (a.type, b.type):
        raise Unsupported(f"{_where(node)}: FLOAT comparisons run in DuckDB")
    return t


def _where(node: exp.Expression | None) -> str:
    return node.sql("duckdb") if node is not None else "a comparison"


def _common(values: list[Code], node: exp.Expression) -> SqlType:
    t = values[0].type
    lit = values[0].literal
    for v in values[1:]:
        found = T.max_type(Arg(t, lit), _arg(v))
        if found is None:
            raise Unsupported(f"{node.sql('duckdb')}: mixing {t.name} and {v.type.name} runs in DuckDB")
        lit = lit if (found == t and v.type.kind == "null") else None
        t = found
    return t


def _as(c: Code, t: SqlType) -> str:
    """`c` converted to `t` where the Python value changes (an int used as a DOUBLE, a number as text)."""
    if c.type == t or c.type.kind == "null" or (c.type.is_integer and t.is_integer):
        return c.source
    if c.literal is not None and t == T.DOUBLE:
        return repr(float(c.literal))
    return f"{runtime.cast_helper(c.type, t, False)}({c.source})"


def _constant(source: str) -> bool:
    try:
        ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return False
    return True


def _flatten(node: exp.Expression, kind: type) -> list[exp.Expression]:
    if isinstance(node, kind):
        return _flatten(node.this, kind) + _flatten(node.expression, kind)
    return [node]
