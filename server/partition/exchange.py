"""State TEs whose batches' keys span partitions, as one of the partitions runs them: replicated execution.

The front drives the rounds in the command order, while the gate keeps every
other command away from the partitions involved:

1. `read_owned`: pre-process the batches' events and return the current rows
   of the keys they name (operations and their `reads` dependencies) that
   live here. Nothing changes; DuckDB is current at every command boundary.
2. the rows of every involved partition, merged (`Exchange`), go to each of
   them with the batches: each runs the state transactions over that same
   complete working set (`run_replicated`), so each computes the same result,
   procedures being deterministic; each writes back only the rows it holds,
   and only the emitting partition (home, always involved) runs post_process,
   so every output tuple appears once. Then two-phase commit (`decide`).

The exchange serves one batch (a coordinated command's fragment, the `serial`
executor) or a whole punctuation interval of batches (a span, front/spans.py):
then the batches run in timestamp order over one working set, so each sees
its predecessors' writes, and one round of reads serves them all.

The merged rows are part of the command's input: the command log keeps them
with it (journal FRAGMENTS / SPAN), so it replays alone after a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from streamtx.errors import InvalidArgument
from streamtx.procedure import Event, Key, Row, StateProcedure
from streamtx.server.catalog.compile import quote
from streamtx.server.catalog.placement import REPLICATED, SINGLE
from streamtx.server.partition import ownership
from streamtx.server.partition.opchain import WorkingSet, apply_event
from streamtx.server.partition.state import table_rows
from streamtx.server.protocol import StateRows

if TYPE_CHECKING:
    from streamtx.server.tuples import Batch


class Host(ownership.Host, Protocol):
    executor: str

    def python_code(self, ref: str) -> Callable[..., Any]: ...


class Te(Protocol):
    """The TE that runs a batch over the exchange's rows (partition/transaction.py)."""

    engine: Host
    procedure: str | None
    ts: int
    input: Batch | None

    def batch_rows(self) -> list[Row]: ...
    def emit_state_rows(self, stream: str, rows: list[Row]) -> None: ...


@dataclass
class Exchange:
    """What the second round gives one partition: the merged rows per table, who takes part, whether it emits.

    `involved` is that of the batch running now (a span sets it per batch);
    `ws` is the working set the batches of the command share, built from
    `rows` as they name keys. A fragment's TE writes back its rows itself; a
    span's are written back once, after its last batch.
    """

    rows: dict[str, pa.Table]
    involved: frozenset[int]
    emit: bool
    span: bool = False
    ws: WorkingSet = field(default_factory=WorkingSet, compare=False, repr=False)
    _index: dict[str, dict[Key, Row]] = field(default_factory=dict, compare=False, repr=False)

    def wire(self) -> tuple[dict[str, Any], list[pa.Table]]:
        names = sorted(self.rows)
        return {"tables": names, "involved": sorted(self.involved), "emit": self.emit}, [self.rows[n] for n in names]

    @classmethod
    def from_wire(cls, header: dict[str, Any] | None, tables: list[pa.Table]) -> Exchange | None:
        if header is None:
            return None
        rows = dict(zip(header["tables"], tables, strict=True))
        return cls(rows, frozenset(header["involved"]), bool(header["emit"]))

    def merged(self, table: str, pk: str) -> dict[Key, Row]:
        """The merged rows of `table` by primary key (built once per command)."""
        index = self._index.get(table)
        if index is None:
            found = self.rows.get(table)
            index = self._index[table] = {r[pk]: r for r in table_rows(found)} if found is not None else {}
        return index


def state_procedure(engine: Host, procedure: str) -> StateProcedure:
    proc = engine.catalog.procedures.get(procedure)
    fn = engine.python_code(proc.python) if proc is not None and proc.python else None
    if not isinstance(fn, StateProcedure):
        raise InvalidArgument(f"state_read: {procedure!r} is not a state procedure")
    return fn


