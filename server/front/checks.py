"""What a command must satisfy before it is sequenced: a push's address, a call's parameters, a query's SQL.

The front refuses a command that fails them with a precise status and
message, before it takes a timestamp; `streamtx.testing`, which runs the
partition engine without a front, refuses the same commands the same way.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from streamtx.errors import FailedPrecondition, InvalidArgument, NotFound
from streamtx.server.catalog.catalog import Catalog


def push_schema(catalog: Catalog, stream: str, producer: str, batch_id: int) -> pa.Schema:
    """The schema of the border stream a push names; anything else about its address is refused."""
    if not stream:
        raise InvalidArgument("push: no stream named")
    schema = catalog.stream_schemas.get(stream)
    if schema is None:
        known = ", ".join(catalog.names("stream")) or "none"
        raise NotFound(f"push: unknown stream {stream!r} (streams: {known})")
    if not catalog.is_border(stream):
        writers = catalog.producers_of.get(stream) or ["an EE trigger"]
        raise FailedPrecondition(
            f"push: stream {stream!r} is the output of {', '.join(writers)}; producers push to border streams only"
        )
    if not producer:
        raise InvalidArgument(f"push to {stream!r}: producer_id is empty")
    if batch_id < 1:
        raise InvalidArgument(
            f"push to {stream!r}: batch_id {batch_id} is invalid; a producer's batch ids start at 1 and increase by one"
        )
    return schema


def bind_call(catalog: Catalog, con: duckdb.DuckDBPyConnection, procedure: str, params: dict[str, Any]) -> dict:
    """A call's parameters, each one declared, present and convertible to its declared type.

    `con` casts (it holds no data). The values stay as given: the
    procedure's SQL casts them to their declared types.
    """
    proc = catalog.procedures.get(procedure)
    if proc is None:
        known = ", ".join(catalog.names("procedure")) or "none"
        raise NotFound(f"call: unknown procedure {procedure!r} (procedures: {known})")
    if proc.on_stream is not None:
        raise FailedPrecondition(
            f"call: procedure {procedure!r} runs ON STREAM {proc.on_stream}; push batches to the stream instead"
        )
    declared = dict(proc.params)
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise InvalidArgument(
            f"call {procedure}: unknown parameter {unknown[0]!r} (parameters: {', '.join(declared) or 'none'})"
        )
    missing = [p for p in declared if p not in params]
    if missing:
        raise InvalidArgument(f"call {procedure}: missing parameter {missing[0]!r}")
    return {name: _coerce_param(con, procedure, name, declared[name], params[name]) for name in declared}


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Query takes one SELECT; anything else is INVALID_ARGUMENT (checked by DuckDB's parser)."""
    if not sql.strip():
        raise InvalidArgument("query: empty SQL")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise InvalidArgument(f"query: {e}") from None
    if len(statements) != 1:
        raise InvalidArgument(f"query: expected one statement, got {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise InvalidArgument(
            f"query: {kind.name} is not allowed; Query is read-only (SELECT only). Use Call for writes, Deploy for DDL"
        )


def _coerce_param(con: duckdb.DuckDBPyConnection, procedure: str, name: str, type_sql: str, value: Any) -> Any:
    """Checks a call parameter against its declared DuckDB type, as DuckDB casts it.

    The procedure's SQL casts the parameter to its declared type; here a value
    that does not convert, or would lose its fraction, is refused up front.
    """
    if value is None:
        return None
    try:
        cast = con.execute(f"SELECT CAST($v AS {type_sql})", {"v": value}).fetchall()[0][0]
    except duckdb.Error as e:
        raise InvalidArgument(
            f"call {procedure}: parameter {name!r}: {value!r} is not a {type_sql} ({str(e).splitlines()[0]})"
        ) from None
    if isinstance(value, float) and isinstance(cast, int) and cast != value:
        raise InvalidArgument(f"call {procedure}: parameter {name!r}: {value!r} is not a whole number ({type_sql})")
    return value
