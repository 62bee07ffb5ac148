"""Encoding of relations on the wire: Arrow IPC bytes and typed protobuf rows.

Shared by the server (decode and check what producers send) and the client
(encode what it pushes, decode what it reads). Every decoding error is an
`InvalidArgument` whose message names the column and the row at fault.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import math
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamtx.errors import InvalidArgument
from streamtx.v1 import streamtx_pb2 as pb


def table_to_ipc(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes of a table (one or more record batches)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def ipc_to_table(data: bytes, what: str = "arrow_ipc") -> pa.Table:
    """Decodes Arrow IPC stream bytes; malformed or truncated input is InvalidArgument."""
    if not data:
        raise InvalidArgument(f"{what}: empty Arrow IPC payload")
    try:
        with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
            return reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as e:
        raise InvalidArgument(f"{what}: malformed or truncated Arrow IPC stream: {e}") from None


def value_to_py(value: pb.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "list_value":
        return [value_to_py(v) for v in value.list_value.values]
    return getattr(value, kind)


def py_to_value(obj: Any) -> pb.Value:
    """A protobuf Value for a Python scalar; raises InvalidArgument for other types."""
    if obj is None:
        return pb.Value()
    if isinstance(obj, bool):
        return pb.Value(bool_value=obj)
    if isinstance(obj, int):
        return pb.Value(int_value=obj)
    if isinstance(obj, float):
        return pb.Value(double_value=obj)
    if isinstance(obj, str):
        return pb.Value(string_value=obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        return pb.Value(bytes_value=bytes(obj))
    if isinstance(obj, list | tuple):
        return pb.Value(list_value=pb.ValueList(values=[py_to_value(v) for v in obj]))
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return py_to_value(obj.tolist())
    raise InvalidArgument(f"cannot encode a value of type {type(obj).__name__}: {obj!r}")


def params_to_proto(params: Mapping[str, Any] | None) -> dict[str, pb.Value]:
    return {name: py_to_value(v) for name, v in (params or {}).items()}


def params_from_proto(params: Mapping[str, pb.Value]) -> dict[str, Any]:
    return {name: value_to_py(v) for name, v in params.items()}


def table_to_rows(table: pa.Table) -> pb.Rows:
    """Typed protobuf rows for a table (the path for clients without Arrow).

    Each value in the form `rows_to_table` reads back into the same column
    type: integers (and whole DECIMALs of scale 0, e.g. a SUM over BIGINT)
    as int_value when they fit 64 bits, as text beyond; other DECIMALs as
    text; TIMESTAMPs, DATEs and TIMEs as ISO-8601 text, or beyond Python's
    years 1 to 9999 as their number (days, or units since 1970-01-01).
    """
    columns = [[_row_value(v, col.type) for v in _plain_values(col)] for col in table.columns]
    rows = [pb.Row(values=[col[r] for col in columns]) for r in range(table.num_rows)]
    return pb.Rows(columns=table.column_names, rows=rows)


def _plain_values(col: pa.ChunkedArray) -> list[Any]:
    plain = _plain(col.type)
    return (col if plain == col.type else col.cast(plain)).to_pylist()  # (Arrow breaks a list<null> cast to itself)


def _row_value(obj: Any, kind: pa.DataType) -> pb.Value:
    if obj is None:
        return pb.Value()
    if _is_list(kind):
        return pb.Value(list_value=pb.ValueList(values=[_row_value(v, kind.value_type) for v in obj]))
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_time(kind):
        text = _temporal_text(obj, kind)
        return pb.Value(int_value=obj) if text is None else pb.Value(string_value=text)
    if isinstance(obj, decimal.Decimal):
        if int(obj.as_tuple().exponent) >= 0 and -(2**63) <= obj < 2**63:
            return pb.Value(int_value=int(obj))
        return pb.Value(string_value=format(obj, "f"))
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**63:
        return pb.Value(string_value=str(obj))  # a UBIGINT beyond int64
    return py_to_value(obj)


_EPOCH = datetime.datetime(1970, 1, 1)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _temporal_text(value: int, kind: pa.DataType) -> str | None:
    """ISO-8601 text of a date, time or timestamp given as its number; None beyond Python's years 1 to 9999."""
    if pa.types.is_date(kind):
        days = value // 86_400_000 if pa.types.is_date64(kind) else value
        try:
            return (_EPOCH.date() + datetime.timedelta(days=days)).isoformat()
        except OverflowError:
            return None
    seconds, part = divmod(value, _PER_SECOND[kind.unit])
    if not -(2**63) <= seconds * _PER_SECOND[kind.unit] < 2**63:
        return None  # the last second before int64's end: Arrow's parser would overflow reading it back
    fraction = _fraction(part, kind.unit)
    if pa.types.is_time(kind):
        return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}{fraction}"
    try:
        text = (_EPOCH + datetime.timedelta(seconds=seconds)).isoformat(sep=" ")
    except OverflowError:
        return None
    return text + fraction + ("+00:00" if kind.tz else "")


