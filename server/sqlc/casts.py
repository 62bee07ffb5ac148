"""CAST as DuckDB does it, for the value kinds the compiler computes on.

`converter(source, target)` is the function that casts a value of type
`source` to `target`, or raises Unsupported at compile time when the pair
is outside the exact subset. At run time a value the cast cannot state
exactly (out of range, a string that is not plain digits, NaN) raises
`Fallback`: the statement then runs in DuckDB, which gives the value or the
error in its own words. Under TRY_CAST an out-of-range number is NULL.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any

from streamtx.server.sqlc import types as T
from streamtx.server.sqlc.ctx import Fallback
from streamtx.server.sqlc.errors import Unsupported
from streamtx.server.sqlc.types import SqlType

_DIGITS = re.compile(r"-?[0-9]+")


def identity(v: Any) -> Any:
    return v


def _out_of_range(v: Any, target: SqlType, try_: bool) -> None:
    if try_:
        return None
    raise Fallback(f"{v!r} is out of range for {target.name}")


def bind_value(value: Any, target: SqlType) -> Any:
    """A parameter's Python value as `CAST($x AS target)` makes it, binding it as DuckDB's Python API does."""
    if value is None:
        return None
    cls = type(value)
    if cls is int and target.kind == "int" and target.lo <= value <= target.hi:
        return value  # the common case ($ts, a key): nothing to cast
    if cls is bool:
        source = T.BOOLEAN
    elif cls is int:
        source = T.literal_type(value)
        if source.kind != "int":
            raise Fallback(f"parameter value {value!r}: DuckDB binds it")
    elif cls is float:
        source = T.DOUBLE
    elif cls is str:
        source = T.VARCHAR
    else:
        raise Fallback(f"a parameter of Python type {cls.__name__}: DuckDB binds it")
    if source == target:
        return value
    try:
        return converter(source, target)(value)
    except Unsupported:
        raise Fallback(f"a {source.name} parameter cast to {target.name}: DuckDB casts it") from None


@functools.cache
def converter(source: SqlType, target: SqlType, try_: bool = False) -> Callable[[Any], Any]:
    """The cast of a `source` value to `target` (NULL stays NULL)."""
    if source == target or source.kind == "null":
        return identity
    if target.kind == "int":
        return _to_int(source, target, try_)
    if target == T.DOUBLE:
        if source.kind == "int" and source != T.HUGEINT:
            return lambda v: None if v is None else float(v)
        if source == T.FLOAT:
            return identity  # a FLOAT value is already the double it widens to
    if target == T.VARCHAR:
        if source.kind == "int":
            return lambda v: None if v is None else str(v)
        if source.kind == "bool":
            return lambda v: None if v is None else ("true" if v else "false")
    if target == T.BOOLEAN and source.kind == "int":
        return lambda v: None if v is None else v != 0
    raise Unsupported(f"CAST from {source.name} to {target.name} runs in DuckDB")


def _to_int(source: SqlType, target: SqlType, try_: bool) -> Callable[[Any], Any]:
    lo, hi = target.lo, target.hi
    if source.kind == "int":
        if target.lo <= source.lo and source.hi <= target.hi:
            return identity

        def narrow(v: Any) -> Any:
            if v is None or lo <= v <= hi:
                return v
            return _out_of_range(v, target, try_)

        return narrow
    if source.kind == "bool":
        return lambda v: None if v is None else int(v)
    if source.kind == "float":

        def from_float(v: Any) -> Any:
            if v is None:
                return None
            if not math.isfinite(v):
                raise Fallback(f"{v!r} as {target.name}")
            n = round(v)  # half to even, as DuckDB rounds a double to an integer
            if not lo <= n <= hi:
                raise Fallback(f"{v!r} is out of range for {target.name}")
            return n

        return from_float
    if source.kind == "str":

        def from_str(v: Any) -> Any:
            if v is None:
                return None
            if _DIGITS.fullmatch(v) is None:
                raise Fallback(f"{v!r} as {target.name}: DuckDB parses it")
            n = int(v)
            return n if lo <= n <= hi else _out_of_range(v, target, try_)

        return from_str
    raise Unsupported(f"CAST from {source.name} to {target.name} runs in DuckDB")
