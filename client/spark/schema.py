"""Schemas between Spark and streamtx: checked on the driver, applied on executors.

A DataFrame written to a stream must have the stream's columns (matched by
name, case-insensitively, in any order) with types that convert without loss;
anything else is refused on the driver, before a row moves, with the exact
column and the cast that would fix it.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pat
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from streamtx.errors import InvalidArgument


def lossless(src: pa.DataType, dst: pa.DataType) -> bool:
    """True when every value of `src` is a value of `dst` (so a safe cast never fails)."""
    if src == dst or pat.is_null(src):
        return True
    if pat.is_integer(src) and pat.is_integer(dst):
        if pat.is_signed_integer(src) == pat.is_signed_integer(dst):
            return dst.bit_width >= src.bit_width
        return pat.is_signed_integer(dst) and dst.bit_width > src.bit_width
    if pat.is_floating(src) and pat.is_floating(dst):
        return dst.bit_width >= src.bit_width
    if pat.is_integer(src) and pat.is_floating(dst):
        return src.bit_width <= 32 and dst.bit_width == 64
    if (pat.is_string(src) or pat.is_large_string(src)) and (pat.is_string(dst) or pat.is_large_string(dst)):
        return True
    if (pat.is_binary(src) or pat.is_large_binary(src)) and (pat.is_binary(dst) or pat.is_large_binary(dst)):
        return True
    if pat.is_timestamp(src) and pat.is_timestamp(dst):
        return True
    if pat.is_date(src) and pat.is_date(dst):
        return True
    if pat.is_decimal(src) and pat.is_decimal(dst):
        return dst.scale >= src.scale and dst.precision - dst.scale >= src.precision - src.scale
    return False


def spark_type_for(arrow_type: pa.DataType) -> str:
    """The Spark SQL type name to cast to, for an error message's hint."""
    return from_arrow_schema(pa.schema([pa.field("x", arrow_type)])).fields[0].dataType.simpleString()


def column_map(df_schema: StructType, stream_schema: pa.Schema, stream: str) -> dict[str, str]:
    """Stream column → DataFrame column; raises InvalidArgument naming every difference."""
    by_lower = {f.name.lower(): f.name for f in df_schema.fields}
    mapping: dict[str, str] = {}
    missing = []
    for name in stream_schema.names:
        found = by_lower.get(name.lower())
        if found is None:
            missing.append(name)
        else:
            mapping[name] = found
    extra = sorted(set(by_lower.values()) - set(mapping.values()))
    problems = []
    if missing:
        problems.append(f"missing column(s) {', '.join(map(repr, missing))}")
    if extra:
        problems.append(f"column(s) {', '.join(map(repr, extra))} not in the stream (drop them)")
    if problems:
        raise InvalidArgument(
            f"schema mismatch between the DataFrame and stream {stream!r}: {'; '.join(problems)}. "
            f"The stream's columns are: {stream_columns(stream_schema)}"
        )
    df_arrow = to_arrow_schema(df_schema)
    for name, df_name in mapping.items():
        src = df_arrow.field(df_name).type
        dst = stream_schema.field(name).type
        if not lossless(src, dst):
            spark_name = df_schema[df_name].dataType.simpleString()
            raise InvalidArgument(
                f"schema mismatch between the DataFrame and stream {stream!r}: column {df_name!r} is "
                f"{spark_name} in the DataFrame but {dst} in the stream, and not every value converts; "
                f"cast it first: df.withColumn({df_name!r}, F.col({df_name!r}).cast({spark_type_for(dst)!r}))"
            )
    return mapping


def stream_columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def conform_batch(batch: pa.RecordBatch, mapping: dict[str, str], schema: pa.Schema) -> pa.RecordBatch:
    """A Spark record batch as the stream's columns, in the stream's order and types."""
    arrays = []
    for field in schema:
        col = batch.column(mapping[field.name])
        arrays.append(col if col.type == field.type else col.cast(field.type, safe=True))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


__all__ = ["column_map", "conform_batch", "lossless", "stream_columns"]
