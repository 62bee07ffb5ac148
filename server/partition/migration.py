"""A partition's part of moving bins to other partitions (front/rebalance.py runs the steps).

A step of a migration is a coordinated command at one timestamp `ts`: every
command before it ran under the old partition map, every command after it
runs under the new one. On each partition it is one DuckDB transaction,
left open between the front's rounds like a coordinated TE's:

1. `Migrate`: the rows of partitioned tables whose bin the new map gives to
   another partition are deleted here and returned, grouped by their new
   partition;
2. `MigrateIn`: the rows other partitions gave up for this one are inserted;
3. `Decide`: commit (the new map installed) or roll back.

The working set's rows of the tables that move are written back before the
step's SQL touches them, and stay held: the rows that leave are removed
from it and those that arrive join it, inside the transaction (a rollback
restores it), so a table held whole stays whole and its keys need no point
query after the step. What else the working set holds back (other tables'
rows, exactly-once marks, stored stream tuples) stays held back across the
step, as across an opchain interval (`StateStore.barrier_tables`).

What moves is the rows of tables `PARTITION BY` a column, and with them the
views over those tables (recomputed on both sides). Stored stream tuples
stay where they were taken: they are history, and reads gather every
partition. Exactly-once marks stay too: the front answers re-sent batch
ids whichever partition their rows route to now, and each partition's marks
keep increasing. Windows kept by a procedure that runs on several
partitions hold the tuples each partition took, which no bin describes:
a catalog with one is refused (`unmovable`).

A step may also change the partition count. One that adds partitions gives
them, from home, a copy of every replicated table (`copies_for_added`). One
that retires partitions (owning no bin by then) moves what they kept besides
rows to home: marks, taken batch ids, rejections and retained stream tuples
(`left_behind`); home merges the marks (the highest per producer's stream).

The log record of a committed step (MIGRATE) holds the new map and the rows
that arrived; replay deletes the leaving rows again (the same rows: replay
reaches the same state) and inserts the arrived ones. It is replayed only if
the step finished everywhere (DONE on the home partition), like fragments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from streamtx.errors import FailedPrecondition, Internal
from streamtx.server import protocol as pr
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.compile import STREAM_SCHEMA, SYSTEM_SCHEMA, quote
from streamtx.server.catalog.placement import PARTITIONED, REPLICATED, SINGLE
from streamtx.server.partition.binned import SIGNED, BinnedKeys
from streamtx.server.partitioning import HOME, PartitionMap

if TYPE_CHECKING:
    from streamtx.server.partition.engine import Engine
    from streamtx.server.partition.journal import Journal

DEDUP_TABLES = ("producers", "taken", "rejections")
"""The system tables of a partition's exactly-once state (engine.py `SYSTEM_DDL`)."""


def unmovable(catalog: Catalog) -> str | None:
    """Why bins of this catalog cannot move; None if they can."""
    for procedure, kind in sorted(catalog.placement.procedures.items()):
        if kind == SINGLE:
            continue
        for window in catalog.owned_windows(procedure):
            return (
                f"window {window!r} is kept by procedure {procedure!r}, which runs on several partitions: "
                "each partition's window holds the tuples it took, which moving bins would not split"
            )
    return None


def moving_tables(catalog: Catalog) -> list[tuple[str, str]]:
    """(table, partition column) of every table whose rows live by bin."""
    placed = catalog.placement.tables
    return [
        (t, d.partition_by)
        for t, d in sorted(catalog.tables.items())
        if placed.get(t) == PARTITIONED and d.partition_by is not None
    ]


class Migration:
    """The open step on this partition, between `leave` and `decide`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.open: pr.Migrate | None = None
        self._arrived: tuple[list[str], list[pa.Table]] = ([], [])

    def leave(self, c: pr.Migrate) -> tuple[pr.Leaving, list[pa.Table]]:
        """Round 1: opens the step's transaction and takes out the rows the new map sends elsewhere."""
        eng = self.engine
        if self.open is not None:
            raise Internal(f"partition {eng.partition}: migration at {c.ts} while the one at {self.open.ts} is open")
        eng.begin()
        self.open = c
        self._arrived = ([], [])
        try:
            parts, tables = take_leaving(eng, PartitionMap.from_json(c.map))
        except BaseException:
            self.rollback()
            raise
        return pr.Leaving(parts), tables

    def arrive(self, c: pr.MigrateIn, tables: list[pa.Table]) -> tuple[None, list[pa.Table]]:
        """Round 2: the rows other partitions gave up for this one."""
        if self.open is None or self.open.ts != c.ts:
            raise Internal(f"partition {self.engine.partition}: rows of migration {c.ts} arrived with none open")
        insert_arrived(self.engine, c.tables, tables)
        self._arrived = (self._arrived[0] + list(c.tables), self._arrived[1] + tables)
        return None, []

    def decide(self, c: pr.Decide, journal: Journal | None) -> None:
        """Round 3: commit (then the new map is this partition's) or roll back."""
        step, self.open = self.open, None
        assert step is not None and step.ts == c.ts
        eng = self.engine
        if not c.commit:
            eng.rollback()
            return
        eng.commit(hold_back=True)
        after_arrival(eng, self._arrived[0])
        eng.marks.ran(step.ts)
        install_map(eng, step.map)
        if journal is not None:
            journal.migrate(step.ts, step.map, *self._arrived)
        eng.counters["migrations"] += 1
        eng.counters["rows_migrated_in"] += sum(t.num_rows for t in self._arrived[1])

    def rollback(self) -> None:
        if self.open is not None:
            self.open = None
            self.engine.rollback()


