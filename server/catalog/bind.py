"""Binding against DuckDB: the schemas of streams and tables, and the plans of procedures and triggers.

Validation is done by DuckDB's own binder on a scratch in-memory database
holding the new schema (empty), after the SQL has been compiled
(catalog/compile.py); nothing is executed, so a deploy checks what it can
before any partition sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
from sqlglot import exp

from streamtx.errors import InvalidArgument
from streamtx.server import sqltree
from streamtx.server.catalog import eventkeys
from streamtx.server.catalog.compile import (
    STREAM_SCHEMA,
    TS_PARAMS,
    Compiled,
    Scope,
    batch_relation,
    compile_statement,
    quote,
)
from streamtx.server.catalog.defs import ProcedureDef, StreamDef, TableDef, TriggerDef, WindowDef
from streamtx.server.catalog.physical import PhysicalStatement
from streamtx.server.partitioning import KEY_TYPES

PythonResolver = Callable[[str], Any]
"""Maps 'module:function' to a loaded Python procedure (see server/loader.py)."""


@dataclass
class Plan:
    """What a partition runs for one procedure or trigger: compiled statements."""

    statements: list[Compiled]
    emits: frozenset[str]
    owned: dict[int, Compiled] = field(default_factory=dict)
    """Variants of INSERTs into partitioned tables that keep this partition's keys (everywhere TEs, P > 1)."""


@dataclass(frozen=True)
class Schemas:
    """What DuckDB makes of the declared relations."""

    streams: dict[str, pa.Schema] = field(default_factory=dict)
    """Stream -> the Arrow schema of its batches."""
    stream_types: dict[str, dict[str, str]] = field(default_factory=dict)
    """Stream -> DuckDB's type of each of its columns."""
    table_columns: dict[str, list[str]] = field(default_factory=dict)
    table_key_types: dict[str, str] = field(default_factory=dict)
    """Partitioned table -> the DuckDB type of its PARTITION BY column."""


def scratch_database(statements: Iterable[PhysicalStatement]) -> duckdb.DuckDBPyConnection:
    """An empty in-memory database built by `statements`."""
    con = duckdb.connect(config={"enable_external_access": False})
    for stmt in statements:
        try:
            con.execute(stmt.sql)
        except duckdb.Error as e:
            raise InvalidArgument(f"deploy: {stmt.what}: {_duck_message(e)}") from None
    return con


def derive_schemas(
    con: duckdb.DuckDBPyConnection, tables: Mapping[str, TableDef], streams: Mapping[str, StreamDef]
) -> Schemas:
    """The relations' schemas as `con` holds them; a PARTITION BY column that cannot be a key is refused."""
    stream_schemas = {}
    stream_types = {}
    for name in streams:
        cols = ", ".join(quote(c) for c, _ in streams[name].columns)
        stream_schemas[name] = (
            con.sql(f"SELECT {cols} FROM {STREAM_SCHEMA}.{quote(name)} LIMIT 0").to_arrow_table().schema
        )
        stream_types[name] = {r[0]: r[1] for r in con.execute(f"DESCRIBE {STREAM_SCHEMA}.{quote(name)}").fetchall()}
    described = {name: con.execute(f"DESCRIBE {quote(name)}").fetchall() for name in tables}
    table_columns = {name: [r[0] for r in rows] for name, rows in described.items()}
    table_key_types = {}
    for table in tables.values():
        if table.partition_by and table.partition_by not in table_columns[table.name]:
            raise InvalidArgument(
                f"deploy: table {table.name!r}: PARTITION BY column {table.partition_by!r} does not exist"
            )
        if table.partition_by:
            key_type = dict((r[0], r[1]) for r in described[table.name])[table.partition_by]
            _check_key_type(f"table {table.name!r}", table.partition_by, key_type)
            table_key_types[table.name] = key_type
    for stream in streams.values():
        names = [c for c, _ in stream.columns]
        if stream.partition_by and stream.partition_by not in names:
            raise InvalidArgument(
                f"deploy: stream {stream.name!r}: PARTITION BY column {stream.partition_by!r} does not exist"
            )
        if stream.partition_by:
            key_type = con.execute(
                f"SELECT data_type FROM information_schema.columns WHERE table_schema = '{STREAM_SCHEMA}' "
                "AND table_name = $t AND column_name = $c",
                {"t": stream.name, "c": stream.partition_by},
            ).fetchall()[0][0]
            _check_key_type(f"stream {stream.name!r}", stream.partition_by, key_type)
    return Schemas(stream_schemas, stream_types, table_columns, table_key_types)


