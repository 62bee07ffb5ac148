"""What a deploy script defines: tables, streams, windows, procedures, triggers, indexes, views, groups.

These are the catalog's source of truth; everything else (plans, the dataflow
graph, placement, physical DDL) is derived from them. Their dict form is what
catalog.json, INSTALL log records and checkpoint meta store, so a field added
here needs a default for old data directories to load.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Self

from streamtx.errors import InvalidArgument
from streamtx.server.catalog import ddl
from streamtx.server.catalog.compile import SYSTEM_COLUMNS

KINDS = ("table", "stream", "window", "procedure", "trigger", "index", "view", "group")
RELATION_KINDS = ("table", "stream", "window", "index", "view")
CODE_KINDS = ("procedure", "trigger", "group")


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
class ViewDef:
    """A view kept up to date by every write to its table (catalog/views.py)."""

    name: str
    query: str


@dataclass
class GroupDef:
    name: str
    procedures: list[str]


Definition = TableDef | StreamDef | WindowDef | ProcedureDef | TriggerDef | IndexDef | ViewDef | GroupDef

_TYPES: dict[str, type[Definition]] = {
    "table": TableDef,
    "stream": StreamDef,
    "window": WindowDef,
    "procedure": ProcedureDef,
    "trigger": TriggerDef,
    "index": IndexDef,
    "view": ViewDef,
    "group": GroupDef,
}


class Definitions:
    """Every object a catalog defines, by kind, and its version (one more per deploy)."""

    def __init__(self) -> None:
        self.tables: dict[str, TableDef] = {}
        self.streams: dict[str, StreamDef] = {}
        self.windows: dict[str, WindowDef] = {}
        self.procedures: dict[str, ProcedureDef] = {}
        self.triggers: dict[str, TriggerDef] = {}
        self.indexes: dict[str, IndexDef] = {}
        self.views: dict[str, ViewDef] = {}
        self.groups: dict[str, GroupDef] = {}
        self.version = 0

    def objects(self, kind: str) -> dict[str, Any]:
        return {
            "table": self.tables,
            "stream": self.streams,
            "window": self.windows,
            "procedure": self.procedures,
            "trigger": self.triggers,
            "index": self.indexes,
            "view": self.views,
            "group": self.groups,
        }[kind]

    def kind_of(self, name: str, kind: str | None = None) -> str | None:
        """The kind of the object named `name` in the namespace of `kind`.

        Relations (tables, streams, windows, indexes, views) share one namespace; code
        (procedures, triggers, groups) another, so a procedure may share its
        table's name (the voter's `leaderboard`).
        """
        space = KINDS if kind is None else (CODE_KINDS if kind in CODE_KINDS else RELATION_KINDS)
        for k in space:
            if name in self.objects(k):
                return k
        return None

    def names(self, kind: str) -> list[str]:
        return sorted(self.objects(kind))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {kind: {n: asdict(d) for n, d in self.objects(kind).items()} for kind in KINDS}
        data["version"] = self.version
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The definitions `to_dict` gave."""
        out = cls()
        out.version = data.get("version", 0)
        for kind in KINDS:
            objects = out.objects(kind)
            for name, d in data.get(kind, {}).items():
                objects[name] = _from_dict(kind, d)
        return out

    def copy(self) -> Self:
        """A deep copy, so a deploy's new catalog shares nothing mutable with the old one.

        Its definitions equal the originals field for field (pairs stay tuples):
        the physical diff rebuilds, empty, any relation whose definition differs.
        """
        out = type(self)()
        out.version = self.version
        for kind in KINDS:
            src, dst = self.objects(kind), out.objects(kind)
            for name in sorted(src):
                dst[name] = _from_dict(kind, asdict(src[name]))
        return out


def _from_dict(kind: str, data: dict[str, Any]) -> Definition:
    """The definition `asdict` (or JSON, which has no tuples) gave, with its pairs as tuples."""
    if kind == "stream":
        data = {**data, "columns": [tuple(c) for c in data["columns"]]}
    if kind == "procedure":
        data = {**data, "params": [tuple(p) for p in data["params"]]}
    return _TYPES[kind](**data)


def from_statement(st: ddl.Statement) -> tuple[str, Definition, bool, bool]:
    """(kind, definition, OR REPLACE, IF NOT EXISTS) of a parsed CREATE statement."""
    if isinstance(st, ddl.CreateTable):
        return "table", TableDef(st.name, st.sql, st.partition_by, st.replicated), False, st.if_not_exists
    if isinstance(st, ddl.CreateStream):
        cols = [(c.name, c.type) for c in st.columns]
        taken = [c for c, _ in cols if c.lower() in SYSTEM_COLUMNS]
        if taken:
            raise InvalidArgument(
                f"deploy: stream {st.name!r}: column name {taken[0]!r} is reserved "
                f"(system columns: {', '.join(SYSTEM_COLUMNS)})"
            )
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
    if isinstance(st, ddl.CreateView):
        return "view", ViewDef(st.name, st.query), False, False
    if isinstance(st, ddl.CreateGroup):
        return "group", GroupDef(st.name, list(st.procedures)), False, False
    raise InvalidArgument(f"deploy: unsupported statement {st!r}")
