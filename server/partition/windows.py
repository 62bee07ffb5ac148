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
would be per-tuple SQL on the hot path (see DESIGN.md).

- `ROWS n SLIDE m`: a slide every m tuples; the last n tuples are visible.
- `RANGE t SLIDE s` (column `ts`): window ends advance in steps of s once a
  tuple with ts >= end + s arrived; visible are tuples with end - t <= ts < end.

Position of every tuple: `__seq`, a per-window counter in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from streamtx.server.catalog.compile import SYSTEM_SCHEMA, WINDOW_SCHEMA, batch_relation, quote

if TYPE_CHECKING:
    from streamtx.server.partition.engine import Engine
    from streamtx.server.partition.transaction import Transaction

STATE_DDL = (
    f"CREATE TABLE IF NOT EXISTS {SYSTEM_SCHEMA}.window_ends (window_name VARCHAR PRIMARY KEY, range_end BIGINT)"
)


@dataclass
class WindowState:
    next_seq: int = 0  # seq of the next tuple to arrive
    visible_end: int = 0  # ROWS: tuples with seq < visible_end are visible (or expired)
    range_end: int | None = None  # RANGE: current end (exclusive); None before the first tuple


class Windows:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.state: dict[str, WindowState] = {}
        engine.con.execute(STATE_DDL)

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

    def snapshot(self) -> dict[str, WindowState]:
        """The in-memory positions, to restore if the transaction that moves them aborts."""
        return {name: WindowState(st.next_seq, st.visible_end, st.range_end) for name, st in self.state.items()}

    def restore(self, saved: dict[str, WindowState]) -> None:
        self.state = saved

    def feed(self, tx: Transaction, window: str, stream: str, batch: pa.Table) -> None:
        """Appends `batch` (registered as the TE's input) to `window` and applies its slides."""
        if batch.num_rows == 0:
            return
        w = self.engine.catalog.windows[window]
        st = self.state.setdefault(window, WindowState())
        table = f"{WINDOW_SCHEMA}.{quote(window)}"
        cols = ", ".join(quote(c) for c in self.engine.catalog.stream_schemas[stream].names)
        source = quote(batch_relation(stream))
        if w.kind == "range":  # a tuple without a time has no place in a time window
            batch = batch.filter(pc.is_valid(batch.column("ts")))
            source = f"(SELECT * FROM {source} WHERE ts IS NOT NULL)"
            if batch.num_rows == 0:
                return
        tx.execute(
            f"INSERT INTO {table} ({cols}, batch_id, __seq, __staged) SELECT {cols}, $b, "
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
        tx: Transaction,
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
        tx: Transaction,
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

    def _save_end(self, tx: Transaction, name: str, end: int) -> None:
        tx.execute(f"INSERT OR REPLACE INTO {SYSTEM_SCHEMA}.window_ends VALUES ($n, $e)", {"n": name, "e": end})

    def _fire(self, tx: Transaction, triggers: list[str]) -> None:
        for name in triggers:
            for _, compiled in tx.statements_of(f"trigger {name}"):
                tx.run_compiled(compiled)
