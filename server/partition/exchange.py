"""A state TE whose batch's keys span partitions, as one of them runs it: replicated execution.

The front (server/front/exchange.py) drives two rounds in the command order,
while the gate keeps every other command away from the partitions:

1. `read_owned`: pre-process the batch's events and return the current rows
   of the keys they name (operations and their `reads` dependencies) that
   live here. Nothing changes; DuckDB is current at every command boundary.
2. the fragment, carrying the rows of every involved partition merged
   (`Exchange`): each involved partition runs the state transactions over
   that same complete working set (`run_replicated`), so each computes the
   same result, procedures being deterministic; each writes back only the
   rows it holds, and only the emitting partition (home, always involved)
   runs post_process, so every output tuple appears once. Then two-phase
   commit (`decide`).

The merged rows are part of the fragment's input: the command log keeps them
with it (journal FRAGMENTS), so the fragment replays alone after a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamtx.errors import InvalidArgument
from streamtx.server.catalog.compile import quote
from streamtx.server.catalog.placement import REPLICATED, SINGLE
from streamtx.server.partition import ownership
from streamtx.server.statetx import Event, StateProcedure, WorkingSet, apply_event

if TYPE_CHECKING:
    from streamtx.server.partition.engine import Engine
    from streamtx.server.partition.transaction import Transaction


@dataclass(frozen=True)
class Exchange:
    """What round 2 gives one partition: the merged rows per table, who takes part, whether it emits."""

    rows: dict[str, pa.Table]
    involved: frozenset[int]
    emit: bool

    def wire(self) -> tuple[dict[str, Any], list[pa.Table]]:
        names = sorted(self.rows)
        return {"tables": names, "involved": sorted(self.involved), "emit": self.emit}, [self.rows[n] for n in names]

    @classmethod
    def from_wire(cls, header: dict[str, Any] | None, tables: list[pa.Table]) -> Exchange | None:
        if header is None:
            return None
        rows = dict(zip(header["tables"], tables, strict=True))
        return cls(rows, frozenset(header["involved"]), bool(header["emit"]))


def read_owned(engine: Engine, procedure: str, ts: int, batch: pa.Table) -> tuple[dict[str, Any], list[pa.Table]]:
    """Round 1: the rows held here of the keys the batch's events name, one relation per table."""
    proc = engine.catalog.procedures.get(procedure)
    fn = engine.loader.resolve(proc.python) if proc is not None and proc.python else None
    if not isinstance(fn, StateProcedure):
        raise InvalidArgument(f"state_read: {procedure!r} is not a state procedure")
    events = [Event(row, ts) for row in batch.to_pylist()]
    try:
        for ev in events:
            fn.pre_process(ev)
    except Exception:  # round 2 fails the same way, inside the transaction, and rejects the batch
        return {"tables": []}, []
    keys, _ = ownership.declared(events)
    names: list[str] = []
    out: list[pa.Table] = []
    for table in sorted(keys):
        where = ownership.placement_of(engine, table)
        if where not in (SINGLE, ownership.BY_KEY):
            continue
        wanted = list(dict.fromkeys(keys[table]))
        found = ownership.owners(engine, table, wanted, where).tolist()
        mine = [k for k, p in zip(wanted, found, strict=True) if p == engine.partition]
        if mine:
            names.append(table)
            out.append(_rows(engine, table, mine))
    return {"tables": names}, out


def run_replicated(tx: Transaction, proc: StateProcedure, ex: Exchange) -> None:
    """Round 2: the batch's state transactions over the merged rows; writes back only the rows held here."""
    eng = tx.engine
    assert tx.batch is not None
    events = [Event(row, tx.batch_id) for row in tx.batch.to_pylist()]
    for ev in events:
        proc.pre_process(ev)
    keys, writes = ownership.declared(events)
    ws = WorkingSet()
    for table in sorted(keys):
        pk = eng.state.key_of(table)
        if ownership.placement_of(eng, table) == REPLICATED:
            if table in writes:
                raise ownership.refuse_replicated_write(tx.procedure, table)
            merged = _rows(eng, table, list(dict.fromkeys(keys[table])))
        else:
            ownership.covered(eng, tx.procedure, table, keys[table], ex.involved)
            merged = ex.rows.get(table)
        rows: dict[Any, dict[str, Any] | None] = dict.fromkeys(keys[table])
        if merged is not None:
            rows.update((r[pk], r) for r in merged.to_pylist())
        ws.load(table, rows)
    for ev in events:
        apply_event(ev, ws)
    _keep_owned(eng, ws)
    if ex.emit:
        out: dict[str, list[dict[str, Any]]] = {}
        for ev in events:
            proc.post_process(ev)
            for stream, row in ev.out:
                out.setdefault(stream, []).append(row)
        eng.counters["events"] += len(events)
        eng.counters["events_rejected"] += sum(ev.rejected for ev in events)
        for stream, rows_out in out.items():
            tx.emit(stream, rows_out)
    if eng.executor == "serial":
        eng.state.write_back()
        eng.state.ws.clear()


def _keep_owned(eng: Engine, ws: WorkingSet) -> None:
    """The written rows held here join the partition's working set, to be written back at the commit."""
    for table, dirty in ws.dirty.items():
        if not dirty:
            continue
        keys = list(dirty)
        found = ownership.owners(eng, table, keys, ownership.placement_of(eng, table) or SINGLE).tolist()
        mine = {k: ws.rows[table][k] for k, p in zip(keys, found, strict=True) if p == eng.partition}
        if mine:
            eng.state.ws.load(table, mine)
            eng.state.ws.dirty.setdefault(table, set()).update(mine)


def _rows(engine: Engine, table: str, keys: list[Any]) -> pa.Table:
    pk = engine.state.key_of(table)
    cols = ", ".join(quote(c) for c in engine.state.columns[table])
    return engine.con.execute(
        f"SELECT {cols} FROM {quote(table)} WHERE {quote(pk)} IN (SELECT unnest($keys))", {"keys": keys}
    ).to_arrow_table()
