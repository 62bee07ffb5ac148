"""Values as tables and streams hold them: the cast an INSERT applies, result types in Arrow, comparable keys.

An INSERT (or UPDATE) casts each value to its column's type as CAST does
(`casts.converter`): '12' into an INTEGER column is 12, 2.5 is 2. A result
returned to a caller, or emitted on a stream, is an Arrow table of the types
DuckDB's own export gives (a HUGEINT as decimal128(38, 0)).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from streamtx.server.sqlc import types as T
from streamtx.server.sqlc.casts import converter
from streamtx.server.sqlc.errors import Unsupported
from streamtx.server.sqlc.runtime import cast_helper
from streamtx.server.sqlc.types import Arg, SqlType

_ARROW = {
    "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(),
    "SMALLINT": pa.int16(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "UTINYINT": pa.uint8(),
    "USMALLINT": pa.uint16(),
    "UINTEGER": pa.uint32(),
    "UBIGINT": pa.uint64(),
    "HUGEINT": pa.decimal128(38, 0),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "VARCHAR": pa.string(),
}


def arrow_type(t: SqlType) -> pa.DataType:
    """The Arrow type DuckDB exports `t` as; Unsupported for a type the compiler only passes along."""
    found = _ARROW.get(t.name)
    if found is None:
        raise Unsupported(f"a result column of type {t.name}: produced by DuckDB")
    return found


def caster(source: SqlType, target: SqlType) -> Callable[[Any], Any]:
    """The cast an INSERT applies to a value of `source` stored in a column of `target` (Unsupported if none)."""
    return converter(source, target)


def cast_source(source: str, from_: SqlType, to: SqlType) -> str:
    """Python source casting the value `source` computes, as CAST does."""
    return source if from_ == to else f"{cast_helper(from_, to, False)}({source})"


def common_type(a: SqlType, b: SqlType) -> SqlType:
    """The type DuckDB gives a column of VALUES rows of types `a` and `b`."""
    t = T.max_type(Arg(a), Arg(b))
    if t is None:
        raise Unsupported(f"VALUES mixing {a.name} and {b.name}")
    return t


def same_key_kind(a: SqlType, b: SqlType) -> bool:
    """Whether a value of `a` finds a key of `b` by equality in a dict as DuckDB's `=` finds it.

    Integers of any width, strings and booleans compare as Python compares them; floating
    point keys do not (NaN is equal to itself in DuckDB), nor values of different kinds.
    """
    return a.kind == b.kind and a.kind in ("int", "str", "bool")


def sum_type(t: SqlType) -> SqlType:
    """sum() of an integer type: HUGEINT, as DuckDB widens it."""
    return T.HUGEINT