def base_scope(
    tables: Iterable[str],
    streams: Mapping[str, StreamDef],
    windows: Iterable[str],
    window_owner: Mapping[str, str],
    retained: frozenset[str],
    views: Iterable[str] = (),
) -> Scope:
    """What any code of a catalog may name; `unit_scope` adds what one procedure or trigger may."""
    return Scope(
        owner="",
        tables=frozenset(tables),
        views=frozenset(views),
        streams={n: tuple(c for c, _ in s.columns) for n, s in streams.items()},
        windows={n: window_owner.get(n, "") for n in windows},
        input_stream=None,
        owned_windows=frozenset(),
        params=frozenset(),
        retained=retained,
    )


def unit_scope(
    base: Scope,
    owner: str,
    input_stream: str | None,
    owned: Iterable[str],
    params: Iterable[str],
    param_types: tuple[tuple[str, str], ...] = (),
) -> Scope:
    return dataclasses.replace(
        base,
        owner=owner,
        input_stream=input_stream,
        owned_windows=frozenset(owned),
        params=frozenset(params),
        param_types=param_types,
    )


def procedure_scope(base: Scope, proc: ProcedureDef, owned: Iterable[str]) -> Scope:
    params = tuple(proc.params)
    return unit_scope(base, f"procedure {proc.name}", proc.on_stream, owned, {p for p, _ in params}, params)


def trigger_scope(base: Scope, trig: TriggerDef) -> Scope:
    if trig.target_kind == "stream":
        return unit_scope(base, f"trigger {trig.name}", trig.target, (), ())
    return unit_scope(base, f"trigger {trig.name}", None, {trig.target}, ())


def plan_procedure(
    proc: ProcedureDef,
    con: duckdb.DuckDBPyConnection,
    scope: Scope,
    streams: Mapping[str, StreamDef],
    resolve_python: PythonResolver | None,
) -> Plan:
    """Compiles and binds a SQL procedure, or checks what a Python one emits on (when it can be loaded)."""
    what = f"procedure {proc.name!r}"
    if proc.on_stream is not None and proc.on_stream not in streams:
        raise InvalidArgument(f"deploy: {what} is ON STREAM {proc.on_stream!r}, which does not exist")
    if proc.on_stream is not None and proc.params:
        raise InvalidArgument(
            f"deploy: {what}: a procedure ON STREAM takes its input from the stream; it cannot declare parameters"
        )
    names = [p for p, _ in proc.params]
    reserved = sorted(TS_PARAMS & set(names))
    if reserved:
        raise InvalidArgument(
            f"deploy: {what}: parameter name ${reserved[0]} is reserved ($ts and $batch_id are the running "
            "timestamp); rename the parameter"
        )
    if proc.partition_on is not None and proc.partition_on not in names:
        raise InvalidArgument(f"deploy: {what}: PARTITION ON {proc.partition_on!r} is not one of its parameters")
    if proc.python is not None:
        emits: frozenset[str] = frozenset()
        fn = None
        if resolve_python is not None:
            fn = resolve_python(proc.python)
            emits = frozenset(getattr(fn, "emits", ()))
            for s in emits:
                if s not in streams:
                    raise InvalidArgument(f"deploy: {what} ({proc.python}) emits unknown stream {s!r}")
        eventkeys.check_kind(proc, fn, resolve_python is not None)
        return Plan([], emits)
    eventkeys.check_kind(proc, None, False)
    input_stream = streams[proc.on_stream] if proc.on_stream is not None else None
    return _plan_body(proc.body, proc.body_lines, con, scope, input_stream, what)


def plan_trigger(
    trig: TriggerDef,
    con: duckdb.DuckDBPyConnection,
    scope: Scope,
    streams: Mapping[str, StreamDef],
    windows: Mapping[str, WindowDef],
) -> Plan:
    what = f"trigger {trig.name!r}"
    if trig.target_kind == "stream" and trig.target not in streams:
        raise InvalidArgument(f"deploy: {what} is ON STREAM {trig.target!r}, which does not exist")
    if trig.target_kind == "window" and trig.target not in windows:
        raise InvalidArgument(f"deploy: {what} is ON WINDOW {trig.target!r}, which does not exist")
    input_stream = streams[trig.target] if trig.target_kind == "stream" else None
    return _plan_body(trig.body, trig.body_lines, con, scope, input_stream, what)


