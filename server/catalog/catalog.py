"""The catalog: tables, streams, windows, views, procedures, triggers, groups.

A `Catalog` is a value: `deploy` returns a new, fully validated catalog or
raises InvalidArgument and leaves the old one as it was, which is what makes a
deploy all-or-nothing. The front and every partition hold the same catalog;
it is persisted as JSON in the data directory.

This module only orchestrates a deploy: parse (ddl.py), apply to a copy of
the definitions (defs.py), analyze (bind.py binds the SQL on a scratch
database, graph.py derives the dataflow, placement.py where rows live and
code runs), and diff the physical schemas (physical.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa

from streamtx.errors import InvalidArgument
from streamtx.files import atomic_write
from streamtx.server.catalog import bind, ddl, defs, graph, physical, placement, views
from streamtx.server.catalog.bind import Plan, PythonResolver
from streamtx.server.catalog.compile import Scope, compile_statement
from streamtx.server.catalog.defs import Definitions, TableDef
from streamtx.server.catalog.physical import referenced_tables

MAX_NAME_BYTES = 256
"""An object, stream, producer, procedure or parameter name (README, Limits)."""
MAX_DEPLOY_STATEMENTS = 1_000


class Catalog(Definitions):
    """Definitions plus what is derived from them (plans, graph, schemas, placement)."""

    def __init__(self) -> None:
        super().__init__()
        # derived by analyze()
        self.plans: dict[str, Plan] = {}
        self.trigger_plans: dict[str, Plan] = {}
        self.dataflow = graph.Dataflow()
        self.schemas = bind.Schemas()
        self.placement = placement.Placement()
        self.view_plans: dict[str, views.ViewPlan] = {}
        self.views_on: dict[str, list[views.ViewPlan]] = {}  # table -> the views that follow it
        self.readable: dict[str, TableDef] = {}
        """The tables and the views (as the tables they are to readers): what SQL may read by name."""
        self.retained: frozenset[str] = frozenset()
        """Streams no procedure or EE trigger consumes: their batches are stored for Subscribe.

        Tuples of every other stream live only within the transaction that
        emits and consumes them."""

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, resolve_python: PythonResolver | None = None) -> Catalog:
        cat = cls.from_dict(json.loads(text))
        cat.analyze(resolve_python)
        return cat

    def save(self, path: Path) -> None:
        atomic_write(path, self.to_json())

    @classmethod
    def load(cls, path: Path, resolve_python: PythonResolver | None = None) -> Catalog:
        if not path.exists():
            return cls()
        return cls.from_json(path.read_text(), resolve_python)

    def relations(self) -> physical.Relations:
        """The definitions that have a physical form (for physical.create_statements)."""
        return physical.Relations(self.tables, self.streams, self.windows, self.indexes, self.views)

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
        new = self.copy()
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
        ddl_diff = physical.diff(self.relations(), new.relations(), set(dropped))
        return new, created, dropped, ddl_diff

    def _check_pushable(self, before: Catalog, created: set[str]) -> None:
        """Producers push only types the wire reads exactly (docs/protocol.md, "Rows"): a border stream new
        to this deploy may not hold a column whose Arrow form is wider than its SQL type (a UUID travels as
        VARCHAR): a value DuckDB refuses would only fail once the batch had committed."""
        for stream in sorted(self.streams):
            was_border = stream in before.streams and stream not in created and before.is_border(stream)
            if was_border or not self.is_border(stream):
                continue
            for column, sql_type in self.schemas.stream_types[stream].items():
                found = _UNPUSHABLE.search(sql_type)
                if found:
                    raise InvalidArgument(
                        f"deploy: stream {stream!r}: column {column!r} is {sql_type}, which a push cannot carry "
                        f"exactly: declare it {_PUSHABLE_AS[found[1] or found[2]]} and convert it in SQL"
                    )

    def _apply(self, st: ddl.Statement, created: list, dropped: list) -> None:
        line = f"line {st.line}"
        if isinstance(st, ddl.Drop):
            objects = self.objects(st.kind)
            if st.name not in objects:
                if st.if_exists:
                    return
                raise InvalidArgument(f"deploy: {line}: DROP {st.kind.upper()} {st.name}: no such {st.kind}")
            self._check_unused(st.kind, st.name, line)
            del objects[st.name]
            dropped.append((st.kind, st.name))
            return
        kind, obj, replace, if_not_exists = defs.from_statement(st)
        existing = self.kind_of(obj.name, kind)
        if existing is not None:
            if if_not_exists and existing == kind:
                return
            if not (replace and existing == kind):
                raise InvalidArgument(
                    f"deploy: {line}: CREATE {kind.upper()} {obj.name}: a {existing} named {obj.name!r} already exists"
                )
        self.objects(kind)[obj.name] = obj
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
            users += [f"view {v.name}" for v in self.views.values() if physical.view_table(v) == name]
        if users:
            raise InvalidArgument(
                f"deploy: {line}: cannot drop {kind} {name!r}: used by {', '.join(users)}; drop those first"
            )

    # ------------------------------------------------------------------- analyze
    def analyze(self, resolve_python: PythonResolver | None = None) -> None:
        """Derives plans, the dataflow graph and schemas; validates everything."""
        self.retained = graph.retained(self.streams, self.procedures.values(), self.triggers.values())
        con = bind.scratch_database(physical.create_statements(self.relations()))
        try:
            self.view_plans = views.analyze(self.views, self.tables, con)
            self.views_on = {}
            for plan in self.view_plans.values():
                self.views_on.setdefault(plan.table, []).append(plan)
            self.readable = {**self.tables, **views.as_tables(self.view_plans, self.tables)}
            self.schemas = bind.derive_schemas(con, self.readable, self.streams)
            owners = graph.window_owners(self.windows, self.streams, self.procedures)
            base = bind.base_scope(self.readable, self.streams, self.windows, owners, self.retained, self.views)
            self.plans = {}
            self.trigger_plans = {}
            for proc in self.procedures.values():
                scope = bind.procedure_scope(base, proc, graph.owned_windows(owners, proc.name))
                self.plans[proc.name] = bind.plan_procedure(proc, con, scope, self.streams, resolve_python)
            for trig in self.triggers.values():
                scope = bind.trigger_scope(base, trig)
                self.trigger_plans[trig.name] = bind.plan_trigger(trig, con, scope, self.streams, self.windows)
        finally:
            con.close()
        self.dataflow = graph.derive(
            self.streams,
            self.procedures,
            {name: plan.emits for name, plan in self.plans.items()},
            self.triggers,
            {name: plan.emits for name, plan in self.trigger_plans.items()},
            self.windows,
            owners,
            self.groups,
        )
        graph.check_groups(self.groups, self.procedures, self.dataflow)
        self.placement = placement.derive(
            self.readable,
            self.streams,
            self.procedures,
            self.triggers,
            self.plans,
            self.trigger_plans,
            self.dataflow,
            self.schemas,
        )
        for unit, rewrites in self.placement.owned_inserts.items():
            kind, _, name = unit.rpartition(" ")
            if kind == "trigger":
                plan, scope = self.trigger_plans[name], bind.trigger_scope(base, self.triggers[name])
            else:
                plan = self.plans[unit]
                scope = bind.procedure_scope(base, self.procedures[unit], graph.owned_windows(owners, unit))
            plan.owned = {i: compile_statement(sql, scope) for i, sql in rewrites.items()}

    # ------------------------------------------------------------------- queries
    @property
    def consumers(self) -> dict[str, list[str]]:
        """Stream -> the procedures ON STREAM it, in topological order."""
        return self.dataflow.consumers

    @property
    def producers_of(self) -> dict[str, list[str]]:
        return self.dataflow.producers_of

    @property
    def topo_rank(self) -> dict[str, int]:
        return self.dataflow.topo_rank

    @property
    def window_owner(self) -> dict[str, str]:
        return self.dataflow.window_owner

    @property
    def stream_schemas(self) -> dict[str, pa.Schema]:
        return self.schemas.streams

    @property
    def table_columns(self) -> dict[str, list[str]]:
        return self.schemas.table_columns

    @property
    def table_key_types(self) -> dict[str, str]:
        return self.schemas.table_key_types

    def views_of(self, writes: frozenset[str] | None) -> list[str]:
        """The views a statement writing `writes` (None: any table) changes."""
        return sorted(p.name for p in self.view_plans.values() if writes is None or p.table in writes)

    def is_border(self, stream: str) -> bool:
        """A border stream is fed from outside: no procedure or trigger emits on it."""
        return self.dataflow.is_border(stream)

    def triggers_on(self, kind: str, target: str) -> list[str]:
        return self.dataflow.triggers_on(kind, target)

    def group_of(self, procedure: str) -> str | None:
        return self.dataflow.group_of(procedure)

    def owned_windows(self, procedure: str) -> list[str]:
        return self.dataflow.owned_windows(procedure)

    def emitted_by(self, procedure: str) -> set[str]:
        """Streams a procedure's TE can emit on, directly or through EE triggers."""
        return self.dataflow.emitted_by(procedure)

    def reaches_each_row(self, streams: list[str]) -> bool:
        """Whether tuples on `streams` can reach a FOR EACH ROW procedure (then a command runs tuple by tuple)."""
        return self.dataflow.reaches_each_row(streams)

    def scope(
        self,
        owner: str,
        input_stream: str | None,
        owned: set[str],
        params: set[str],
        param_types: tuple[tuple[str, str], ...] = (),
    ) -> Scope:
        """What SQL compiled for `owner` may name (the Python procedures' SQL is compiled at run time)."""
        base = bind.base_scope(self.readable, self.streams, self.windows, self.window_owner, self.retained, self.views)
        return bind.unit_scope(base, owner, input_stream, owned, params, param_types)


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
