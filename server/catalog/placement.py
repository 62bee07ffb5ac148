"""Where rows live and where code runs, derived from the catalog (independent of the partition count).

Tables:
- `PARTITION BY (col)`: each row lives on the partition owning `bin(col)`;
- `REPLICATED`: a full copy on every partition;
- otherwise *single*: the rows live on partition 0 (the home partition).
Streams are partitioned (`PARTITION BY`) or single the same way.

Procedures (and the EE triggers their TEs fire):
- *partitioned*: ON STREAM of a partitioned stream, or an OLTP procedure with
  `PARTITION ON param`: a TE runs on the partition(s) owning its input's keys,
  each over its own rows. It may touch partitioned and read replicated tables;
  a single table or a write to a replicated one is refused at deploy.
- *everywhere*: any other procedure that touches a partitioned table or writes a
  replicated one: its TE runs on every partition. Each statement that writes
  a replicated or partitioned table, or reads a partitioned one, runs on every
  partition (emitted rows are the union of the partitions' rows); every other
  statement runs on the home partition only, so it takes effect, and emits,
  exactly once.
- *single*: everything else runs on the home partition.
- *event-keyed*: a state procedure with `PARTITION ON (columns)` (catalog/
  eventkeys.py): a TE runs on the partitions owning the keys in those
  columns of its batch: on one alone, like a partitioned TE; on several, by
  replicated execution over the rows they exchange (front/exchange.py).

A command is *local* when all its TEs run on one partition: `home` (all on
partition 0), `keyed` (on the partition owning the batch's keys, which the
front checks per batch) or `event-keyed` (a stream whose one consumer is an
event-keyed procedure whose outputs nothing consumes: local when the keys in
its PARTITION ON columns fall on one partition). Anything else is
*coordinated* by the front, TE by TE, every TE committed on all its
partitions or on none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.errors import ParseError

from streamtx.errors import InvalidArgument
from streamtx.server import sqltree
from streamtx.server.catalog import eventkeys
from streamtx.server.catalog.bind import Plan, Schemas
from streamtx.server.catalog.defs import ProcedureDef, StreamDef, TableDef, TriggerDef
from streamtx.server.catalog.graph import Dataflow

PARTITIONED = "partitioned"
REPLICATED = "replicated"
SINGLE = "single"
EVERYWHERE = "everywhere"
EVENT_KEYED = "event-keyed"  # a procedure kind and a push mode

HOME = "home"
KEYED = "keyed"
COORDINATED = "coordinated"


@dataclass
class Access:
    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)

    def __ior__(self, other: Access) -> Access:
        self.reads |= other.reads
        self.writes |= other.writes
        return self


def statement_access(sql: str, tables: set[str]) -> Access:
    """The user tables a statement reads and writes (by sqlglot's parse of the source)."""
    try:
        tree = sqltree.parse(sql)
    except ParseError:
        return Access()
    writes: set[str] = set()
    target = None
    if isinstance(tree, exp.Insert | exp.Update | exp.Delete):
        target = tree.this
        if isinstance(target, exp.Schema):
            target = target.this
        if isinstance(target, exp.Table) and not target.db and target.name in tables:
            writes.add(target.name)
    reads = {t.name for t in tree.find_all(exp.Table) if not t.db and t.name in tables and t is not target}
    if isinstance(tree, exp.Update | exp.Delete) and writes:
        reads |= writes  # their WHERE reads the target too
    return Access(reads, writes)


@dataclass
class Placement:
    tables: dict[str, str] = field(default_factory=dict)
    streams: dict[str, str | None] = field(default_factory=dict)  # stream -> partition column (None: single)
    procedures: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # partitioned procedure -> its key (column or parameter)
    home_only: dict[str, frozenset[int]] = field(default_factory=dict)
    """For everywhere procedures and triggers: statement indexes that run on the home partition only."""
    owned_inserts: dict[str, dict[int, str]] = field(default_factory=dict)
    """For everywhere units: INSERTs into partitioned tables, rewritten to keep only this partition's keys."""
    push_mode: dict[str, str] = field(default_factory=dict)
    call_mode: dict[str, str] = field(default_factory=dict)
    event_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # event-keyed procedure -> its columns
    stream_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Stream pushed in EVENT_KEYED mode -> the PARTITION ON columns of its consumer."""
    flows: dict[str, bool] = field(default_factory=dict)
    """Coordinated keyed streams whose batches may run as flows (front/flows.py): their consumers are
    partitioned by the stream's key, and what those emit is consumed on the home partition only. The value:
    a consumer is FOR EACH ROW (then a batch flows row by row, each row on its key's partition)."""

    def key_of_stream(self, stream: str) -> str | None:
        return self.streams.get(stream)


def derive(
    tables: Mapping[str, TableDef],
    streams: Mapping[str, StreamDef],
    procedures: Mapping[str, ProcedureDef],
    triggers: Mapping[str, TriggerDef],
    plans: Mapping[str, Plan],
    trigger_plans: Mapping[str, Plan],
    flow: Dataflow,
    schemas: Schemas,
) -> Placement:
    """Computes the placement of a catalog; raises InvalidArgument for code that cannot be placed.

    It weighs every definition, plan and edge of the graph: where code runs
    follows from the tables its statements touch, the streams that feed it and
    the triggers it fires.
    """
    pl = Placement()
    for t in tables.values():
        pl.tables[t.name] = PARTITIONED if t.partition_by else (REPLICATED if t.replicated else SINGLE)
    for s in streams.values():
        pl.streams[s.name] = s.partition_by
    names = set(tables)
    stmt_access = {
        name: [statement_access(c.source, names) for c in plan.statements]
        for name, plan in [*plans.items(), *((f"trigger {k}", v) for k, v in trigger_plans.items())]
    }

    def fired_triggers(proc: str) -> set[str]:
        out: set[str] = set()
        for w in flow.owned_windows(proc):
            out |= set(flow.triggers_on("window", w))
        for s in flow.emitted_by(proc):
            out |= set(flow.triggers_on("stream", s))
        return out

    def access_of(units: list[str]) -> Access:
        acc = Access()
        for u in units:
            for a in stmt_access.get(u, []):
                acc |= a
        return acc

    for proc in procedures.values():
        if proc.key_columns:
            assert proc.on_stream is not None
            stream = proc.on_stream
            eventkeys.check(proc, streams[stream], schemas.streams[stream], flow, sorted(fired_triggers(proc.name)))
            pl.procedures[proc.name] = EVENT_KEYED
            pl.event_keys[proc.name] = tuple(proc.key_columns)
            continue
        if proc.on_stream is not None and pl.streams.get(proc.on_stream):
            base, key = PARTITIONED, pl.streams[proc.on_stream]
        elif proc.on_stream is None and proc.partition_on is not None:
            base, key = PARTITIONED, proc.partition_on
        else:
            base, key = SINGLE, None
        fired = sorted(fired_triggers(proc.name))
        acc = access_of([proc.name, *(f"trigger {t}" for t in fired)])
        if base == PARTITIONED:
            assert key is not None
            pl.keys[proc.name] = key
            how = f"ON STREAM {proc.on_stream} (PARTITION BY {key})" if proc.on_stream else f"PARTITION ON {key}"
            for t in sorted(acc.reads | acc.writes):
                if pl.tables[t] == SINGLE:
                    raise InvalidArgument(
                        f"deploy: procedure {proc.name!r} runs {how} on the partition of its keys, but table {t!r} "
                        f"lives on one partition; declare {t!r} REPLICATED or PARTITION BY a column"
                    )
            for t in sorted(acc.writes):
                if pl.tables[t] == REPLICATED:
                    raise InvalidArgument(
                        f"deploy: procedure {proc.name!r} runs {how} on the partition of its keys, but writes "
                        f"replicated table {t!r}, whose writes must run on every partition; write it from a "
                        "procedure that is not partitioned"
                    )
            pl.procedures[proc.name] = PARTITIONED
            continue
        spans = any(pl.tables[t] == PARTITIONED for t in acc.reads | acc.writes) or any(
            pl.tables[t] == REPLICATED for t in acc.writes
        )
        pl.procedures[proc.name] = EVERYWHERE if spans else SINGLE
        if spans:
            for unit in [proc.name, *(f"trigger {t}" for t in fired)]:
                pl.home_only[unit] = frozenset(
                    i for i, a in enumerate(stmt_access.get(unit, [])) if not _spans(a, pl.tables)
                )
                _check_spanning_reads(proc.name, unit, stmt_access.get(unit, []), pl.tables)
                plan = plans.get(unit) or trigger_plans[unit.split(" ", 1)[1]]
                rewrites = {}
                for i, compiled in enumerate(plan.statements):
                    sql = owned_insert(compiled.source, tables, schemas)
                    if sql is not None:
                        rewrites[i] = sql
                if rewrites:
                    pl.owned_inserts[unit] = rewrites
    for trig in triggers.values():
        if trig.target_kind == "stream" and pl.streams.get(trig.target) and flow.is_border(trig.target):
            for t in sorted(access_of([f"trigger {trig.name}"]).reads | access_of([f"trigger {trig.name}"]).writes):
                if pl.tables[t] == SINGLE:
                    raise InvalidArgument(
                        f"deploy: trigger {trig.name!r} fires on partitioned stream {trig.target!r} on the "
                        f"partition of each batch's keys, but table {t!r} lives on one partition; declare it "
                        "REPLICATED or PARTITION BY a column"
                    )
    for s in streams:
        pl.push_mode[s] = _mode(flow, pl, [(s, pl.streams[s])], pl.streams[s] is not None)
        consumers = flow.consumers.get(s, [])
        if len(consumers) == 1 and pl.procedures[consumers[0]] == EVENT_KEYED and not flow.triggers_on("stream", s):
            if all(not flow.consumers.get(out) for out in flow.emitted_by(consumers[0])):
                pl.push_mode[s] = EVENT_KEYED
                pl.stream_keys[s] = pl.event_keys[consumers[0]]
    pl.flows = {
        s: any(procedures[p].each_row for p in flow.consumers[s])
        for s in streams
        if pl.push_mode[s] == COORDINATED and _flows(flow, pl, s)
    }
    for proc in procedures.values():
        if proc.on_stream is not None:
            continue
        keyed = pl.procedures[proc.name] == PARTITIONED
        if pl.procedures[proc.name] == EVERYWHERE:
            pl.call_mode[proc.name] = COORDINATED
            continue
        key = pl.keys.get(proc.name)
        outs = [(t, key) for t in sorted(flow.emitted_by(proc.name))]
        pl.call_mode[proc.name] = _mode(flow, pl, outs, keyed)
    return pl


def owner_filter(key_type: str) -> str:
    """The SQL function a partition registers: true for keys it owns (see Engine)."""
    return "streamtx_mine_" + key_type.lower().replace(" ", "_")


def owned_insert(sql: str, tables: Mapping[str, TableDef], schemas: Schemas) -> str | None:
    """`INSERT INTO t ... <rows>` of a partitioned t as `INSERT INTO t ... SELECT * FROM (<rows>) WHERE mine(key)`.

    An everywhere TE runs such an INSERT on every partition; each must keep
    only the rows whose key it owns, or every partition would hold them all.
    """
    try:
        tree = sqltree.parse(sql)
    except ParseError:
        return None
    if not isinstance(tree, exp.Insert) or tree.expression is None:
        return None
    target = tree.this
    listed = None
    if isinstance(target, exp.Schema):
        listed = [c.name for c in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table) or target.db or target.name not in tables:
        return None
    table = tables[target.name]
    if not table.partition_by:
        return None
    names = listed or schemas.table_columns[table.name]
    if table.partition_by not in names:
        return None
    aliases = [exp.to_identifier(f"c{i}") for i in range(len(names))]
    key = f"__rows.c{names.index(table.partition_by)}"
    rows = exp.Subquery(this=tree.expression, alias=exp.TableAlias(this=exp.to_identifier("__rows"), columns=aliases))
    mine = f"{owner_filter(schemas.table_key_types[table.name])}({key})"
    tree.set("expression", exp.select("*").from_(rows).where(mine))
    return tree.sql(dialect="duckdb")


def _check_spanning_reads(proc: str, unit: str, accesses: list[Access], tables: dict[str, str]) -> None:
    """A statement that runs on every partition may not read a single table: only home holds its rows.

    Elsewhere it would read an empty table and decide differently (e.g. pick
    another row to delete). A value decided once must reach the partitions as
    data: emitted on the stream the procedure consumes, or kept REPLICATED.
    """
    for i, a in enumerate(accesses, start=1):
        single = sorted(t for t in a.reads if tables[t] == SINGLE)
        if _spans(a, tables) and single:
            where = f"procedure {proc!r}" if unit == proc else f"{unit!r} (fired by procedure {proc!r})"
            touched = sorted(t for t in a.reads | a.writes if tables[t] != SINGLE)
            raise InvalidArgument(
                f"deploy: statement {i} of {where} runs on every partition (it touches {', '.join(touched)}), "
                f"but reads table {single[0]!r}, which only the home partition holds, so other partitions "
                f"would read it empty; compute what it decides upstream and pass it on the input stream, or "
                f"declare {single[0]!r} REPLICATED"
            )


def _spans(a: Access, tables: dict[str, str]) -> bool:
    return any(tables[t] == PARTITIONED for t in a.reads | a.writes) or any(tables[t] == REPLICATED for t in a.writes)


def _flows(flow: Dataflow, pl: Placement, stream: str) -> bool:
    """Whether `stream`'s batches fit a flow: entry TEs on the owner of the batch's keys, in no
    transaction group, and everything they trigger first on the home partition."""
    entry = flow.consumers.get(stream, [])
    if pl.streams.get(stream) is None or not entry:
        return False
    if any(pl.procedures[p] != PARTITIONED or flow.group_of(p) is not None for p in entry):
        return False
    return all(
        pl.procedures[q] == SINGLE for p in entry for out in flow.emitted_by(p) for q in flow.consumers.get(out, [])
    )


def _mode(flow: Dataflow, pl: Placement, start: list[tuple[str, str | None]], keyed: bool) -> str:
    """HOME, KEYED or COORDINATED for a command whose first outputs are `start` (stream, key it carries)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        stream, key = todo.pop()
        for q in flow.consumers.get(stream, []):
            kind = pl.procedures[q]
            if kind == EVERYWHERE:
                return COORDINATED
            if keyed:
                if kind != PARTITIONED or pl.streams.get(stream) is None or pl.streams[stream] != key:
                    return COORDINATED
            elif kind != SINGLE:
                return COORDINATED
            if q in seen:
                continue
            seen.add(q)
            for t in sorted(flow.emitted_by(q)):
                todo.append((t, pl.keys.get(q)))
    return KEYED if keyed else HOME
