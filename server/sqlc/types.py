"""SQL types as the compiler sees them, and DuckDB's rules for the type of a mixed expression.

Values are the Python values DuckDB's own Python API returns: `int` for
every integer type, `float` for FLOAT and DOUBLE, `str` for VARCHAR, `bool`
for BOOLEAN. Types outside these kinds ("other": DECIMAL, DATE, TIMESTAMP,
nested types, ...) are carried through unchanged (read, compared to NULL,
stored into a column of the same type) but not computed on.

`max_type` is DuckDB's implicit cast resolution for integers, taken from
DuckDB itself (tests/unit/test_sqlc_expr.py checks every pair against it), in
its two forms: arithmetic, and everything else (`coalesce(tinyint_col,
utinyint_col)` is a SMALLINT, their sum a BIGINT). An integer literal takes
the type of the other operand when its value fits there (`tinyint_col + 100`
is a TINYINT), otherwise both widen as two typed values do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SqlType:
    """A DuckDB type: its canonical name and the kind of Python value that holds it."""

    name: str
    kind: str  # int | float | str | bool | null | other
    lo: int = 0  # integers: the range of values
    hi: int = 0

    @property
    def is_integer(self) -> bool:
        return self.kind == "int"

    def holds(self, value: int) -> bool:
        """Whether integer `value` is in this integer type's range."""
        return self.lo <= value <= self.hi


