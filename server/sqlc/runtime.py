"""The scalar functions generated code calls: SQL's three-valued logic, checked arithmetic, casts, strings.

Each returns what DuckDB returns for the same values, or raises `Fallback`
where DuckDB would raise an error or where its answer is not stated exactly
here (an overflow, a division by zero, a non-ASCII string for upper()): the
statement then runs in DuckDB, which answers in its own words. Generated
code finds these in `NAMESPACE` under the names `expr.py` writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamtx.server.sqlc.casts import converter
from streamtx.server.sqlc.ctx import Fallback
from streamtx.server.sqlc.types import SqlType

NAMESPACE: dict[str, Any] = {}


def helper(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        NAMESPACE[name] = fn
        return fn

    return register


def cast_helper(source: SqlType, target: SqlType, try_: bool) -> str:
    """The name generated code calls to cast a `source` value to `target` (registered on first use)."""
    name = f"_cast_{source.name}_{target.name}{'_try' if try_ else ''}".replace('"', "")
    if name not in NAMESPACE:
        NAMESPACE[name] = converter(source, target, try_)
    return name


def checked(op: str, lo: int, hi: int) -> str:
    """The name of integer `op` (add, sub, mul, intdiv, mod, neg, abs) checked against [lo, hi]."""
    name = f"_{op}_{lo}_{hi}".replace("-", "m")
    if name not in NAMESPACE:
        NAMESPACE[name] = _CHECKED[op](lo, hi)
    return name


def _overflow(what: str) -> Fallback:
    return Fallback(f"overflow in {what}")


def _add(lo: int, hi: int) -> Callable[[Any, Any], Any]:
    def add(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        r = a + b
        if lo <= r <= hi:
            return r
        raise _overflow("addition")

    return add


def _sub(lo: int, hi: int) -> Callable[[Any, Any], Any]:
    def sub(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        r = a - b
        if lo <= r <= hi:
            return r
        raise _overflow("subtraction")

    return sub


def _mul(lo: int, hi: int) -> Callable[[Any, Any], Any]:
    def mul(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        r = a * b
        if lo <= r <= hi:
            return r
        raise _overflow("multiplication")

    return mul


def _intdiv(lo: int, hi: int) -> Callable[[Any, Any], Any]:
    def intdiv(a: Any, b: Any) -> Any:
        """Integer division truncating toward zero, as C and DuckDB divide (Python's // floors)."""
        if a is None or b is None:
            return None
        if b == 0:
            raise Fallback("division by zero")
        q = abs(a) // abs(b)
        r = q if (a < 0) == (b < 0) else -q
        if lo <= r <= hi:
            return r
        raise _overflow("division")

    return intdiv


def _mod(lo: int, hi: int) -> Callable[[Any, Any], Any]:
    def mod(a: Any, b: Any) -> Any:
        """The remainder with the dividend's sign, as C and DuckDB take it (Python's % takes the divisor's)."""
        if a is None or b is None:
            return None
        if b == 0:
            raise Fallback("division by zero")
        r = abs(a) % abs(b)
        return r if a >= 0 else -r

    return mod


def _neg(lo: int, hi: int) -> Callable[[Any], Any]:
    def neg(a: Any) -> Any:
        if a is None:
            return None
        if lo <= -a <= hi:
            return -a
        raise _overflow("negation")

    return neg


def _abs(lo: int, hi: int) -> Callable[[Any], Any]:
    def abs_(a: Any) -> Any:
        if a is None:
            return None
        if abs(a) <= hi:
            return abs(a)
        raise _overflow("abs")

    return abs_


_CHECKED = {"add": _add, "sub": _sub, "mul": _mul, "intdiv": _intdiv, "mod": _mod, "neg": _neg, "abs": _abs}


@helper("_fadd")
def fadd(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a + b


@helper("_fsub")
def fsub(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a - b


@helper("_fmul")
def fmul(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a * b


@helper("_fdiv")
def fdiv(a: Any, b: Any) -> Any:
    """`/`: the quotient as a DOUBLE (DuckDB's `/` of integers too)."""
    if a is None or b is None:
        return None
    if b == 0:
        raise Fallback("division by zero")
    return float(a) / float(b)


@helper("_fneg")
def fneg(a: Any) -> Any:
    return None if a is None else -a


@helper("_and")
def and_(*args: Any) -> bool | None:
    """AND of already evaluated operands: False wins over NULL."""
    if any(a is False for a in args):
        return False
    return None if any(a is None for a in args) else True


@helper("_or")
def or_(*args: Any) -> bool | None:
    """OR of already evaluated operands: True wins over NULL."""
    if any(a is True for a in args):
        return True
    return None if any(a is None for a in args) else False


@helper("_not")
def not_(a: Any) -> bool | None:
    return None if a is None else not a


def _fkey(v: float) -> tuple[int, float]:
    """DuckDB's order of doubles: NaN above everything and equal to itself."""
    return (1, 0.0) if v != v else (0, v)


def _comparison(name: str, test: Callable[[Any, Any], bool], floats: bool) -> None:
    if floats:

        def compare(a: Any, b: Any) -> bool | None:
            return None if a is None or b is None else test(_fkey(a), _fkey(b))
    else:

        def compare(a: Any, b: Any) -> bool | None:
            return None if a is None or b is None else test(a, b)

    NAMESPACE[name] = compare


for _op, _test in {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}.items():
    _comparison(f"_{_op}", _test, False)
    _comparison(f"_f{_op}", _test, True)


@helper("_distinct")
def is_distinct(a: Any, b: Any) -> bool:
    """IS DISTINCT FROM: NULL is a value like any other."""
    if a is None or b is None:
        return (a is None) != (b is None)
    return a != b


@helper("_in")
def in_(value: Any, options: tuple[Any, ...]) -> bool | None:
    """x IN (a, b, ...): NULL when x is NULL, or when x is not found and a NULL was among the options."""
    if value is None:
        return None
    if value in options:
        return True
    return None if None in options else False


@helper("_concat")
def concat(*parts: Any) -> Any:
    """`a || b`: NULL if any part is NULL."""
    if any(p is None for p in parts):
        return None
    return "".join(parts)


@helper("_concat_fn")
def concat_fn(*parts: Any) -> str:
    """concat(a, b, ...): NULL parts are left out."""
    return "".join(p for p in parts if p is not None)


def _ascii_text(name: str, fn: Callable[[str], Any]) -> None:
    """A string function DuckDB computes as Python does on ASCII text; other text is DuckDB's to judge."""

    def text(s: Any) -> Any:
        if s is None:
            return None
        if not s.isascii():
            raise Fallback(f"{name}() of non-ASCII text")
        return fn(s)

    NAMESPACE[f"_{name}"] = text


_ascii_text("upper", str.upper)
_ascii_text("lower", str.lower)
_ascii_text("length", len)  # DuckDB counts grapheme clusters: one per character in ASCII text


@helper("_least")
def least(*args: Any) -> Any:
    """least(...): the smallest non-NULL argument (NULL only if all are)."""
    present = [a for a in args if a is not None]
    return min(present) if present else None


@helper("_greatest")
def greatest(*args: Any) -> Any:
    present = [a for a in args if a is not None]
    return max(present) if present else None


@helper("_coalesce")
def coalesce(*args: Any) -> Any:
    for a in args:
        if a is not None:
            return a
    return None


@helper("_error")
def error(message: Any) -> Any:
    raise Fallback("error() raised: DuckDB words it")
