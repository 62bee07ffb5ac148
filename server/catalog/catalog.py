"""The catalog: tables, streams, windows, procedures, triggers, groups.

A `Catalog` is a value: `deploy` returns a new, fully validated catalog or
raises InvalidArgument and leaves the old one as it was, which is what makes a
deploy all-or-nothing. Validation is done by DuckDB's own binder on a scratch
in-memory database holding the new schema (empty), after the SQL has been
compiled (catalog/compile.py). The front and every partition hold the same
catalog; it is persisted as JSON in the data directory.
"""

from __future__ import annotations

import functools
import graphlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from streamtx.errors import InvalidArgument
from streamtx.files import atomic_write
from streamtx.server import sqltree
from streamtx.server.catalog import ddl, eventkeys, placement
from streamtx.server.catalog.compile import (
    STREAM_SCHEMA,
    SYSTEM_SCHEMA,
    TS_PARAMS,
    WINDOW_SCHEMA,
    Compiled,
    Scope,
    batch_relation,
    compile_statement,
    quote,
    referenced_names,
)
from streamtx.server.partitioning import KEY_TYPES

KINDS = ("table", "stream", "window", "procedure", "trigger", "index", "group")
RELATION_KINDS = ("table", "stream", "window", "index")
CODE_KINDS = ("procedure", "trigger", "group")
MAX_NAME_BYTES = 256
"""An object, stream, producer, procedure or parameter name (README, Limits)."""
MAX_DEPLOY_STATEMENTS = 1_000


@dataclass
class TableDef:
    name: str
    sql: str
    partition_by: str | None = None
    replicated: bool = False


@dataclass
class StreamDef:
    name: str
    columns: list[tuple[str, str]]
    partition_by: str | None = None


@dataclass
class WindowDef:
    name: str
    stream: str
    kind: str  # rows | range
    size: int
    slide: int


@dataclass
class ProcedureDef:
    name: str
    params: list[tuple[str, str]] = field(default_factory=list)
    on_stream: str | None = None
    partition_on: str | None = None
    body: list[str] = field(default_factory=list)
    body_lines: list[int] = field(default_factory=list)
    python: str | None = None
    key_columns: list[str] = field(default_factory=list)
    """A state procedure's `PARTITION ON (columns)`: the event columns holding its keys (catalog/eventkeys.py)."""
    each_row: bool = False
    """`FOR EACH ROW`: one TE per input tuple, in batch order, each followed by every TE it triggers."""


@dataclass
class TriggerDef:
    name: str
    target_kind: str  # stream | window
    target: str
    body: list[str]
    body_lines: list[int]


@dataclass
class IndexDef:
    name: str
    sql: str


@dataclass
class GroupDef:
    name: str
    procedures: list[str]


@dataclass
class Plan:
    """What a partition runs for one procedure or trigger: compiled statements."""

    statements: list[Compiled]
    emits: frozenset[str]
    owned: dict[int, Compiled] = field(default_factory=dict)
    """Variants of INSERTs into partitioned tables that keep this partition's keys (everywhere TEs, P > 1)."""


PythonResolver = Callable[[str], Any]
"""Maps 'module:function' to a loaded Python procedure (see server/loader.py)."""


