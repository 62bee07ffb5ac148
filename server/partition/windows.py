"""Windows: staging, slides, expiry, and the EE triggers that fire on a slide.

A window `w ON s` is fed with every batch of `s` its owning procedure takes,
inside that procedure's TE, before the procedure's statements run. New tuples
are staged (`__staged`, invisible through the view `w`) until a slide's worth
has arrived; then the oldest staged tuples become visible, tuples beyond the
window's extent expire (deleted), and the window's EE triggers run.

Slides are applied set-based, once per TE: when a batch completes several
slides (a batch of k tuples under SLIDE 1 completes k), the window moves by
all of them in one step and its EE triggers run once, over the window after
the last slide. The intermediate windows are never materialized: doing so
would be per-tuple SQL on the hot path (0.3-3 ms per statement in DuckDB).

- `ROWS n SLIDE m`: a slide every m tuples; the last n tuples are visible.
- `RANGE t SLIDE s` (column `ts`): window ends advance in steps of s once a
  tuple with ts >= end + s arrived; visible are tuples with end - t <= ts < end.

Position of every tuple: `__seq`, a per-window counter in arrival order.

With the SQL compiler on, a ROWS window lives in memory: its tuples are
held by position, a slide moves two numbers, and compiled statements (its
EE triggers, its owner's reads) read the visible tuples straight from
memory. DuckDB's window table follows with the working set: it is brought
up to date (one INSERT, UPDATE and DELETE per window) whenever the working
set is written back, so a statement run in DuckDB, a query or a checkpoint
sees the same window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from streamtx.procedure import Row
from streamtx.server.catalog.compile import SYSTEM_SCHEMA, TS_COLUMN, WINDOW_SCHEMA, Compiled, batch_relation, quote
from streamtx.server.partition.ports import Parts
from streamtx.server.tuples import Batch, arrow

if TYPE_CHECKING:
    import duckdb

    from streamtx.server.partition.sqlplans import SqlPlans


class Host(Parts, Protocol):
    sql_plans: SqlPlans


class Firing(Protocol):
    """The TE a window's tuples arrive in: its EE triggers run inside it."""

    ts: int

    def rows_of(self, batch: Batch) -> list[Row]: ...
    def register_input(self) -> None: ...
    def execute(self, sql: str, params: dict[str, Any]) -> duckdb.DuckDBPyConnection: ...
    def statements_of(self, unit: str) -> list[tuple[int, Compiled]]: ...
    def run_compiled(
        self, compiled: Compiled, plan: tuple[str, int] | None = None, rows: Batch | None = None
    ) -> None: ...


STATE_DDL = (
    f"CREATE TABLE IF NOT EXISTS {SYSTEM_SCHEMA}.window_ends (window_name VARCHAR PRIMARY KEY, range_end BIGINT)"
)


@dataclass
class WindowState:
    next_seq: int = 0  # seq of the next tuple to arrive
    visible_end: int = 0  # ROWS: tuples with seq < visible_end are visible (or expired)
    range_end: int | None = None  # RANGE: current end (exclusive); None before the first tuple


Groups = dict[tuple[Any, ...], list[int]]
"""Per group key, integer accumulators that add up (counts, sums); the last one counts the group's rows."""


@dataclass
class WindowGroups:
    """A grouped aggregate over a window, kept up to date by the tuples that enter and leave it.

    Holds while `stamp` (server/partition/opchain.py `WorkingSet.stamp`) is
    unchanged: the tables the aggregate joins are as they were when `groups`
    was last brought up to date, so a leaving tuple's part, computed again,
    is the part it added.
    """

    groups: Groups
    rows: deque[dict[str, Any]]  # the tuples counted, oldest first: positions lo .. hi - 1
    lo: int
    hi: int
    stamp: tuple[int, ...]


