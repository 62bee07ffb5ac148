"""Which partition holds the row a state operation names, and the check that a TE's partition holds them.

A state operation names a row by its table's primary key. Where that row
lives follows from the table's placement: a table partitioned by its primary
key has it on the partition owning the key's bin; a single table on the home
partition; a replicated table everywhere (readable anywhere, written
nowhere: a state TE runs on one partition or a few, and would leave the
other copies behind). A table partitioned by another column cannot be placed
by the key alone: a local TE is trusted to address rows of its partition
(the voter writes `votes` by vote id on the phone's partition), a TE that
spans partitions is refused.

A state TE that reads a row its partition does not hold would silently see a
missing row, so `check_local` refuses it loudly instead: the event names a
key its procedure's placement (stream PARTITION BY, or PARTITION ON columns)
did not cover.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from streamtx.errors import FailedPrecondition
from streamtx.procedure import Event
from streamtx.server.catalog.placement import PARTITIONED, REPLICATED, SINGLE
from streamtx.server.partition.ports import Parts

if TYPE_CHECKING:
    from streamtx.server.partition.state import StateStore


class Host(Parts, Protocol):
    state: StateStore

    @property
    def replicated_tables(self) -> frozenset[str]: ...

    @property
    def known_local(self) -> Known: ...


BY_KEY = "by-key"  # partitioned by its primary key
BY_OTHER = "by-other-column"  # partitioned by another column


def placement_of(engine: Host, table: str) -> str | None:
    """REPLICATED, SINGLE, BY_KEY or BY_OTHER; None for a table the catalog does not know."""
    kind = engine.catalog.placement.tables.get(table)
    if kind != PARTITIONED:
        return kind
    key = engine.state.keys.get(table)
    return BY_KEY if key is not None and key == engine.catalog.readable[table].partition_by else BY_OTHER


def owners(engine: Host, table: str, keys: list[Any], where: str) -> np.ndarray:
    """The partition holding each key's row of a SINGLE or BY_KEY table."""
    if where == SINGLE or engine.map.partitions == 1:
        return np.zeros(len(keys), dtype=np.int32)
    return engine.map.owners_of(keys)


def declared(events: Iterable[Event]) -> tuple[dict[str, list[Any]], set[str]]:
    """The keys the events' operations name per table (dependencies included), and the tables they write."""
    keys: dict[str, list[Any]] = {}
    writes: set[str] = set()
    for ev in events:
        for op in ev.ops:
            keys.setdefault(op.table, []).append(op.key)
            if op.kind != "read":
                writes.add(op.table)
            for table, key in op.reads:
                keys.setdefault(table, []).append(key)
    return keys, writes


def refuse_replicated_write(procedure: str | None, table: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"procedure {procedure}: an event writes replicated table {table!r}; a state procedure's TE runs on "
        "one partition or a few, so it may read replicated tables but not write them"
    )


def check_local(engine: Host, procedure: str | None, events: list[Event]) -> None:
    """Every row the events name is this partition's: else the TE fails, naming the first stray key."""
    if engine.map.partitions == 1:  # every row is here; only a replicated write is refused
        replicated = engine.replicated_tables
        if replicated:
            for ev in events:
                for op in ev.ops:
                    if op.kind != "read" and op.table in replicated:
                        raise refuse_replicated_write(procedure, op.table)
        return
    known = engine.known_local
    if _known_local(engine, events, known):
        return
    keys, writes = declared(events)
    me = engine.partition
    for table in sorted(keys):
        where = known.places[table] = placement_of(engine, table)
        if where == REPLICATED and table in writes:
            raise refuse_replicated_write(procedure, table)
        if where not in (SINGLE, BY_KEY) or (where == SINGLE and me == 0):
            continue
        found = owners(engine, table, keys[table], where)
        stray = np.flatnonzero(found != me)
        if len(stray):
            i = int(stray[0])
            raise _stray(engine, procedure, table, keys[table][i], int(found[i]), frozenset([me]))
    if len(known.keys) > KNOWN_MAX:
        known.keys.clear()
    for table, ks in keys.items():
        if known.places[table] == BY_KEY:
            for k in ks:
                try:
                    known.keys.add((table, type(k), k))
                except TypeError:  # an unhashable key is checked every time
                    pass