def _fraction(part: int, unit: str) -> str:
    """Digits after the second: microseconds, or nanoseconds when there are any."""
    nanos = part * (1_000_000_000 // _PER_SECOND[unit])
    if not nanos:
        return ""
    return f".{nanos // 1000:06d}" if nanos % 1000 == 0 else f".{nanos:09d}"


def rows_to_table(rows: pb.Rows, schema: pa.Schema, what: str) -> pa.Table:
    """Decodes protobuf rows into `schema`, converting each value to its column type.

    Columns may be given in any order (`rows.columns`) or, when omitted, in schema
    order. A missing, unknown or ill-typed value is InvalidArgument naming it.
    """
    names = list(rows.columns) or schema.names
    _check_columns(names, schema, what)
    width = len(names)
    columns: list[list[Any]] = [[] for _ in names]
    for r, row in enumerate(rows.rows):
        if len(row.values) != width:
            raise InvalidArgument(
                f"{what}: row {r} has {len(row.values)} values, expected {width} ({', '.join(names)})"
            )
        for c, value in enumerate(row.values):
            columns[c].append(value_to_py(value))
    arrays = {}
    for name, values in zip(names, columns, strict=True):
        field = schema.field(name)
        arrays[name] = _to_array(values, field, what)
    return pa.table([arrays[name] for name in schema.names], schema=schema)


def _to_array(values: list[Any], field: pa.Field, what: str, rows: list[int] | None = None) -> pa.Array:
    """The column's values as `field.type`, each exactly: a value that would be rounded is refused.

    A string in a column of another type is read as the Arrow path reads a
    string column (`conform`): "12" for a BIGINT, ISO-8601 for a TIMESTAMP or
    DATE, "1.50" for a DECIMAL(10,2); one that does not convert exactly is refused.
    A list is read element by element, by the same rules. `rows` numbers the
    values in messages (an element: the row its list is in).
    """
    kind = field.type
    rows = rows or list(range(len(values)))
    if _is_list(kind):
        return _list_array(values, field, what, rows)
    for r, v in zip(rows, values, strict=True):
        if isinstance(v, bool) and not pa.types.is_boolean(kind):
            raise InvalidArgument(f"{what}: column {field.name!r} row {r}: value {v!r} is not a {sql_name(kind)}")
    if any(isinstance(v, float) for v in values):
        pairs = zip(rows, values, strict=True)
        values = [_exact_float(v, field, r, what) if isinstance(v, float) else v for r, v in pairs]
    if not _textual(kind) and any(isinstance(v, str) for v in values):
        values = _from_text(values, field, what, rows)
    try:
        array = pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        for r, v in zip(rows, values, strict=True):
            try:
                pa.array([v], type=kind)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
                raise InvalidArgument(
                    f"{what}: column {field.name!r} row {r}: value {v!r} is not a {sql_name(kind)}"
                ) from None
        raise
    _check_times(array, field.name, what, rows)
    return array


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _list_array(values: list[Any], field: pa.Field, what: str, rows: list[int]) -> pa.Array:
    kind = field.type
    size = kind.list_size if pa.types.is_fixed_size_list(kind) else None
    offsets, items, parents, missing = [0], [], [], []
    for r, v in zip(rows, values, strict=True):
        if v is not None and (not isinstance(v, list) or size is not None and len(v) != size):
            raise InvalidArgument(f"{what}: column {field.name!r} row {r}: value {v!r} is not a {sql_name(kind)}")
        missing.append(v is None)
        items += v or ([None] * size if size else [])
        parents += [r] * (size if v is None and size else len(v or []))
        offsets.append(len(items))
    inner = _to_array(items, pa.field(field.name, kind.value_type), what, parents)
    mask = pa.array(missing, pa.bool_())
    if size is not None:
        return pa.FixedSizeListArray.from_arrays(inner, size, mask=mask)
    cls, width = (pa.LargeListArray, pa.int64()) if pa.types.is_large_list(kind) else (pa.ListArray, pa.int32())
    return cls.from_arrays(pa.array(offsets, width), inner, type=kind, mask=mask)


def _check_times(array: pa.Array, column: str, what: str, rows: list[int] | range) -> None:
    """A TIME is a time of day, 00:00:00 to 24:00:00: Arrow's time type holds any number."""
    if not pa.types.is_time64(array.type):
        return
    day = DAY_NS if array.type.unit == "ns" else DAY_NS // 1000
    numbers = array.cast(pa.int64())
    bad = pc.or_(pc.less(numbers, 0), pc.greater(numbers, day))
    if not pc.any(bad).as_py():
        return
    i = pc.index(bad, True).as_py()
    raise InvalidArgument(
        f"{what}: column {column!r} row {rows[i]}: {numbers[i].as_py()} {array.type.unit} since midnight "
        "is not a TIME (00:00:00 to 24:00:00)"
    )


def _textual(kind: pa.DataType) -> bool:
    return _is_text(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _from_text(values: list[Any], field: pa.Field, what: str, rows: list[int]) -> list[Any]:
    at = [i for i, v in enumerate(values) if isinstance(v, str)]
    parsed = _parse_text(pa.array([values[i] for i in at], pa.string()), field, what, [rows[i] for i in at])
    out = list(values)
    for i, v in zip(at, parsed.cast(_plain(field.type)).to_pylist(), strict=True):
        out[i] = v
    return out


def _parse_text(texts: pa.Array, field: pa.Field, what: str, rows: list[int] | range) -> pa.Array:
    """Strings read as `field.type` (the i-th is row `rows[i]`): the one reading of text, Rows or Arrow.

    Arrow parses numbers and ISO-8601 times, but wraps a decimal of 39 digits
    or more around 128 bits and reads no TIME: those are parsed here, exactly.
    """
    kind = field.type
    if pa.types.is_decimal(kind) or pa.types.is_time(kind):
        parse = _text_decimal if pa.types.is_decimal(kind) else _text_time
        values = []
        for r, text in zip(rows, texts.to_pylist(), strict=True):
            value = None if text is None else parse(text, kind)
            if value is None and text is not None:
                raise InvalidArgument(_not_text(field, r, text, what))
            values.append(value)
        return pa.array(values, _plain(kind)).cast(kind)
    try:
        return texts.cast(kind, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        for r, text in zip(rows, texts.to_pylist(), strict=True):
            try:
                pa.array([text], pa.string()).cast(kind, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise InvalidArgument(_not_text(field, r, text, what)) from None
        raise


def _not_text(field: pa.Field, row: int, text: str, what: str) -> str:
    name = sql_name(field.type)
    form = _TEXT_FORMS.get(name.split("(")[0], "")
    if pa.types.is_decimal(field.type):
        form = f" (a decimal number of at most {field.type.scale} places and {field.type.precision} digits)"
    return f"{what}: column {field.name!r} row {row}: text {text!r} is not a {name}{form}"


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)
_TIME = re.compile(r"(\d\d):(\d\d)(?::(\d\d)(?:\.(\d{1,9}))?)?", re.ASCII)
_EXACT = decimal.Context(prec=80, traps=[decimal.InvalidOperation])


def _text_decimal(text: str, kind: pa.Decimal128Type) -> decimal.Decimal | None:
    """The decimal `text` spells, if `kind` holds it exactly (at most `scale` places, `precision` digits)."""
    if not _NUMBER.fullmatch(text):
        return None
    value = decimal.Decimal(text)
    if value and value.adjusted() >= kind.precision - kind.scale:
        return None
    exact = value.quantize(decimal.Decimal(1).scaleb(-kind.scale), context=_EXACT)
    return exact if exact == value else None


def _text_time(text: str, kind: pa.Time64Type) -> int | None:
    """The time of day `text` spells (ISO-8601, 00:00:00 to 24:00:00), in `kind`'s unit, if exact."""
    match = _TIME.fullmatch(text)
    if not match:
        return None
    hours, minutes, seconds = int(match[1]), int(match[2]), int(match[3] or 0)
    nanos = int((match[4] or "").ljust(9, "0"))
    per = 1 if kind.unit == "ns" else 1000
    if minutes > 59 or seconds > 59 or nanos % per:
        return None
    value = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000_000 + nanos
    return value // per if value <= DAY_NS else None


DAY_NS = 86_400 * 1_000_000_000


def _plain(kind: pa.DataType) -> pa.DataType:
    """The type whose Python values hold `kind`'s exactly, beyond Python's datetimes: times as their numbers."""
    if pa.types.is_timestamp(kind) or pa.types.is_time(kind) or pa.types.is_duration(kind) or pa.types.is_date64(kind):
        return pa.int64()
    if pa.types.is_date32(kind):
        return pa.int32()
    if pa.types.is_list(kind):
        return pa.list_(_plain(kind.value_type))
    if pa.types.is_large_list(kind):
        return pa.large_list(_plain(kind.value_type))
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(_plain(kind.value_type), kind.list_size)
    return kind


_TEXT_FORMS = {
    "TIMESTAMP": " (ISO-8601, e.g. '2024-01-02 03:04:05.123456')",
    "TIMESTAMP WITH TIME ZONE": " (ISO-8601 with an offset, e.g. '2024-01-02T03:04:05+00:00')",
    "DATE": " (ISO-8601, e.g. '2024-01-02')",
    "TIME": " (ISO-8601, e.g. '03:04:05.123456', up to '24:00:00')",
}


def sql_name(kind: pa.DataType) -> str:
    """The SQL (DuckDB) name of an Arrow type, as a deploy script declares it; Arrow's own name otherwise."""
    if pa.types.is_decimal(kind):
        return f"DECIMAL({kind.precision},{kind.scale})"
    if pa.types.is_timestamp(kind):
        if kind.tz:
            return "TIMESTAMP WITH TIME ZONE"
        return "TIMESTAMP" if kind.unit == "us" else f"TIMESTAMP_{kind.unit.upper()}"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"{sql_name(kind.value_type)}[]"
    if pa.types.is_fixed_size_list(kind):
        return f"{sql_name(kind.value_type)}[{kind.list_size}]"
    return _SQL_NAMES.get(str(kind), str(kind))


_SQL_NAMES = {
    "int8": "TINYINT",
    "int16": "SMALLINT",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "uint8": "UTINYINT",
    "uint16": "USMALLINT",
    "uint32": "UINTEGER",
    "uint64": "UBIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "bool": "BOOLEAN",
    "string": "VARCHAR",
    "large_string": "VARCHAR",
    "binary": "BLOB",
    "large_binary": "BLOB",
    "date32[day]": "DATE",
    "time64[us]": "TIME",
    "duration[us]": "INTERVAL",
    "null": "NULL",
}


_WHOLE = (pa.types.is_integer, pa.types.is_timestamp, pa.types.is_date, pa.types.is_time, pa.types.is_duration)


def _exact_float(v: float, field: pa.Field, row: int, what: str) -> Any:
    """A double of `Rows` as the column stores it without rounding, or InvalidArgument.

    pyarrow truncates a double into an integer column (1.5 -> 1) and refuses it
    for a decimal: a whole double is taken as its integer, a double as the
    decimal its shortest repr spells (1.5 -> 1.5), whose scale must then fit.
    """
    kind = field.type
    if any(test(kind) for test in _WHOLE):
        if math.isfinite(v) and v == int(v):
            return int(v)
        raise InvalidArgument(
            f"{what}: column {field.name!r} row {row}: value {v!r} is not a whole number, "
            f"so it cannot be stored as {sql_name(kind)} without rounding"
        )
    if pa.types.is_decimal(kind):
        exact = _text_decimal(repr(v), kind) if math.isfinite(v) else None
        if exact is None:
            raise InvalidArgument(
                f"{what}: column {field.name!r} row {row}: value {v!r} is not a {sql_name(kind)} "
                f"(at most {kind.scale} decimal places and {kind.precision} digits) without rounding"
            )
        return exact
    if pa.types.is_float32(kind) and math.isfinite(v) and math.isinf(struct.unpack("f", struct.pack("f", v))[0]):
        raise InvalidArgument(
            f"{what}: column {field.name!r} row {row}: value {v!r} is out of range for {sql_name(kind)}"
        )
    return v


def _check_columns(names: Iterable[str], schema: pa.Schema, what: str) -> None:
    names = list(names)
    seen = set()
    for name in names:
        if name in seen:
            raise InvalidArgument(f"{what}: column {name!r} given twice")
        seen.add(name)
        if schema.get_field_index(name) < 0:
            raise InvalidArgument(f"{what}: unknown column {name!r} (columns are {', '.join(schema.names)})")
    missing = [n for n in schema.names if n not in seen]
    if missing:
        raise InvalidArgument(f"{what}: missing column(s) {', '.join(map(repr, missing))}")


def conform(table: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    """`table` cast to `schema` (columns matched by name, any order).

    Each value is read as the Rows path reads it (docs/protocol.md, "Rows"):
    a value that does not fit its column type, or would change to fit it, is
    InvalidArgument naming the column and the first offending row.
    """
    _check_columns(table.column_names, schema, what)
    return pa.table([_conform_column(table.column(field.name), field, what) for field in schema], schema=schema)


def _conform_column(col: pa.ChunkedArray, field: pa.Field, what: str) -> pa.ChunkedArray | pa.Array:
    kind, src = field.type, col.type
    _check_valid(col, field.name, what)
    if _is_list(src):
        col = _own_values(col)
    if src == kind:
        _check_leaf_times(col, field.name, what)
        return col
    if not _readable(src, kind):
        values, rows = _leaves(col)
        valid = pc.index(pc.is_valid(values), True).as_py()
        if valid < 0:
            return pa.array(col.to_pylist(), kind)  # nulls and empty lists: nothing to read
        valid = valid if rows is None else rows[valid].as_py()
        raise InvalidArgument(
            f"{what}: column {field.name!r} row {valid}: value {_show(col, valid)} of type {sql_name(src)} "
            f"cannot be stored as {sql_name(kind)}"
        )
    if _is_text(src) and not _textual(kind):
        return _parse_text(col.combine_chunks().cast(pa.string()), field, what, range(len(col)))
    leaf, into = _leaf(src), _leaf(kind)
    if _is_text(leaf) and not _textual(into) or pa.types.is_floating(leaf) and not _arrow_exact(into):
        return _to_array(col.to_pylist(), field, what)  # text and doubles read by the one set of rules: Rows'
    try:
        cast = _cast(col, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        for r in range(len(col)):
            if not col[r].is_valid:
                continue
            try:
                _cast(pa.concat_arrays(col.slice(r, 1).chunks), kind)  # a slice of a list casts all its values
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise InvalidArgument(
                    f"{what}: column {field.name!r} row {r}: value {_show(col, r)} of type "
                    f"{sql_name(src)} cannot be stored as {sql_name(kind)}"
                ) from None
        raise InvalidArgument(
            f"{what}: column {field.name!r} of type {sql_name(src)} cannot be stored as {sql_name(kind)}"
        ) from None
    _check_exact(col, cast, field.name, what)
    _check_leaf_times(cast, field.name, what)
    return cast


def _validate(col: pa.ChunkedArray) -> None:
    """Arrow's full validation, with times as their numbers: it refuses 24:00:00, which is a TIME (DuckDB
    keeps it; `_check_times` checks the range)."""
    leaf = col.type
    while _is_list(leaf):
        leaf = leaf.value_type
    if pa.types.is_time(leaf):
        col.validate()
        col = col.cast(_plain(col.type))
    col.validate(full=True)


def _check_valid(col: pa.ChunkedArray, column: str, what: str) -> None:
    """Arrow IPC carries whatever bytes a client wrote: text that is not UTF-8 (DuckDB fails on it once the
    batch has committed) or a decimal beyond its precision (DuckDB wraps it) is refused, naming its row."""
    try:
        _validate(col)
    except pa.ArrowInvalid as e:
        for r in range(len(col)):
            try:
                _validate(pa.chunked_array(col.slice(r, 1).chunks, col.type))
            except pa.ArrowInvalid:
                raise InvalidArgument(f"{what}: column {column!r} row {r}: invalid {sql_name(col.type)}: {e}") from None
        raise InvalidArgument(f"{what}: column {column!r}: invalid {sql_name(col.type)}: {e}") from None


def _own_values(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A list column whose arrays hold only their own rows' values: Arrow casts every child value of a
    sliced list array, those of rows outside the slice too (a batch of a packed message would fail
    for a value of another batch)."""
    chunks = [
        c.take(pa.array(range(len(c)), pa.int64())) if c.offset or len(c.flatten()) != len(c.values) else c
        for c in col.chunks
    ]
    return pa.chunked_array(chunks, type=col.type)


def _cast(col: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    if pa.types.is_integer(col.type) and pa.types.is_decimal(kind):
        # Arrow refuses int64 -> DECIMAL(10,2) outright (19 digits needed); through 38 digits
        # each value is checked against the column's precision instead
        col = col.cast(pa.decimal128(38, kind.scale))
    elif pa.types.is_decimal(col.type) and pa.types.is_integer(kind):
        col = col.cast(pa.decimal128(38, 0))  # Arrow wants 20 digits for an int64: a whole number is enough
    return col.cast(kind, safe=True)


def _readable(src: pa.DataType, kind: pa.DataType) -> bool:
    """Whether the contract reads an Arrow `src` value as a `kind` at all (docs/protocol.md, "Rows").

    Arrow casts more: a number to a BOOLEAN (2 -> true) or to text ("12"),
    a bool to a number, a zoned time to a local one. Rows refuses those; so does Arrow.
    """
    if pa.types.is_null(src) or _is_text(src):
        return not _is_list(kind) or pa.types.is_null(src)
    if _is_list(src) or _is_list(kind):
        return _is_list(src) and _is_list(kind) and _readable(src.value_type, kind.value_type)
    if _textual(kind) or pa.types.is_boolean(kind) or pa.types.is_boolean(src):
        return _textual(src) if _textual(kind) else pa.types.is_boolean(src) and pa.types.is_boolean(kind)
    number = pa.types.is_integer(src) or pa.types.is_floating(src)
    if pa.types.is_timestamp(kind):
        if pa.types.is_timestamp(src):
            return (src.tz is None) == (kind.tz is None)
        return number or pa.types.is_date(src)
    if pa.types.is_date(kind):
        return number or pa.types.is_date(src) or pa.types.is_timestamp(src) and src.tz is None
    if pa.types.is_time(kind):
        return number or pa.types.is_time(src)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return number or pa.types.is_decimal(src)
    return not (number or pa.types.is_decimal(src) or _textual(src) or pa.types.is_temporal(src))


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _leaf(kind: pa.DataType) -> pa.DataType:
    while _is_list(kind):
        kind = kind.value_type
    return kind


def _arrow_exact(kind: pa.DataType) -> bool:
    """Whether Arrow's safe cast of a double to `kind` is exact or refused (not for a decimal: 0.1 into
    DECIMAL(18,6) fails its own check; not for times: Arrow has no such cast)."""
    return pa.types.is_floating(kind) or pa.types.is_integer(kind)


def _leaves(col: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """The innermost values of a (list) column, and the row each is in (None: the values are the rows)."""
    values = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    rows = None
    while _is_list(values.type):
        parents = pc.list_parent_indices(values)
        rows = parents if rows is None else pc.take(rows, parents)
        values = pc.list_flatten(values)
    return values, rows


def _check_exact(col: pa.ChunkedArray, cast: pa.ChunkedArray, column: str, what: str) -> None:
    """Arrow's safe casts still change some values: a float overflowing a narrower float (1e300 -> inf), a
    timestamp's time of day dropped for a DATE. Such a value is refused, naming it, like one that does not fit."""
    orig, rows = _leaves(col)
    new, _ = _leaves(cast)
    if pa.types.is_null(orig.type) or pa.types.is_floating(new.type) and not pa.types.is_floating(orig.type):
        return  # an integer within 2**53 (Arrow checks) or a decimal, read as its nearest double like its text
    try:
        if pa.types.is_floating(orig.type):
            same = pc.invert(pc.and_(pc.is_inf(new), pc.invert(pc.is_inf(orig))))
        else:
            same = pc.equal(new.cast(orig.type), orig)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return  # no comparison for the type (STRUCT, MAP): Arrow's safe cast is all there is
    same = pc.fill_null(same, True)
    if pc.all(same, min_count=0).as_py():  # no values (every list null or empty): nothing changed
        return
    i = pc.index(same, False).as_py()
    r = i if rows is None else rows[i].as_py()
    fault = "is out of range for" if pa.types.is_floating(orig.type) else "cannot be stored exactly as"
    raise InvalidArgument(
        f"{what}: column {column!r} row {r}: value {_show(col, r)} of type {sql_name(col.type)} {fault} "
        f"{sql_name(cast.type)}"
    )


def _check_leaf_times(col: pa.ChunkedArray | pa.Array, column: str, what: str) -> None:
    values, rows = _leaves(col)
    _check_times(values, column, what, range(len(values)) if rows is None else rows.to_pylist())


def _show(col: pa.ChunkedArray | pa.Array, row: int) -> str:
    try:
        return repr(col[row].as_py())
    except (ValueError, OverflowError):  # a time beyond Python's datetimes
        return str(col[row])


def decode_rowdata(data: pb.RowData, schema: pa.Schema, what: str) -> pa.Table:
    """The relation in a RowData, conformed to `schema`."""
    fmt = data.WhichOneof("format")
    if fmt == "arrow_ipc":
        return conform(ipc_to_table(data.arrow_ipc, what), schema, what)
    if fmt == "rows":
        return rows_to_table(data.rows, schema, what)
    raise InvalidArgument(f"{what}: no rows: set data.arrow_ipc or data.rows")


@dataclass(frozen=True)
class Decoded:
    """The batches of one message: `whole` holds all their rows, conformed, when every value fit (the
    batches are its slices, `sizes` rows each); else `each` holds every batch, or the error refusing it."""

    sizes: list[int]
    whole: pa.Table | None = None
    each: list[pa.Table | InvalidArgument] | None = None

    def batches(self) -> list[pa.Table | InvalidArgument]:
        if self.each is not None:
            return self.each
        assert self.whole is not None
        offsets = itertools.accumulate(self.sizes[:-1], initial=0)
        return [self.whole.slice(at, n) for at, n in zip(offsets, self.sizes, strict=True)]


def decode_batches(
    data: pb.RowData, schema: pa.Schema, sizes: list[int], what: str, name: Callable[[int], str]
) -> Decoded:
    """The batches of one message (`sizes` rows each, `name(i)` naming the i-th in errors), conformed to `schema`.

    Each batch keeps its own outcome: the message is converted at once (the
    fast path) and, if a value does not fit, batch by batch, so that only the
    batches holding such a value are refused, with the row counted within
    the batch. A message whose counts do not add up refuses all of them.
    """
    fmt = data.WhichOneof("format")
    if fmt == "arrow_ipc":
        raw = ipc_to_table(data.arrow_ipc, what)
        total = raw.num_rows
    elif fmt == "rows":
        total = len(data.rows.rows)
    else:
        raise InvalidArgument(f"{what}: no rows: set data.arrow_ipc or data.rows")
    if min(sizes, default=0) < 0 or sum(sizes) != total:
        shown = str(sizes) if len(sizes) <= 8 else f"[{', '.join(map(str, sizes[:8]))}, ... ({len(sizes)} counts)]"
        raise InvalidArgument(f"{what}: batch_rows {shown} must be counts adding up to the {total} rows in data")
    try:
        whole = conform(raw, schema, what) if fmt == "arrow_ipc" else rows_to_table(data.rows, schema, what)
        return Decoded(sizes, whole=whole)
    except InvalidArgument:
        pass
    out: list[pa.Table | InvalidArgument] = []
    offsets = itertools.accumulate(sizes[:-1], initial=0)
    for i, (at, n) in enumerate(zip(offsets, sizes, strict=True)):
        try:
            if fmt == "arrow_ipc":
                out.append(conform(raw.slice(at, n), schema, name(i)))
            else:
                out.append(
                    rows_to_table(pb.Rows(columns=data.rows.columns, rows=data.rows.rows[at : at + n]), schema, name(i))
                )
        except InvalidArgument as e:
            out.append(e)
    return Decoded(sizes, each=out)


def encode_rowdata(table: pa.Table, arrow: bool = True) -> pb.RowData:
    return pb.RowData(arrow_ipc=table_to_ipc(table)) if arrow else pb.RowData(rows=table_to_rows(table))