def take_leaving(eng: Engine, new: PartitionMap) -> tuple[list[tuple[int, str]], list[pa.Table]]:
    """Deletes (in the open transaction) the rows of partitioned tables `new` places elsewhere; returns
    them as (partition, table) and one relation each, in a deterministic order.

    The bin is computed from the key, not stored: the table's keys are read
    and hashed in one vectorized pass (a DuckDB function would be called per
    2,048 rows, ten times slower), and kept with their bins for the next
    steps where they can be (`BinnedKeys`); one `DELETE ... RETURNING` then
    takes out the leaving rows by key, or by row id for other tables.
    """
    reason = unmovable(eng.catalog)
    if reason is not None:
        raise FailedPrecondition(f"rebalance: {reason}")
    if eng.partition >= new.partitions:
        return left_behind(eng)
    parts, out = copies_for_added(eng, new)
    if not gives_bins(eng.map, new, eng.partition):
        return parts, out  # a partition holds rows of its own bins only: none leaves, no table need be read
    moving = moving_tables(eng.catalog)
    eng.state.barrier_tables(frozenset(t for t, _ in moving))  # SQL changes them: rows go
    con = eng.con
    for table, column in moving:
        taken = _leaving_keys(eng, table, column, new)
        if taken is None:
            keys = con.sql(f"SELECT rowid, {quote(column)} FROM {quote(table)}").to_arrow_table()
            leaving = new.owners(keys.column(1)) != eng.partition
            taken, by = keys.column(0).filter(pa.array(leaving)), "rowid"
        else:
            by = quote(column)
        if not len(taken):
            continue
        con.register("__streamtx_leaving", pa.table({"id": taken}))
        try:
            rows = con.sql(
                f"DELETE FROM {quote(table)} WHERE {by} IN (SELECT id FROM __streamtx_leaving) RETURNING *"
            ).to_arrow_table()
        finally:
            con.unregister("__streamtx_leaving")
        rows = rows.select(_stored_columns(eng, table))
        eng.state.moved_out(table, rows)
        dest = new.owners(rows.column(column))
        for p in sorted(set(dest.tolist())):
            parts.append((p, table))
            out.append(rows.filter(pa.array(dest == p)))
    if parts:
        eng.state.refresh_views(frozenset(t for _, t in parts))
    return parts, out


def copies_for_added(eng: Engine, new: PartitionMap) -> tuple[list[tuple[int, str]], list[pa.Table]]:
    """On the home partition, when `new` adds partitions: every replicated table's rows, for each of them
    (a replicated table has a full copy on every partition, the added ones from their first command)."""
    first = eng.map.partitions
    if eng.partition != HOME or new.partitions <= first:
        return [], []
    replicated = sorted(t for t, kind in eng.catalog.placement.tables.items() if kind == REPLICATED)
    eng.state.barrier_tables(frozenset(replicated))  # read by SQL: the held-back rows are written first
    parts: list[tuple[int, str]] = []
    out: list[pa.Table] = []
    for table in replicated:
        rows = eng.con.sql(f"SELECT {', '.join(map(quote, _stored_columns(eng, table)))} FROM {quote(table)}")
        copy = rows.to_arrow_table()
        for p in range(first, new.partitions):
            parts.append((p, table))
            out.append(copy)
    return parts, out


def left_behind(eng: Engine) -> tuple[list[tuple[int, str]], list[pa.Table]]:
    """On a partition the new map retires (it owns no bin any more): what else it holds, for the home
    partition. Its exactly-once marks, taken batch ids and rejections (a batch it took stays a re-send
    once it is gone) and its retained streams' tuples (subscribers read them from home then)."""
    eng.state.barrier(frozenset(), keep_index=True)  # the marks and tuples held back are written first
    streams = sorted(eng.catalog.retained)
    names = [*(f"{SYSTEM_SCHEMA}.{t}" for t in DEDUP_TABLES), *(f"{STREAM_SCHEMA}.{s}" for s in streams)]
    out = [eng.con.sql(f"SELECT * FROM {_relation(name)}").to_arrow_table() for name in names]
    return [(HOME, name) for name in names], out


def _relation(name: str) -> str:
    """The SQL name of a moving relation: a user table's, or a system or stream table's (`left_behind`)."""
    schema, dot, table = name.partition(".")
    return f"{schema}.{quote(table)}" if dot and schema in (SYSTEM_SCHEMA, STREAM_SCHEMA) else quote(name)