class Windows:
    def __init__(self, engine: Host) -> None:
        self.engine = engine
        self.state: dict[str, WindowState] = {}
        # in-memory ROWS windows: tuples by position (from the lowest still visible), and what DuckDB holds
        self.rows: dict[str, dict[int, dict[str, Any]]] = {}
        self.synced: dict[str, tuple[int, int]] = {}  # (next_seq, visible_end) as DuckDB's window table has them
        self._synced_at_begin: dict[str, tuple[int, int]] | None = None
        self._schemas: dict[str, pa.Schema] = {}
        self.aggregates: dict[tuple[str, str], WindowGroups] = {}
        engine.con.execute(STATE_DDL)

    def in_memory(self, window: str) -> bool:
        """Whether compiled statements read `window` from memory (a ROWS window, with the compiler on)."""
        w = self.engine.catalog.windows.get(window)
        return w is not None and w.kind == "rows" and self.engine.sql_plans.enabled

    def load(self) -> None:
        """Rebuilds window positions from the window tables (after install or recovery)."""
        con = self.engine.con
        ends = dict(con.execute(f"SELECT window_name, range_end FROM {SYSTEM_SCHEMA}.window_ends").fetchall())
        self.state = {}
        for name in self.engine.catalog.windows:
            table = f"{WINDOW_SCHEMA}.{quote(name)}"
            max_seq, min_staged = con.execute(
                f"SELECT max(__seq), min(__seq) FILTER (WHERE __staged) FROM {table}"
            ).fetchone()
            next_seq = 0 if max_seq is None else max_seq + 1
            visible_end = next_seq if min_staged is None else min_staged
            self.state[name] = WindowState(next_seq, visible_end, ends.get(name))
        self.rows, self.synced, self._schemas, self.aggregates = {}, {}, {}, {}
        for name in self.engine.catalog.windows:
            if not self.in_memory(name):
                continue
            table = f"{WINDOW_SCHEMA}.{quote(name)}"
            data = con.execute(f"SELECT * EXCLUDE (__staged) FROM {table} ORDER BY __seq").to_arrow_table()
            seqs = data.column("__seq").to_pylist()
            held = data.drop_columns(["__seq"])
            self.rows[name] = dict(zip(seqs, held.to_pylist(), strict=True))
            st = self.state[name]
            self.synced[name] = (st.next_seq, st.visible_end)

    def snapshot(self) -> dict[str, WindowState]:
        """The in-memory positions, to restore if the transaction that moves them aborts."""
        return {name: WindowState(st.next_seq, st.visible_end, st.range_end) for name, st in self.state.items()}

    def restore(self, saved: dict[str, WindowState]) -> None:
        self.state = saved
        self.aggregates = {}
        for name, held in self.rows.items():
            st = saved.get(name)
            end = st.next_seq if st is not None else 0
            for s in [s for s in held if s >= end]:
                del held[s]

    def feed(self, tx: Firing, window: str, stream: str, batch: Batch) -> None:
        """Appends `batch` (registered as the TE's input) to `window` and applies its slides."""
        if batch.num_rows == 0:
            return
        w = self.engine.catalog.windows[window]
        st = self.state.setdefault(window, WindowState())
        if self.in_memory(window):
            held = self.rows.setdefault(window, {})
            seq = st.next_seq
            for row in tx.rows_of(batch):
                held[seq] = {**row, TS_COLUMN: tx.ts}
                seq += 1
            st.next_seq = seq
            slides = (st.next_seq - st.visible_end) // w.slide
            if slides:
                st.visible_end += slides * w.slide
                self._fire(tx, self.engine.catalog.triggers_on("window", window))
            return
        tx.register_input()
        batch = arrow(batch)
        table = f"{WINDOW_SCHEMA}.{quote(window)}"
        cols = ", ".join(quote(c) for c in self.engine.catalog.stream_schemas[stream].names)
        source = quote(batch_relation(stream))
        if w.kind == "range":  # a tuple without a time has no place in a time window
            batch = batch.filter(pc.is_valid(batch.column("ts")))
            source = f"(SELECT * FROM {source} WHERE ts IS NOT NULL)"
            if batch.num_rows == 0:
                return
        tx.execute(
            f"INSERT INTO {table} ({cols}, {TS_COLUMN}, __seq, __staged) SELECT {cols}, $b, "
            f"$seq0 + row_number() OVER () - 1, true FROM {source}",
            {"b": tx.ts, "seq0": st.next_seq},
        )
        st.next_seq += batch.num_rows
        triggers = self.engine.catalog.triggers_on("window", window)
        if w.kind == "rows":
            self._slide_rows(tx, table, w.size, w.slide, st, triggers)
        else:
            self._slide_range(tx, window, table, w.size, w.slide, st, triggers, batch)

    def _slide_rows(
        self,
        tx: Firing,
        table: str,
        size: int,
        slide: int,
        st: WindowState,
        triggers: list[str],
    ) -> None:
        slides = (st.next_seq - st.visible_end) // slide
        if slides == 0:
            return
        hi = st.visible_end + slides * slide
        tx.execute(f"UPDATE {table} SET __staged = false WHERE __staged AND __seq < $hi", {"hi": hi})
        tx.execute(f"DELETE FROM {table} WHERE __seq < $lo", {"lo": hi - size})
        st.visible_end = hi
        self._fire(tx, triggers)

    def _slide_range(
        self,
        tx: Firing,
        name: str,
        table: str,
        size: int,
        slide: int,
        st: WindowState,
        triggers: list[str],
        batch: pa.Table,
    ) -> None:
        ts = batch.column("ts")
        lo, hi = pc.min(ts).as_py(), pc.max(ts).as_py()
        if lo is None:
            return
        if st.range_end is None:
            st.range_end = (lo // slide) * slide
        end = st.range_end
        slides = 0 if hi < end + slide else (hi - end) // slide
        if slides == 0:
            self._save_end(tx, name, end)
            return
        end += slides * slide
        tx.execute(f"UPDATE {table} SET __staged = false WHERE __staged AND ts < $end", {"end": end})
        tx.execute(f"DELETE FROM {table} WHERE ts < $lo", {"lo": end - size})
        self._fire(tx, triggers)
        st.range_end = end
        self._save_end(tx, name, end)

    def _save_end(self, tx: Firing, name: str, end: int) -> None:
        tx.execute(f"INSERT OR REPLACE INTO {SYSTEM_SCHEMA}.window_ends VALUES ($n, $e)", {"n": name, "e": end})

    # ---------------------------------------------------------- in memory
    def visible(self, window: str) -> list[dict[str, Any]]:
        """The tuples of an in-memory window a statement sees now, oldest first."""
        st = self.state[window]
        held = self.rows[window]
        size = self.engine.catalog.windows[window].size
        return [held[s] for s in range(max(st.visible_end - size, 0), st.visible_end)]

    def groups(
        self, window: str, key: str, stamp: tuple[int, ...], part: Callable[[list[dict[str, Any]]], Groups]
    ) -> Groups:
        """`part` over the visible tuples of `window`, computed from the tuples that entered and left since the last
        call with the same `key` and `stamp` (a slide of k tuples costs k, not the window's size). Read only."""
        st = self.state[window]
        held = self.rows[window]
        lo, hi = max(st.visible_end - self.engine.catalog.windows[window].size, 0), st.visible_end
        c = self.aggregates.get((window, key))
        if c is None or c.stamp != stamp or not c.lo <= lo <= c.hi <= hi or (lo - c.lo) + (hi - c.hi) >= hi - lo:
            rows = [held[s] for s in range(lo, hi)]
            c = self.aggregates[(window, key)] = WindowGroups(part(rows), deque(rows), lo, hi, stamp)
            self.engine.counters["window_groups_built"] += 1
            return c.groups
        entered = [held[s] for s in range(c.hi, hi)]
        left = [c.rows.popleft() for _ in range(lo - c.lo)] if lo > c.lo else []
        try:
            plus, minus = part(entered), part(left)
        except BaseException:
            del self.aggregates[(window, key)]
            raise
        groups = c.groups
        for k, acc in plus.items():
            have = groups.get(k)
            if have is None:
                groups[k] = acc
            else:
                for i, v in enumerate(acc):
                    have[i] += v
        for k, acc in minus.items():
            have = groups[k]
            for i, v in enumerate(acc):
                have[i] -= v
            if not have[-1]:
                del groups[k]
        c.rows.extend(entered)
        c.lo, c.hi = lo, hi
        self.engine.counters["window_groups_kept"] += 1
        return groups

    def dirty(self) -> bool:
        """Whether DuckDB's window tables lag behind the in-memory windows."""
        return any(
            self.synced.get(name) != (st.next_seq, st.visible_end)
            for name, st in self.state.items()
            if name in self.rows
        )

    def sync(self) -> None:
        """Brings DuckDB's window tables up to the in-memory windows, inside the open transaction."""
        con = self.engine.con
        for name, held in self.rows.items():
            st = self.state[name]
            done_next, done_visible = self.synced.get(name, (st.next_seq, st.visible_end))
            if (done_next, done_visible) == (st.next_seq, st.visible_end):
                continue
            size = self.engine.catalog.windows[name].size
            table = f"{WINDOW_SCHEMA}.{quote(name)}"
            if st.visible_end > done_visible:
                con.execute(f"UPDATE {table} SET __staged = false WHERE __staged AND __seq < $v", {"v": st.visible_end})
                con.execute(f"DELETE FROM {table} WHERE __seq < $lo", {"lo": st.visible_end - size})
            first = max(done_next, st.visible_end - size)
            if first < st.next_seq:
                seqs = list(range(first, st.next_seq))
                data = pa.Table.from_pylist([held[s] for s in seqs], schema=self._schema(name))
                data = data.append_column("__seq", pa.array(seqs, pa.int64()))
                data = data.append_column("__staged", pa.array([s >= st.visible_end for s in seqs], pa.bool_()))
                con.register("__window__", data)
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM __window__")
                con.unregister("__window__")
            self.synced[name] = (st.next_seq, st.visible_end)

    def _schema(self, window: str) -> pa.Schema:
        schema = self._schemas.get(window)
        if schema is None:
            table = f"{WINDOW_SCHEMA}.{quote(window)}"
            query = f"SELECT * EXCLUDE (__seq, __staged) FROM {table} LIMIT 0"
            schema = self._schemas[window] = self.engine.con.execute(query).to_arrow_table().schema
        return schema

    def begin(self) -> None:
        self._synced_at_begin = dict(self.synced)

    def rolled_back(self) -> None:
        """DuckDB's window tables are back where the transaction began."""
        if self._synced_at_begin is not None:
            self.synced = self._synced_at_begin
        self._synced_at_begin = None

    def committed(self) -> None:
        """Tuples below every window's extent are not needed any more."""
        self._synced_at_begin = None
        for name, held in self.rows.items():
            st = self.state[name]
            lo = st.visible_end - self.engine.catalog.windows[name].size
            for s in [s for s in held if s < lo]:
                del held[s]

    def _fire(self, tx: Firing, triggers: list[str]) -> None:
        for name in triggers:
            unit = f"trigger {name}"
            for i, compiled in tx.statements_of(unit):
                tx.run_compiled(compiled, (unit, i))