def read_owned(engine: Host, items: list[tuple[str, int, list[Row]]]) -> tuple[StateRows, list[pa.Table]]:
    """Round 1: the rows held here of the keys named by the events of each (procedure, ts, batch rows).

    A batch whose pre_process fails names nothing: the second round fails it
    the same way, inside the transaction, and rejects it.
    """
    events: list[Event] = []
    for procedure, ts, rows in items:
        fn = state_procedure(engine, procedure)
        mine = [Event(row, ts) for row in rows]
        try:
            for ev in mine:
                fn.pre_process(ev)
        except Exception:
            continue
        events += mine
    keys, _ = ownership.declared(events)
    names: list[str] = []
    out: list[pa.Table] = []
    for table in sorted(keys):
        where = ownership.placement_of(engine, table)
        if where not in (SINGLE, ownership.BY_KEY):
            continue
        wanted = list(dict.fromkeys(keys[table]))
        found = ownership.owners(engine, table, wanted, where).tolist()
        mine_keys = [k for k, p in zip(wanted, found, strict=True) if p == engine.partition]
        if mine_keys:
            names.append(table)
            out.append(_rows(engine, table, mine_keys))
    return StateRows(names), out


def run_replicated(tx: Te, proc: StateProcedure, ex: Exchange) -> None:
    """Round 2, one batch: its state transactions over the exchange's working set.

    The rows it names join the working set from the merged rows the first
    time the command names them, so a later batch of a span sees this one's
    writes. What fails before the events apply (pre_process, a stray key)
    fails alike on every partition. What fails after (post_process, emit)
    fails on the emitting partition alone: the partitions then disagree on
    the batch, and the front undoes the whole command (a span runs its
    batches one by one instead), so nothing here needs undoing.
    """
    eng = tx.engine
    assert tx.input is not None
    events = [Event(row, tx.ts) for row in tx.batch_rows()]
    for ev in events:
        proc.pre_process(ev)
    keys, writes = ownership.declared(events)
    ws = ex.ws
    for table in sorted(keys):
        have = ws.rows.get(table)
        missing = list(dict.fromkeys(k for k in keys[table] if have is None or k not in have))
        if ownership.placement_of(eng, table) == REPLICATED:
            if table in writes:
                raise ownership.refuse_replicated_write(tx.procedure, table)
            if missing:
                pk = eng.state.key_of(table)
                found = {r[pk]: r for r in table_rows(_rows(eng, table, missing))}
                ws.load(table, {k: found.get(k) for k in missing})
            continue
        ownership.covered(eng, tx.procedure, table, keys[table], ex.involved)
        if missing:
            merged = ex.merged(table, eng.state.key_of(table))
            ws.load(table, {k: merged.get(k) for k in missing})
    for ev in events:
        apply_event(ev, ws)
    if ex.emit:
        out: dict[str, list[dict[str, Any]]] = {}
        for ev in events:
            proc.post_process(ev)
            for stream, row in ev.out:
                out.setdefault(stream, []).append(row)
        for stream, rows_out in out.items():
            tx.emit_state_rows(stream, rows_out)
        eng.counters["events"] += len(events)
        eng.counters["events_rejected"] += sum(ev.rejected for ev in events)
    _written(tx, ex)


def _written(tx: Te, ex: Exchange) -> None:
    """A fragment's TE ends with its rows written back: a constraint they break aborts it (the front undoes it all)."""
    if ex.span:
        return
    eng = tx.engine
    keep_owned(eng, ex.ws)
    eng.state.write_back_in(tx.procedure)
    if eng.executor == "serial":
        eng.state.ws.clear()


def keep_owned(eng: Host, ws: WorkingSet) -> None:
    """The written rows held here join the partition's working set, to be written back at the commit."""
    for table, dirty in ws.dirty.items():
        if not dirty:
            continue
        keys = list(dirty)
        found = ownership.owners(eng, table, keys, ownership.placement_of(eng, table) or SINGLE).tolist()
        rows = ws.rows[table]
        for k, p in zip(keys, found, strict=True):
            if p == eng.partition:
                eng.state.put(table, k, rows[k])


def _rows(engine: Host, table: str, keys: list[Any]) -> pa.Table:
    pk = engine.state.key_of(table)
    cols = ", ".join(quote(c) for c in engine.state.columns[table])
    return engine.con.execute(
        f"SELECT {cols} FROM {quote(table)} WHERE {quote(pk)} IN (SELECT unnest($keys))", {"keys": keys}
    ).to_arrow_table()