def _plan_body(
    body: list[str],
    lines: list[int],
    con: duckdb.DuckDBPyConnection,
    scope: Scope,
    input_stream: StreamDef | None,
    what: str,
) -> Plan:
    statements = []
    for sql, line in zip(body, lines or [0] * len(body), strict=False):
        compiled = _compiled(sql, scope, line)
        bind_check(con, compiled, input_stream, f"deploy: {what} (line {line})")
        statements.append(compiled)
    return Plan(statements, frozenset(s.emits for s in statements if s.emits))


def bind_check(
    con: duckdb.DuckDBPyConnection,
    compiled: Compiled,
    input_stream: StreamDef | None,
    what: str,
) -> None:
    """Binds the statement (EXPLAIN) on the empty scratch database.

    DuckDB's binder reports unknown tables and columns, type mismatches and
    unknown functions in its own words; nothing is executed.
    """
    if input_stream is not None:
        cols = ", ".join(quote(c) for c, _ in input_stream.columns)
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW {quote(batch_relation(input_stream.name))} AS "
            f"SELECT {cols} FROM {STREAM_SCHEMA}.{quote(input_stream.name)} WHERE false"
        )
    params = {p: (0 if p in TS_PARAMS else None) for p in compiled.params}
    try:
        con.execute("EXPLAIN " + compiled.sql, params)
    except duckdb.Error as e:
        raise InvalidArgument(f"{what}: {_duck_message(e)}: {compiled.source!r}") from None
    for source, target, column in _insert_casts(con, compiled.sql, params):
        sample = _SAMPLES.get(source.split("(")[0].strip().upper())
        if sample is None:
            continue
        try:
            con.execute(f"SELECT CAST(x AS {target}) FROM (SELECT CAST({sample} AS {source}) AS x)")
        except duckdb.ConversionException as e:
            if "Unimplemented type for cast" in str(e):
                raise InvalidArgument(
                    f"{what}: column {column!r} is {target}, but the statement gives it a {source}, "
                    f"which does not convert: {compiled.source!r}"
                ) from None


def _duck_message(e: Exception) -> str:
    """DuckDB's message, first line plus the LINE pointer if present, compacted."""
    text = str(e).strip()
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _check_key_type(what: str, column: str, key_type: str) -> None:
    if key_type not in KEY_TYPES:
        raise InvalidArgument(
            f"deploy: {what}: cannot PARTITION BY column {column!r} of type {key_type}; "
            f"partition keys are {', '.join(KEY_TYPES)}"
        )


def _compiled(sql: str, scope: Scope, line: int) -> Compiled:
    try:
        return compile_statement(sql, scope, line)
    except InvalidArgument as e:
        raise InvalidArgument(f"deploy: {e.message}") from None


_NUMERIC = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
            "UBIGINT", "UHUGEINT", "DECIMAL", "FLOAT", "DOUBLE")  # fmt: skip
_SAMPLES: dict[str, str] = {
    **{t: "1" for t in _NUMERIC},
    "VARCHAR": "'1'",
    "BOOLEAN": "true",
    "DATE": "DATE '2020-01-02'",
    "TIMESTAMP": "TIMESTAMP '2020-01-02 03:04:05'",
    "TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ '2020-01-02 03:04:05+00'",
    "TIME": "TIME '03:04:05'",
    "INTERVAL": "INTERVAL 1 DAY",
    "BLOB": "'\\x01'",
}
"""A value of each type, to find casts DuckDB cannot do at all (it only looks when a value comes)."""


def _insert_casts(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(source type, target type, column) for each column an INSERT ... SELECT writes.

    DuckDB binds an INSERT's implicit casts lazily, so EXPLAIN alone accepts,
    say, a DATE into a BIGINT column; casting a typed NULL finds it at deploy.
    """
    tree = sqltree.parse(sql)
    if not isinstance(tree, exp.Insert) or tree.expression is None:
        return []
    schema = tree.this if isinstance(tree.this, exp.Schema) else None
    table = schema.this if schema is not None else tree.this
    if not isinstance(table, exp.Table):
        return []
    target_cols = con.execute(f"DESCRIBE {table.sql('duckdb')}").fetchall()
    types = {name: t for name, t, *_ in target_cols}
    names = [c.name for c in schema.expressions] if schema is not None and schema.expressions else list(types)
    with_ = tree.args.get("with_") or tree.args.get("with")
    query = (with_.sql("duckdb") + " " if with_ is not None else "") + tree.expression.sql("duckdb")
    used = {k: v for k, v in params.items() if f"${k}" in query}
    produced = con.execute(f"DESCRIBE {query}", used).fetchall()
    return [
        (src, types[name], name)
        for name, (_, src, *_) in zip(names, produced, strict=False)
        if name in types and src != types[name]
    ]