def _int(name: str, bits: int, signed: bool) -> SqlType:
    if signed:
        return SqlType(name, "int", -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return SqlType(name, "int", 0, 2**bits - 1)


TINYINT = _int("TINYINT", 8, True)
SMALLINT = _int("SMALLINT", 16, True)
INTEGER = _int("INTEGER", 32, True)
BIGINT = _int("BIGINT", 64, True)
HUGEINT = _int("HUGEINT", 128, True)
UTINYINT = _int("UTINYINT", 8, False)
USMALLINT = _int("USMALLINT", 16, False)
UINTEGER = _int("UINTEGER", 32, False)
UBIGINT = _int("UBIGINT", 64, False)
FLOAT = SqlType("FLOAT", "float")
DOUBLE = SqlType("DOUBLE", "float")
VARCHAR = SqlType("VARCHAR", "str")
BOOLEAN = SqlType("BOOLEAN", "bool")
NULL = SqlType('"NULL"', "null")

INTEGERS = (TINYINT, SMALLINT, INTEGER, BIGINT, HUGEINT, UTINYINT, USMALLINT, UINTEGER, UBIGINT)
_BY_NAME = {t.name: t for t in (*INTEGERS, FLOAT, DOUBLE, VARCHAR, BOOLEAN)}
_ALIASES = {
    "INT1": "TINYINT",
    "INT2": "SMALLINT",
    "SHORT": "SMALLINT",
    "INT": "INTEGER",
    "INT4": "INTEGER",
    "SIGNED": "INTEGER",
    "INT8": "BIGINT",
    "LONG": "BIGINT",
    "INT16": "HUGEINT",
    "INT128": "HUGEINT",
    "UINT8": "UTINYINT",
    "UINT16": "USMALLINT",
    "UINT32": "UINTEGER",
    "UINT64": "UBIGINT",
    "REAL": "FLOAT",
    "FLOAT4": "FLOAT",
    "FLOAT8": "DOUBLE",
    "BOOL": "BOOLEAN",
    "LOGICAL": "BOOLEAN",
    "TEXT": "VARCHAR",
    "STRING": "VARCHAR",
    "CHAR": "VARCHAR",
    "BPCHAR": "VARCHAR",
}

# The type DuckDB casts two typed integers to, by pair (symmetric), as DuckDB 1.x answers `typeof(...)`:
# for CASE, coalesce, least/greatest, comparisons and IN (`coalesce(1::A, 1::B)`), and for arithmetic
# (`1::A + 1::B`, also - * // %), which binds to its integer overloads and widens a mixed-sign pair further.
_ORDER = [t.name for t in INTEGERS]
_COMBINE_ROWS = {
    "TINYINT": "TINYINT SMALLINT INTEGER BIGINT HUGEINT SMALLINT INTEGER BIGINT HUGEINT",
    "SMALLINT": "SMALLINT SMALLINT INTEGER BIGINT HUGEINT SMALLINT INTEGER BIGINT HUGEINT",
    "INTEGER": "INTEGER INTEGER INTEGER BIGINT HUGEINT INTEGER INTEGER BIGINT HUGEINT",
    "BIGINT": "BIGINT BIGINT BIGINT BIGINT HUGEINT BIGINT BIGINT BIGINT HUGEINT",
    "HUGEINT": "HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT",
    "UTINYINT": "SMALLINT SMALLINT INTEGER BIGINT HUGEINT UTINYINT USMALLINT UINTEGER UBIGINT",
    "USMALLINT": "INTEGER INTEGER INTEGER BIGINT HUGEINT USMALLINT USMALLINT UINTEGER UBIGINT",
    "UINTEGER": "BIGINT BIGINT BIGINT BIGINT HUGEINT UINTEGER UINTEGER UINTEGER UBIGINT",
    "UBIGINT": "HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT UBIGINT UBIGINT UBIGINT UBIGINT",
}
_ARITHMETIC_ROWS = {
    "TINYINT": "TINYINT SMALLINT INTEGER BIGINT HUGEINT BIGINT BIGINT BIGINT HUGEINT",
    "SMALLINT": "SMALLINT SMALLINT INTEGER BIGINT HUGEINT SMALLINT BIGINT BIGINT HUGEINT",
    "INTEGER": "INTEGER INTEGER INTEGER BIGINT HUGEINT INTEGER INTEGER BIGINT HUGEINT",
    "BIGINT": "BIGINT BIGINT BIGINT BIGINT HUGEINT BIGINT BIGINT BIGINT HUGEINT",
    "HUGEINT": "HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT",
    "UTINYINT": "BIGINT SMALLINT INTEGER BIGINT HUGEINT UTINYINT USMALLINT UINTEGER UBIGINT",
    "USMALLINT": "BIGINT BIGINT INTEGER BIGINT HUGEINT USMALLINT USMALLINT UINTEGER UBIGINT",
    "UINTEGER": "BIGINT BIGINT BIGINT BIGINT HUGEINT UINTEGER UINTEGER UINTEGER UBIGINT",
    "UBIGINT": "HUGEINT HUGEINT HUGEINT HUGEINT HUGEINT UBIGINT UBIGINT UBIGINT UBIGINT",
}


def _table(rows: dict[str, str]) -> dict[tuple[str, str], SqlType]:
    return {(a, b): _BY_NAME[r] for a, row in rows.items() for b, r in zip(_ORDER, row.split(), strict=True)}


INTEGER_COMBINE = _table(_COMBINE_ROWS)
INTEGER_ARITHMETIC = _table(_ARITHMETIC_ROWS)


def parse_type(sql: str) -> SqlType:
    """The type a column or parameter declaration names (any spelling DuckDB accepts for the kinds above)."""
    text = " ".join(sql.strip().upper().split())
    base = re.sub(r"\s*\(.*\)$", "", text)
    if base in ("VARCHAR", "CHAR", "BPCHAR", "TEXT", "STRING") and text != base:
        return VARCHAR  # VARCHAR(n): DuckDB ignores the length
    name = _ALIASES.get(base, base) if text == base else text
    return _BY_NAME.get(name) or SqlType(name, "other")


def literal_type(value: int) -> SqlType:
    """The type DuckDB gives an integer literal standing alone."""
    for t in (INTEGER, BIGINT, HUGEINT):
        if t.holds(value):
            return t
    return SqlType("DOUBLE", "other")  # beyond HUGEINT DuckDB reads a DOUBLE; never computed on here


@dataclass(frozen=True)
class Arg:
    """An operand for type resolution: its type, and its value when it is an integer literal."""

    type: SqlType
    literal: int | None = None


def max_type(a: Arg, b: Arg, arithmetic: bool = False) -> SqlType | None:
    """The type both operands are cast to, as DuckDB resolves it; None when they are of different kinds.

    `arithmetic`: for + - * // % (DuckDB's integer overloads), else for CASE,
    coalesce, comparisons and the like.
    """
    ta, tb = a.type, b.type
    if ta.kind == "null":
        return tb
    if tb.kind == "null":
        return ta
    if ta.kind == "int" and tb.kind == "int":
        if a.literal is not None and b.literal is None and tb.holds(a.literal):
            return tb
        if b.literal is not None and a.literal is None and ta.holds(b.literal):
            return ta
        return (INTEGER_ARITHMETIC if arithmetic else INTEGER_COMBINE)[ta.name, tb.name]
    if {ta.kind, tb.kind} == {"int", "float"} and DOUBLE in (ta, tb) and HUGEINT not in (ta, tb):
        return DOUBLE
    if ta == tb and ta.kind != "other":
        return ta
    return None