class Known:
    """What `check_local` learnt while the catalog and the partition map stay: each table's placement, and the
    keys of tables partitioned by key that it found on this partition, as (table, key type, key).

    Hashing a key to its bin costs more than a state event's own work, and
    the same keys (a voter's phones, its contestants) come back again and
    again: a TE whose rows were all found here before is not hashed again.
    """

    __slots__ = ("places", "keys")

    def __init__(self) -> None:
        self.places: dict[str, str | None] = {}
        self.keys: set[tuple[str, type, Any]] = set()


KNOWN_MAX = 100_000  # keys remembered at most (then forgotten at once)


def _known_local(engine: Host, events: list[Event], known: Known) -> bool:
    """Whether no event writes a replicated table and every key that must be checked was found here before."""
    try:
        for ev in events:
            for op in ev.ops:
                if not _known(engine, known, op.table, op.key, op.kind != "read"):
                    return False
                for table, key in op.reads:
                    if not _known(engine, known, table, key, False):
                        return False
    except TypeError:  # an unhashable key
        return False
    return True


def _known(engine: Host, known: Known, table: str, key: Any, writes: bool) -> bool:
    places = known.places
    if table not in places:
        places[table] = placement_of(engine, table)
    where = places[table]
    if where == REPLICATED:
        return not writes
    if where == BY_KEY or (where == SINGLE and engine.partition != 0):
        return (table, type(key), key) in known.keys
    return True


def _placed_by(engine: Host, procedure: str | None) -> str:
    proc = engine.catalog.procedures.get(procedure or "")
    if proc is not None and proc.key_columns:
        return f"the partition of every key in its PARTITION ON columns {', '.join(proc.key_columns)}"
    if proc is not None and proc.on_stream and engine.catalog.streams[proc.on_stream].partition_by:
        return (
            f"the partition of its stream's PARTITION BY column {engine.catalog.streams[proc.on_stream].partition_by}"
        )
    return "a procedure without PARTITION ON runs on partition 0"


def _hint(engine: Host, procedure: str | None) -> str:
    proc = engine.catalog.procedures.get(procedure or "")
    if proc is not None and proc.key_columns:
        return "list every event column holding a key the procedure accesses in PARTITION ON (...)"
    return "declare the event columns holding the keys it accesses: CREATE PROCEDURE ... PARTITION ON (columns)"


def _stray(
    engine: Host, procedure: str | None, table: str, key: Any, owner: int, involved: frozenset[int]
) -> FailedPrecondition:
    where = (
        f"runs on partition {next(iter(involved))}"
        if len(involved) == 1
        else f"involves partitions {', '.join(map(str, sorted(involved)))}"
    )
    return FailedPrecondition(
        f"procedure {procedure}: an event names {table}[{key!r}], which lives on partition {owner}, "
        f"but its batch {where} ({_placed_by(engine, procedure)}); {_hint(engine, procedure)}"
    )


class Unspannable(FailedPrecondition):
    """A batch a span cannot run as it would run alone: the span is undone and its batches run one by one."""


def covered(engine: Host, procedure: str | None, table: str, keys: list[Any], involved: frozenset[int]) -> None:
    """Every row a TE over merged rows names lives on one of the partitions its batch involves.

    A batch local to one partition trusts it with the rows of a table
    partitioned by another column (`check_local`); merged rows cannot hold
    those, so such a batch cannot run in a span (`Unspannable`).
    """
    where = placement_of(engine, table)
    if where == BY_OTHER and len(involved) == 1:
        raise Unspannable(f"procedure {procedure}: table {table!r} is partitioned by another column than its key")
    if where == BY_OTHER:
        raise FailedPrecondition(
            f"procedure {procedure}: table {table!r} is partitioned by {engine.catalog.readable[table].partition_by!r},"
            f" not by its primary key, so the rows a state transaction spanning partitions names by key cannot be "
            f"placed; PARTITION BY ({engine.state.keys.get(table)}) instead"
        )
    if where not in (SINGLE, BY_KEY):
        return
    found = owners(engine, table, keys, where)
    stray = [i for i, p in enumerate(found.tolist()) if p not in involved]
    if stray:
        i = stray[0]
        raise _stray(engine, procedure, table, keys[i], int(found[i]), involved)