def _leaving_keys(eng: Engine, table: str, column: str, new: PartitionMap) -> pa.Array | None:
    """The keys of `table` (as many as it holds, maybe more) whose bins `new` gives away, from the keys kept
    since the last step (`BinnedKeys`) or read now and kept; None if the table's keys cannot be kept so."""
    state = eng.state
    if state.key_columns.get(table) != (column,) or dict(state.int_columns.get(table, ())).get(column) not in SIGNED:
        return None
    binned = state.index.binned.get(table)
    if binned is not None and binned.nbins == new.bins:
        taken = binned.take(eng.map, new, eng.partition)
        if taken is not None:
            return taken
    binned = state.index.binned[table] = BinnedKeys.read(eng.con, table, column, new.bins)
    eng.counters["migration_key_reads"] += 1
    return binned.take(eng.map, new, eng.partition)


def gives_bins(old: PartitionMap, new: PartitionMap, partition: int) -> bool:
    """Whether `new` takes a bin `old` gives `partition` (True when the maps are not comparable)."""
    if old.bins != new.bins:
        return True
    return any(o == partition != n for o, n in zip(old.owner, new.owner, strict=True))


def insert_arrived(eng: Engine, names: list[str] | tuple[str, ...], tables: list[pa.Table]) -> None:
    """Inserts (in the open transaction) rows that moved here, table by table."""
    con = eng.con
    if _retired_state(names):
        eng.state.barrier(frozenset(), keep_index=True)  # marks held back are written before the merge
    else:
        eng.state.barrier_tables(frozenset(names))
    for table, rows in zip(names, tables, strict=True):
        if rows.num_rows == 0:
            continue
        columns = ", ".join(quote(c) for c in rows.column_names)
        con.register("__streamtx_arrived", rows)
        try:
            for sql in _inserts(table, columns):
                con.execute(sql)
        finally:
            con.unregister("__streamtx_arrived")
        eng.state.moved_in(table, rows)
    if names:
        eng.state.refresh_views(frozenset(names))


def _inserts(table: str, columns: str) -> list[str]:
    """The statements adding arrived rows (`__streamtx_arrived`) to `table`: plain inserts, but a retired
    partition's marks merge (a producer's mark is the highest batch id either took) and its rejections
    skip those home recorded too."""
    if table == f"{SYSTEM_SCHEMA}.producers":
        same = "p.producer_id = a.producer_id AND p.stream = a.stream"
        return [
            f"DELETE FROM {table} p USING __streamtx_arrived a WHERE {same} AND p.last_batch_id < a.last_batch_id",
            f"INSERT INTO {table} SELECT {columns} FROM __streamtx_arrived a "
            f"WHERE NOT EXISTS (SELECT 1 FROM {table} p WHERE {same})",
        ]
    verb = "INSERT OR IGNORE" if table == f"{SYSTEM_SCHEMA}.rejections" else "INSERT"
    return [f"{verb} INTO {_relation(table)} ({columns}) SELECT {columns} FROM __streamtx_arrived"]


def handed_marks(names: list[str], tables: list[pa.Table]) -> dict[tuple[str, str], int]:
    """The exactly-once marks a retired partition handed over in a step (none in other steps).

    Recovery counts every batch id up to them as taken, like a checkpoint's
    marks: the step ran after every batch before it was durable, and the
    retired partition's log, which named them, is gone.
    """
    found: dict[tuple[str, str], int] = {}
    for name, rows in zip(names, tables, strict=True):
        if name == f"{SYSTEM_SCHEMA}.producers":
            for producer, stream, batch_id in zip(
                *(rows.column(c).to_pylist() for c in ("producer_id", "stream", "last_batch_id")), strict=True
            ):
                found[(producer, stream)] = max(found.get((producer, stream), 0), batch_id)
    return found


def _retired_state(names: list[str] | tuple[str, ...]) -> bool:
    return any(name.startswith(f"{SYSTEM_SCHEMA}.") for name in names)


def after_arrival(eng: Engine, names: list[str] | tuple[str, ...]) -> None:
    """Once a step that brought a retired partition's state committed: its marks and retained tuples
    are this partition's too."""
    if _retired_state(names):
        eng.load_marks()
        eng.load_retained()


def install_map(eng: Engine, partition_map: str) -> None:
    """The new map becomes this partition's (what was derived from the old one, the owners known per
    key, is keyed by the map and goes with it)."""
    eng.map = PartitionMap.from_json(partition_map)


def replay(eng: Engine, ts: int, head: dict, tables: list[pa.Table]) -> None:
    """A committed step, from its log record (its step finished everywhere)."""
    eng.begin()
    try:
        take_leaving(eng, PartitionMap.from_json(head["map"]))
        insert_arrived(eng, head["tables"], tables)
    except BaseException:
        eng.rollback()
        raise
    eng.commit()
    after_arrival(eng, head["tables"])
    eng.marks.ran(ts)
    install_map(eng, head["map"])


def _stored_columns(eng: Engine, table: str) -> list[str]:
    """The table's columns that hold values (generated ones are computed again where the rows go)."""
    return [
        name
        for (name,) in eng.con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' AND table_name = ? "
            "AND NOT is_generated ORDER BY column_index",
            [table],
        ).fetchall()
    ]