class Catalog:
    """Definitions plus what is derived from them (plans, graph, schemas)."""

    def __init__(self) -> None:
        self.tables: dict[str, TableDef] = {}
        self.streams: dict[str, StreamDef] = {}
        self.windows: dict[str, WindowDef] = {}
        self.procedures: dict[str, ProcedureDef] = {}
        self.triggers: dict[str, TriggerDef] = {}
        self.indexes: dict[str, IndexDef] = {}
        self.groups: dict[str, GroupDef] = {}
        self.version = 0
        # derived by analyze()
        self.plans: dict[str, Plan] = {}
        self.trigger_plans: dict[str, Plan] = {}
        self.consumers: dict[str, list[str]] = {}
        self.producers_of: dict[str, list[str]] = {}
        self.window_owner: dict[str, str] = {}
        self.topo_rank: dict[str, int] = {}
        self.stream_schemas: dict[str, pa.Schema] = {}
        self.stream_types: dict[str, dict[str, str]] = {}  # DuckDB's type of each column of each stream
        self.table_columns: dict[str, list[str]] = {}
        self.table_key_types: dict[str, str] = {}
        self.placement = placement.Placement()
        self.retained: frozenset[str] = frozenset()
        """Streams no procedure or EE trigger consumes: their batches are stored for Subscribe.

        Tuples of every other stream live only within the transaction that
        emits and consumes them."""

    # ---------------------------------------------------------------- persistence
    def to_json(self) -> str:
        data = {kind: {n: asdict(d) for n, d in self._objects(kind).items()} for kind in KINDS}
        data["version"] = self.version
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, resolve_python: PythonResolver | None = None) -> Catalog:
        data = json.loads(text)
        cat = cls()
        cat.version = data.get("version", 0)
        builders = {
            "table": TableDef,
            "stream": StreamDef,
            "window": WindowDef,
            "procedure": ProcedureDef,
            "trigger": TriggerDef,
            "index": IndexDef,
            "group": GroupDef,
        }
        for kind, build in builders.items():
            objects = cat._objects(kind)
            for name, d in data.get(kind, {}).items():
                if kind == "stream":
                    d["columns"] = [tuple(c) for c in d["columns"]]
                if kind == "procedure":
                    d["params"] = [tuple(p) for p in d["params"]]
                objects[name] = build(**d)
        cat.analyze(resolve_python)
        return cat

    def save(self, path: Path) -> None:
        atomic_write(path, self.to_json())

    @classmethod
    def load(cls, path: Path, resolve_python: PythonResolver | None = None) -> Catalog:
        if not path.exists():
            return cls()
        return cls.from_json(path.read_text(), resolve_python)

    def _clone(self) -> Catalog:
        data = json.loads(self.to_json())
        cat = Catalog()
        cat.version = self.version
        for kind in KINDS:
            src = self._objects(kind)
            dst = cat._objects(kind)
            for name in data.get(kind, {}):
                dst[name] = _copy_def(src[name])
        return cat

    def _objects(self, kind: str) -> dict[str, Any]:
        return {
            "table": self.tables,
            "stream": self.streams,
            "window": self.windows,
            "procedure": self.procedures,
            "trigger": self.triggers,
            "index": self.indexes,
            "group": self.groups,
        }[kind]

    def kind_of(self, name: str, kind: str | None = None) -> str | None:
        """The kind of the object named `name` in the namespace of `kind`.

        Relations (tables, streams, windows, indexes) share one namespace; code
        (procedures, triggers, groups) another, so a procedure may share its
        table's name (the voter's `leaderboard`).
        """
        space = KINDS if kind is None else (CODE_KINDS if kind in CODE_KINDS else RELATION_KINDS)
        for k in space:
            if name in self._objects(k):
                return k
        return None

    # -------------------------------------------------------------------- deploy
    def deploy(
        self, script: str, resolve_python: PythonResolver | None = None
    ) -> tuple[Catalog, list[tuple[str, str]], list[tuple[str, str]], list[str]]:
        """Applies a deploy script to a copy of this catalog.

        Returns (new catalog, created, dropped, physical DDL for partitions).
        Raises InvalidArgument, naming the statement, if anything is wrong; then
        nothing changes anywhere.
        """
        try:
            statements = ddl.parse_script(script)
        except ddl.DdlError as e:
            raise InvalidArgument(f"deploy: {e}") from None
        if not statements:
            raise InvalidArgument("deploy: the script holds no statement")
        if len(statements) > MAX_DEPLOY_STATEMENTS:
            raise InvalidArgument(
                f"deploy: the script holds {len(statements):,} statements; at most {MAX_DEPLOY_STATEMENTS:,} "
                "are accepted in one deploy (split it)"
            )
        new = self._clone()
        created: list[tuple[str, str]] = []
        dropped: list[tuple[str, str]] = []
        for st in statements:
            new._apply(st, created, dropped)
        for kind, name in created:
            if len(name.encode()) > MAX_NAME_BYTES:
                raise InvalidArgument(
                    f"deploy: {kind} {name[:32]!r}... has a name of {len(name.encode()):,} bytes; "
                    f"names are at most {MAX_NAME_BYTES} bytes"
                )
        new.version = self.version + 1
        new.analyze(resolve_python)
        new._check_pushable(self, {name for kind, name in created if kind == "stream"})
        physical = physical_diff(self, new, set(dropped))
        return new, created, dropped, physical

    def _check_pushable(self, before: Catalog, created: set[str]) -> None:
        """Producers push only types the wire reads exactly (docs/protocol.md, "Rows"): a border stream new
        to this deploy may not hold a column whose Arrow form is wider than its SQL type (a UUID travels as
        VARCHAR): a value DuckDB refuses would only fail once the batch had committed."""
        for stream in sorted(self.streams):
            was_border = stream in before.streams and stream not in created and before.is_border(stream)
            if was_border or not self.is_border(stream):
                continue
            for column, sql_type in self.stream_types[stream].items():
                found = _UNPUSHABLE.search(sql_type)
                if found:
                    raise InvalidArgument(
                        f"deploy: stream {stream!r}: column {column!r} is {sql_type}, which a push cannot carry "
                        f"exactly: declare it {_PUSHABLE_AS[found[1] or found[2]]} and convert it in SQL"
                    )

    def _apply(self, st: ddl.Statement, created: list, dropped: list) -> None:
        line = f"line {st.line}"
        if isinstance(st, ddl.Drop):
            objects = self._objects(st.kind)
            if st.name not in objects:
                if st.if_exists:
                    return
                raise InvalidArgument(f"deploy: {line}: DROP {st.kind.upper()} {st.name}: no such {st.kind}")
            self._check_unused(st.kind, st.name, line)
            del objects[st.name]
            dropped.append((st.kind, st.name))
            return
        kind, obj, replace, if_not_exists = _definition(st)
        existing = self.kind_of(obj.name, kind)
        if existing is not None:
            if if_not_exists and existing == kind:
                return
            if not (replace and existing == kind):
                raise InvalidArgument(
                    f"deploy: {line}: CREATE {kind.upper()} {obj.name}: a {existing} named {obj.name!r} already exists"
                )
        self._objects(kind)[obj.name] = obj
        created.append((kind, obj.name))

    def _check_unused(self, kind: str, name: str, line: str) -> None:
        users: list[str] = []
        if kind == "stream":
            users += [f"procedure {p.name}" for p in self.procedures.values() if p.on_stream == name]
            users += [f"window {w.name}" for w in self.windows.values() if w.stream == name]
            users += [f"trigger {t.name}" for t in self.triggers.values() if t.target == name]
        elif kind == "window":
            users += [f"trigger {t.name}" for t in self.triggers.values() if t.target == name]
        elif kind == "procedure":
            users += [f"group {g.name}" for g in self.groups.values() if name in g.procedures]
        elif kind == "table":
            users += [f"table {t.name} (FOREIGN KEY)" for t in self.tables.values() if name in referenced_tables(t.sql)]
        if users:
            raise InvalidArgument(
                f"deploy: {line}: cannot drop {kind} {name!r}: used by {', '.join(users)}; drop those first"
            )

    # ------------------------------------------------------------------- analyze
    def analyze(self, resolve_python: PythonResolver | None = None) -> None:
        """Derives plans, the dataflow graph and schemas; validates everything."""
        consumed = {p.on_stream for p in self.procedures.values()}
        triggered = {t.target for t in self.triggers.values() if t.target_kind == "stream"}
        self.retained = frozenset(set(self.streams) - triggered - consumed)
        con = self.scratch_database()
        try:
            self._derive_schemas(con)
            self._derive_windows()
            self.plans = {}
            self.trigger_plans = {}
            for proc in self.procedures.values():
                self.plans[proc.name] = self._plan_procedure(proc, con, resolve_python)
            for trig in self.triggers.values():
                self.trigger_plans[trig.name] = self._plan_trigger(trig, con)
        finally:
            con.close()
        self._derive_graph()
        self._check_groups()
        self.placement = placement.derive(self)
        self._compile_owned_inserts()

    def _compile_owned_inserts(self) -> None:
        for unit, rewrites in self.placement.owned_inserts.items():
            kind, _, name = unit.rpartition(" ")
            if kind == "trigger":
                trig = self.triggers[name]
                plan = self.trigger_plans[name]
                if trig.target_kind == "stream":
                    scope = self.scope(f"trigger {name}", trig.target, set(), set())
                else:
                    scope = self.scope(f"trigger {name}", None, {trig.target}, set())
            else:
                proc = self.procedures[unit]
                plan = self.plans[unit]
                scope = self.scope(
                    f"procedure {unit}",
                    proc.on_stream,
                    set(self.owned_windows(unit)),
                    {p for p, _ in proc.params},
                    tuple(proc.params),
                )
            plan.owned = {i: compile_statement(sql, scope) for i, sql in rewrites.items()}

    def _check_groups(self) -> None:
        """A transaction group must be able to run as one unit, back to back.

        So no procedure outside it may depend on one member and feed another
        (it would have to run in the middle), and the procedures one stream
        feeds (taken or refused together per batch) may not span two groups.
        """
        owner: dict[str, str] = {}
        for group in self.groups.values():
            for p in group.procedures:
                if p not in self.procedures:
                    raise InvalidArgument(f"deploy: transaction group {group.name!r} names unknown procedure {p!r}")
                if p in owner and owner[p] != group.name:
                    raise InvalidArgument(
                        f"deploy: procedure {p!r} is in two transaction groups: {owner[p]}, {group.name}"
                    )
                owner[p] = group.name
                if self.procedures[p].each_row:
                    raise InvalidArgument(
                        f"deploy: procedure {p!r} is FOR EACH ROW, so it cannot be in transaction group "
                        f"{group.name!r}: each of its TEs takes one tuple; group the procedures downstream of it"
                    )
        feeds: dict[str, set[str]] = {p: set() for p in self.procedures}
        for p in self.procedures:
            for stream in self.emitted_by(p):
                feeds[p] |= set(self.consumers.get(stream, []))
        reach = {p: _reachable(p, feeds) for p in self.procedures}
        for group in self.groups.values():
            members = set(group.procedures)
            for q in sorted(set(self.procedures) - members):
                before = sorted(m for m in members if q in reach[m])
                after = sorted(m for m in members if m in reach[q])
                if before and after:
                    raise InvalidArgument(
                        f"deploy: transaction group {group.name!r} is split by procedure {q!r}, which runs after "
                        f"{before[0]} and before {after[0]}; add {q!r} to the group or regroup"
                    )
        for stream, consumers in self.consumers.items():
            groups = sorted({owner[p] for p in consumers if p in owner})
            if len(groups) > 1:
                raise InvalidArgument(
                    f"deploy: stream {stream!r} feeds procedures of transaction groups {', '.join(groups)}; the "
                    "procedures of one stream are taken together per batch, so they can be in one group at most"
                )

    def emitted_by(self, procedure: str) -> set[str]:
        """Streams a procedure's TE can emit on, directly or through EE triggers."""
        out = set(self.plans[procedure].emits)
        todo = list(out)
        while todo:
            stream = todo.pop()
            for trig in self.triggers_on("stream", stream):
                for s in self.trigger_plans[trig].emits - out:
                    out.add(s)
                    todo.append(s)
        return out

    def reaches_each_row(self, streams: list[str]) -> bool:
        """Whether tuples on `streams` can reach a FOR EACH ROW procedure (then a command runs tuple by tuple)."""
        seen = set(streams)
        todo = list(streams)
        while todo:
            stream = todo.pop()
            if any(self.procedures[p].each_row for p in self.consumers.get(stream, [])):
                return True
            triggers = self.triggers_on("stream", stream)
            for w in self.windows.values():
                triggers += self.triggers_on("window", w.name) if w.stream == stream else []
            out = {s for t in triggers for s in self.trigger_plans[t].emits}
            out |= {s for p in self.consumers.get(stream, []) for s in self.emitted_by(p)}
            todo += sorted(out - seen)
            seen |= out
        return False

    def scratch_database(self) -> duckdb.DuckDBPyConnection:
        """An empty in-memory database with this catalog's physical schema."""
        con = duckdb.connect(config={"enable_external_access": False})
        for stmt in create_statements(self):
            try:
                con.execute(stmt.sql)
            except duckdb.Error as e:
                raise InvalidArgument(f"deploy: {stmt.what}: {_duck_message(e)}") from None
        return con

    def _derive_schemas(self, con: duckdb.DuckDBPyConnection) -> None:
        self.stream_schemas = {}
        self.stream_types = {}
        for name in self.streams:
            cols = ", ".join(quote(c) for c, _ in self.streams[name].columns)
            self.stream_schemas[name] = (
                con.sql(f"SELECT {cols} FROM {STREAM_SCHEMA}.{quote(name)} LIMIT 0").to_arrow_table().schema
            )
            described = con.execute(f"DESCRIBE {STREAM_SCHEMA}.{quote(name)}").fetchall()
            self.stream_types[name] = {r[0]: r[1] for r in described}
        described = {name: con.execute(f"DESCRIBE {quote(name)}").fetchall() for name in self.tables}
        self.table_columns = {name: [r[0] for r in rows] for name, rows in described.items()}
        self.table_key_types = {}
        for table in self.tables.values():
            if table.partition_by and table.partition_by not in self.table_columns[table.name]:
                raise InvalidArgument(
                    f"deploy: table {table.name!r}: PARTITION BY column {table.partition_by!r} does not exist"
                )
            if table.partition_by:
                key_type = dict((r[0], r[1]) for r in described[table.name])[table.partition_by]
                _check_key_type(f"table {table.name!r}", table.partition_by, key_type)
                self.table_key_types[table.name] = key_type
        for stream in self.streams.values():
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
            if "batch_id" in names:
                raise InvalidArgument(f"deploy: stream {stream.name!r}: column name 'batch_id' is reserved")

    def _derive_windows(self) -> None:
        """Each window belongs to one procedure: the consumer of its stream that uses it.

        The owner's TEs feed the window with their input batch and are the only
        code (with the window's EE triggers) that may read it.
        """
        self.window_owner = {}
        for w in self.windows.values():
            if w.stream not in self.streams:
                raise InvalidArgument(f"deploy: window {w.name!r} is on unknown stream {w.stream!r}")
            if w.kind == "range" and "ts" not in dict(self.streams[w.stream].columns):
                raise InvalidArgument(
                    f"deploy: window {w.name!r}: RANGE windows need a 'ts BIGINT' column on stream {w.stream!r}"
                )
            consumers = sorted(p.name for p in self.procedures.values() if p.on_stream == w.stream)
            if len(consumers) > 1:
                consumers = [p for p in consumers if any(_mentions(st, w.name) for st in self.procedures[p].body)]
            if len(consumers) != 1:
                why = "no procedure consumes it" if not consumers else f"{', '.join(consumers)} all use it"
                raise InvalidArgument(
                    f"deploy: window {w.name!r} on stream {w.stream!r} needs exactly one owner, the "
                    f"procedure ON STREAM {w.stream} that uses it; {why}"
                )
            self.window_owner[w.name] = consumers[0]

    def scope(
        self,
        owner: str,
        input_stream: str | None,
        owned: set[str],
        params: set[str],
        param_types: tuple[tuple[str, str], ...] = (),
    ) -> Scope:
        return Scope(
            owner=owner,
            tables=frozenset(self.tables),
            streams={n: tuple(c for c, _ in s.columns) for n, s in self.streams.items()},
            windows={n: self.window_owner.get(n, "") for n in self.windows},
            input_stream=input_stream,
            owned_windows=frozenset(owned),
            params=frozenset(params),
            retained=self.retained,
            param_types=param_types,
        )

    def owned_windows(self, procedure: str) -> list[str]:
        return sorted(w for w, owner in self.window_owner.items() if owner == procedure)

    def _plan_procedure(
        self,
        proc: ProcedureDef,
        con: duckdb.DuckDBPyConnection,
        resolve_python: PythonResolver | None,
    ) -> Plan:
        what = f"procedure {proc.name!r}"
        if proc.on_stream is not None and proc.on_stream not in self.streams:
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
                    if s not in self.streams:
                        raise InvalidArgument(f"deploy: {what} ({proc.python}) emits unknown stream {s!r}")
            eventkeys.check_kind(proc, fn, resolve_python is not None)
            return Plan([], emits)
        eventkeys.check_kind(proc, None, False)
        scope = self.scope(
            f"procedure {proc.name}",
            proc.on_stream,
            set(self.owned_windows(proc.name)),
            set(names),
            tuple(proc.params),
        )
        statements = []
        for sql, line in zip(proc.body, proc.body_lines or [0] * len(proc.body), strict=False):
            compiled = _compiled(sql, scope, line)
            self._bind_check(con, compiled, proc.on_stream, f"deploy: {what} (line {line})")
            statements.append(compiled)
        return Plan(statements, frozenset(s.emits for s in statements if s.emits))

    def _plan_trigger(self, trig: TriggerDef, con: duckdb.DuckDBPyConnection) -> Plan:
        what = f"trigger {trig.name!r}"
        if trig.target_kind == "stream" and trig.target not in self.streams:
            raise InvalidArgument(f"deploy: {what} is ON STREAM {trig.target!r}, which does not exist")
        if trig.target_kind == "window" and trig.target not in self.windows:
            raise InvalidArgument(f"deploy: {what} is ON WINDOW {trig.target!r}, which does not exist")
        if trig.target_kind == "stream":
            scope = self.scope(f"trigger {trig.name}", trig.target, set(), set())
            stream = trig.target
        else:
            scope = self.scope(f"trigger {trig.name}", None, {trig.target}, set())
            stream = None
        statements = []
        for sql, line in zip(trig.body, trig.body_lines or [0] * len(trig.body), strict=False):
            compiled = _compiled(sql, scope, line)
            self._bind_check(con, compiled, stream, f"deploy: {what} (line {line})")
            statements.append(compiled)
        return Plan(statements, frozenset(s.emits for s in statements if s.emits))

    def _bind_check(
        self,
        con: duckdb.DuckDBPyConnection,
        compiled: Compiled,
        input_stream: str | None,
        what: str,
    ) -> None:
        """Binds the statement (EXPLAIN) on the empty scratch database.

        DuckDB's binder reports unknown tables and columns, type mismatches and
        unknown functions in its own words; nothing is executed.
        """
        if input_stream is not None:
            cols = ", ".join(quote(c) for c, _ in self.streams[input_stream].columns)
            con.execute(
                f"CREATE OR REPLACE TEMP VIEW {quote(batch_relation(input_stream))} AS "
                f"SELECT {cols} FROM {STREAM_SCHEMA}.{quote(input_stream)} WHERE false"
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

    def _derive_graph(self) -> None:
        self.consumers = {s: [] for s in self.streams}
        self.producers_of = {s: [] for s in self.streams}
        edges: dict[str, set[str]] = {}
        for proc in self.procedures.values():
            node = f"procedure {proc.name}"
            if proc.on_stream:
                self.consumers[proc.on_stream].append(proc.name)
                edges.setdefault(f"stream {proc.on_stream}", set()).add(node)
            for s in sorted(self.plans[proc.name].emits):
                self.producers_of[s].append(proc.name)
                edges.setdefault(node, set()).add(f"stream {s}")
        for trig in self.triggers.values():
            src = f"stream {trig.target}" if trig.target_kind == "stream" else f"window {trig.target}"
            if trig.target_kind == "window":
                w = self.windows[trig.target]
                edges.setdefault(f"stream {w.stream}", set()).add(src)
            for s in sorted(self.trigger_plans[trig.name].emits):
                edges.setdefault(src, set()).add(f"stream {s}")
        for s in self.consumers:
            self.consumers[s].sort()
        order = _toposort(edges)
        self.topo_rank = {n.split(" ", 1)[1]: i for i, n in enumerate(order) if n.startswith("procedure ")}
        for s in self.consumers:
            self.consumers[s].sort(key=lambda p: self.topo_rank.get(p, 0))

    # ------------------------------------------------------------------- queries
    def is_border(self, stream: str) -> bool:
        """A border stream is fed from outside: no procedure or trigger emits on it."""
        return not self.producers_of.get(stream) and not any(
            stream in plan.emits for plan in self.trigger_plans.values()
        )

    def triggers_on(self, kind: str, target: str) -> list[str]:
        return sorted(t.name for t in self.triggers.values() if t.target_kind == kind and t.target == target)

    def group_of(self, procedure: str) -> str | None:
        for g in self.groups.values():
            if procedure in g.procedures:
                return g.name
        return None

    def names(self, kind: str) -> list[str]:
        return sorted(self._objects(kind))


@dataclass(frozen=True)
class PhysicalStatement:
    what: str
    sql: str


def create_statements(cat: Catalog) -> list[PhysicalStatement]:
    """The DDL that builds `cat`'s physical schema in an empty database."""
    out = [
        PhysicalStatement("system", f"CREATE SCHEMA IF NOT EXISTS {STREAM_SCHEMA}"),
        PhysicalStatement("system", f"CREATE SCHEMA IF NOT EXISTS {WINDOW_SCHEMA}"),
        PhysicalStatement("system", f"CREATE SCHEMA IF NOT EXISTS {SYSTEM_SCHEMA}"),
    ]
    for name in table_order(cat.tables):
        out += _create_object(cat, "table", name)
    for name in sorted(cat.streams):
        out += _create_object(cat, "stream", name)
    for name in sorted(cat.windows):
        out += _create_object(cat, "window", name)
    for name in sorted(cat.indexes):
        out += _create_object(cat, "index", name)
    return out


@functools.lru_cache(maxsize=1024)
def referenced_tables(table_sql: str) -> frozenset[str]:
    """Tables a CREATE TABLE's FOREIGN KEYs point at (catalog spelling: unquoted names lower-cased)."""
    try:
        tree = sqltree.parse(table_sql)
    except sqlglot.errors.ParseError:
        return frozenset()  # DuckDB itself reports the statement when the schema is built
    names = set()
    for ref in tree.find_all(exp.Reference):
        table = ref.find(exp.Table)
        if table is not None and isinstance(table.this, exp.Identifier):
            names.add(table.name if table.this.quoted else table.name.lower())
    return frozenset(names)


def table_order(tables: dict[str, TableDef]) -> list[str]:
    """Table names with every FOREIGN KEY's target before the table holding it, else by name.

    DuckDB creates a referencing table only after its target and drops it only
    before; creates follow this order, drops the reverse.
    """
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for name in sorted(tables):
        sorter.add(name, *sorted(referenced_tables(tables[name].sql) & tables.keys() - {name}))
    try:
        return list(sorter.static_order())
    except graphlib.CycleError as e:
        raise InvalidArgument(f"deploy: tables {', '.join(sorted(set(e.args[1])))} reference each other") from None


def _create_object(cat: Catalog, kind: str, name: str) -> list[PhysicalStatement]:
    what = f"{kind} {name!r}"
    if kind == "table":
        return [PhysicalStatement(what, cat.tables[name].sql)]
    if kind == "stream":
        s = cat.streams[name]
        cols = ", ".join(f"{quote(c)} {t}" for c, t in s.columns)
        names = ", ".join(quote(c) for c, _ in s.columns)
        return [
            PhysicalStatement(
                what,
                f"CREATE TABLE {STREAM_SCHEMA}.{quote(name)} ({cols}, batch_id BIGINT NOT NULL)",
            ),
            PhysicalStatement(
                what,
                f"CREATE VIEW {quote(name)} AS SELECT {names}, batch_id FROM {STREAM_SCHEMA}.{quote(name)}",
            ),
        ]
    if kind == "window":
        w = cat.windows[name]
        s = cat.streams.get(w.stream)
        if s is None:
            raise InvalidArgument(f"deploy: window {name!r} is on unknown stream {w.stream!r}")
        cols = ", ".join(f"{quote(c)} {t}" for c, t in s.columns)
        names = ", ".join(quote(c) for c, _ in s.columns)
        return [
            PhysicalStatement(
                what,
                f"CREATE TABLE {WINDOW_SCHEMA}.{quote(name)} ({cols}, batch_id BIGINT NOT NULL, "
                "__seq BIGINT NOT NULL, __staged BOOLEAN NOT NULL)",
            ),
            PhysicalStatement(
                what,
                f"CREATE VIEW {quote(name)} AS SELECT {names} FROM {WINDOW_SCHEMA}.{quote(name)} WHERE NOT __staged",
            ),
        ]
    if kind == "index":
        return [PhysicalStatement(what, cat.indexes[name].sql)]
    return []


def _drop_object(old: Catalog, kind: str, name: str) -> list[str]:
    if kind == "table":
        return [f"DROP TABLE {quote(name)}"]
    literal = "'" + name.replace("'", "''") + "'"
    if kind == "stream":  # a stream created again under this name starts with fresh dedup marks
        return [
            f"DROP VIEW {quote(name)}",
            f"DROP TABLE {STREAM_SCHEMA}.{quote(name)}",
            f"DELETE FROM {SYSTEM_SCHEMA}.producers WHERE stream = {literal}",
            f"DELETE FROM {SYSTEM_SCHEMA}.rejections WHERE stream = {literal}",
        ]
    if kind == "window":
        return [
            f"DROP VIEW {quote(name)}",
            f"DROP TABLE {WINDOW_SCHEMA}.{quote(name)}",
            f"DELETE FROM {SYSTEM_SCHEMA}.window_ends WHERE window_name = {literal}",
        ]
    if kind == "index":
        return [f"DROP INDEX {quote(name)}"]
    return []


PHYSICAL_KINDS = ("index", "window", "stream", "table")


def physical_diff(old: Catalog, new: Catalog, dropped: set[tuple[str, str]] = frozenset()) -> list[str]:
    """DDL that turns `old`'s physical schema into `new`'s (drops first, then creates).

    An object that changed, or was dropped and created again by the deploy, is
    rebuilt empty; an object the deploy did not touch keeps its data.
    """

    def changed(kind: str, name: str, before: dict, after: dict) -> bool:
        return (kind, name) in dropped or asdict(after[name]) != asdict(before[name])

    def order(cat: Catalog, kind: str) -> list[str]:
        return table_order(cat.tables) if kind == "table" else sorted(cat._objects(kind))

    out: list[str] = []
    for kind in PHYSICAL_KINDS:
        before, after = old._objects(kind), new._objects(kind)
        for name in reversed(order(old, kind)):
            if name not in after or changed(kind, name, before, after):
                out += _drop_object(old, kind, name)
    for kind in reversed(PHYSICAL_KINDS):
        before, after = old._objects(kind), new._objects(kind)
        for name in order(new, kind):
            if name not in before or changed(kind, name, before, after):
                out += [s.sql for s in _create_object(new, kind, name)]
    return out


def _definition(st: ddl.Statement) -> tuple[str, Any, bool, bool]:
    if isinstance(st, ddl.CreateTable):
        return "table", TableDef(st.name, st.sql, st.partition_by, st.replicated), False, st.if_not_exists
    if isinstance(st, ddl.CreateStream):
        cols = [(c.name, c.type) for c in st.columns]
        return "stream", StreamDef(st.name, cols, st.partition_by), False, st.if_not_exists
    if isinstance(st, ddl.CreateWindow):
        return (
            "window",
            WindowDef(st.name, st.stream, st.kind, st.size, st.slide),
            False,
            st.if_not_exists,
        )
    if isinstance(st, ddl.CreateProcedure):
        keyed_stream = st.on_stream is not None and st.partition_on is not None
        proc = ProcedureDef(
            name=st.name,
            params=[(p.name, p.type) for p in st.params],
            on_stream=st.on_stream,
            partition_on=None if keyed_stream else st.partition_on,
            body=list(st.body),
            body_lines=list(st.body_lines),
            python=st.python,
            key_columns=[st.partition_on] if keyed_stream else list(st.partition_on_columns),
            each_row=st.each_row,
        )
        return "procedure", proc, st.or_replace, False
    if isinstance(st, ddl.CreateTrigger):
        trig = TriggerDef(st.name, st.target_kind, st.target, list(st.body), list(st.body_lines))
        return "trigger", trig, st.or_replace, False
    if isinstance(st, ddl.CreateIndex):
        return "index", IndexDef(st.name, st.sql), False, False
    if isinstance(st, ddl.CreateGroup):
        return "group", GroupDef(st.name, list(st.procedures)), False, False
    raise InvalidArgument(f"deploy: unsupported statement {st!r}")


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


def _copy_def(d: Any) -> Any:
    return type(d)(**json.loads(json.dumps(asdict(d))))


def _mentions(sql: str, name: str) -> bool:
    return name in referenced_names(sql)


def _reachable(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(edges.get(n, ()))
    return seen


def _toposort(edges: dict[str, set[str]]) -> list[str]:
    """Kahn's algorithm with name order for ties; a cycle is InvalidArgument naming it."""
    nodes = set(edges) | {m for ms in edges.values() for m in ms}
    indeg = {n: 0 for n in nodes}
    for ms in edges.values():
        for m in ms:
            indeg[m] += 1
    ready = sorted(n for n, d in indeg.items() if d == 0)
    order = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for m in sorted(edges.get(n, ())):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
                ready.sort()
    if len(order) != len(nodes):
        raise InvalidArgument(f"deploy: the dataflow graph has a cycle: {_find_cycle(edges)}")
    return order


def _find_cycle(edges: dict[str, set[str]]) -> str:
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if color.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in color:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = 2
        return None

    for n in sorted(edges):
        if n not in color:
            cycle = visit(n)
            if cycle:
                return " -> ".join(cycle)
    return "?"


_UNPUSHABLE = re.compile(
    r"\b(UHUGEINT|UUID|JSON|BIT|INTERVAL|BIGNUM|VARINT|TIME WITH TIME ZONE)(?=[,)\[]|$)|\b(ENUM|UNION)\("
)
_PUSHABLE_AS = {
    "UHUGEINT": "HUGEINT or DECIMAL(38,0)",
    "UUID": "VARCHAR",
    "JSON": "VARCHAR",
    "ENUM": "VARCHAR",
    "BIT": "VARCHAR",
    "INTERVAL": "BIGINT (microseconds)",
    "BIGNUM": "VARCHAR or DECIMAL",
    "VARINT": "VARCHAR or DECIMAL",
    "TIME WITH TIME ZONE": "TIMESTAMPTZ or TIME",
    "UNION": "one column per member",
}
"""SQL types whose Arrow form a push could send values of that DuckDB refuses (UUID: any VARCHAR) or changes
(INTERVAL: nanoseconds, BIT: its bytes); what to declare instead."""

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
    from sqlglot import exp

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


def _duck_message(e: Exception) -> str:
    """DuckDB's message, first line plus the LINE pointer if present, compacted."""
    text = str(e).strip()
    return " ".join(part.strip() for part in text.splitlines() if part.strip())
