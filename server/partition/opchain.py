"""TStream's operation chains: a punctuation interval's state transactions, applied over a working set.

A state procedure's events (streamtx/procedure.py) declare operations on
keyed rows. The executor loads every row they name into a `WorkingSet`
(partition/state.py: one query per table), then `apply_event` applies each
event's operations, events in timestamp order, over those rows in memory:
the operations on one key form its operation chain, evaluated in order, and
an operation's `reads` are its dependencies on other chains. `serial` uses
the same evaluation over one TE's events at a time. Nothing here touches
DuckDB; write-back and write-behind are partition/state.py's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamtx.errors import Aborted
from streamtx.procedure import Event, Key, Row

Undo = tuple[dict[Key, Row | None], Key, Row | None, set[Key] | None]
"""How to take one write back: the table's rows, the key, its row before, and the dirty set it joined (if it did)."""
LOG_MAX = 4096
"""Keys a watched table's log holds before it starts again (`WorkingSet.logs`), at a commit."""
UNHELD: Any = object()
"""The row before a write of a key the working set did not hold (not even as missing): rollback drops the key."""


class WorkingSet:
    """The rows an interval touches, per table, with the keys written since the last write-back.

    `epoch` changes whenever rows are forgotten (`clear`, `forget`, `rollback`), so
    events whose keys were loaded in the same epoch need no second look.
    `stamp(tables)` changes whenever the rows of `tables` may have changed (a
    write, a rollback, SQL about to write them): what was computed from them
    under an equal stamp still holds (an incremental window aggregate).
    `logs` name the keys written to the tables someone `watch`es (a
    leaderboard kept up to date, partition/ranked.py): (the table's version
    when its log started, every key written since, repeats included).
    `absent` holds keys known missing from the table itself, which a
    write-back may plainly insert.

    Inside a transaction (`begin` .. `commit` / `rollback`) every write is
    undoable: `write` and `apply_event` log how to take it back, and `clear`
    and a write-back replace the containers rather than empty them, so the
    ones `begin` saw survive. `rollback` therefore returns exactly to the
    state at `begin`, dirty keys included: rows not yet written to DuckDB
    (written back later, partition/state.py) are never lost by an abort.
    Loading rows is not a write: loaded rows are what DuckDB holds.
    """

    def __init__(self) -> None:
        self.rows: dict[str, dict[Key, Row | None]] = {}
        self.dirty: dict[str, set[Key]] = {}
        self.absent: dict[str, set[Key]] = {}
        self.complete: set[str] = set()  # tables held whole: a key they lack is not in the table
        self.epoch = 0
        self.versions: dict[str, int] = {}  # writes per table, for `stamp`
        self.generation = 0  # changes when any table's rows may have changed outside `write`
        self.logs: dict[str, tuple[int, list[Key]]] = {}
        self.undo: list[Undo] | None = None  # the open transaction's writes, oldest first
        self._begun: tuple[dict[str, dict[Key, Row | None]], dict[str, set[Key]], set[str]] | None = None

    def load(self, table: str, rows: dict[Key, Row | None]) -> None:
        self.rows.setdefault(table, {}).update(rows)

    def get(self, table: str, key: Key) -> Row | None:
        return self.rows[table][key]

    def write(self, table: str, key: Key, row: Row | None) -> None:
        """Sets a row, to be written back; undoable inside a transaction."""
        have = self.rows.setdefault(table, {})
        written = self.dirty.get(table)
        if written is None:
            written = self.dirty[table] = set()
        if self.undo is not None:
            self.undo.append((have, key, have.get(key, UNHELD), None if key in written else written))
        have[key] = row
        written.add(key)
        versions = self.versions
        versions[table] = versions.get(table, 0) + 1
        log = self.logs.get(table)
        if log is not None:
            log[1].append(key)

    def watch(self, table: str) -> None:
        """From now on, `logs` name the keys written to `table`."""
        if table not in self.logs:
            self.logs[table] = (self.versions.get(table, 0), [])

    def _unlog(self, tables: Iterable[str]) -> None:
        """The rows of `tables` changed without `write` (their versions counted it): their logs start again."""
        for t in tables:
            if t in self.logs:
                self.logs[t] = (self.versions[t], [])

    def stamp(self, tables: tuple[str, ...]) -> tuple[int, ...]:
        """Equal for two reads of `tables` only if nothing could have changed their rows in between."""
        versions = self.versions
        return (self.generation, *[versions.get(t, 0) for t in tables])

    def clear(self) -> None:
        self.rows = {}
        self.dirty = {}
        self.absent = {}
        self.complete = set()
        self.epoch += 1
        self.generation += 1

    def drop(self, tables: frozenset[str]) -> None:
        """Forgets the rows of `tables` (written back already), inside a transaction too: SQL is about to
        change them. The containers are replaced, not emptied, so a rollback returns to those `begin` saw."""
        self.rows = {t: rows for t, rows in self.rows.items() if t not in tables}
        self.absent = {t: keys for t, keys in self.absent.items() if t not in tables}
        self.complete = self.complete - tables
        self._changed(*tables)

    def remove(self, table: str, keys: Iterable[Key]) -> None:
        """Rows SQL deleted (none dirty: a migration step's leaving rows) are no longer held; undoable."""
        have = self.rows.get(table)
        if have is not None:
            undo = self.undo
            for k in keys:
                if k in have:
                    if undo is not None:
                        undo.append((have, k, have[k], None))
                    del have[k]
        self._changed(table)

    def add(self, table: str, rows: dict[Key, Row | None], hold: bool = True) -> None:
        """Rows SQL inserted (a migration step's arriving rows, as DuckDB holds them) are held, or with
        `hold` False forgotten (their keys load again, no longer known missing); undoable."""
        absent = self.absent.get(table)
        if absent:
            absent.difference_update(rows)
        have = self.rows.setdefault(table, {}) if hold else self.rows.get(table)
        if have is not None:
            undo = self.undo
            for k, row in rows.items():
                if undo is not None:
                    undo.append((have, k, have.get(k, UNHELD), None))
                if hold:
                    have[k] = row
                else:
                    have.pop(k, None)
        self._changed(table)

    def _changed(self, *tables: str) -> None:
        """The rows of `tables` changed without `write`: what was loaded or computed from them is looked at again."""
        self.epoch += 1
        for t in tables:
            self.versions[t] = self.versions.get(t, 0) + 1
        self._unlog(tables)

    def forget(self, table: str) -> None:
        """Drops one table's rows, written back already (none dirty); not inside a transaction."""
        assert not self.dirty.get(table) and self.undo is None
        self.rows.pop(table, None)
        self.absent.pop(table, None)
        self.complete.discard(table)
        self._changed(table)  # reloaded, its rows come in another order

    def written_back(self, tables: set[str] | None = None) -> None:
        """The dirty keys of `tables` (all: None) are in DuckDB now."""
        self.dirty = {t: keys for t, keys in self.dirty.items() if tables is not None and t not in tables}

    def begin(self) -> None:
        self.undo = []
        self._begun = (self.rows, self.dirty, set(self.complete))

    def commit(self) -> None:
        self.undo = None
        self._begun = None
        for table, (_, keys) in self.logs.items():
            if len(keys) > LOG_MAX:  # readers this far behind read the whole table again
                self.logs[table] = (self.versions[table], [])

    def rollback(self) -> None:
        """Back to the state at `begin`: rows and dirty keys. Known-missing keys are forgotten (DuckDB rolled back)."""
        if self.undo is None or self._begun is None:
            return
        _take_back(self.undo)
        self.rows, self.dirty, self.complete = self._begun
        self.absent = {}
        self.epoch += 1
        self.generation += 1
        self.commit()


def apply_event(event: Event, ws: WorkingSet) -> None:
    """Applies one event's operations to the working set, all or nothing.

    Operations see the state left by every earlier event and by this event's
    earlier operations. A failed `cond` undoes this event's writes and marks
    it rejected; an exception from `fn` or `cond` does the same, with its text.
    """
    if event.rejected:
        return
    rows = ws.rows
    dirty = ws.dirty
    versions = ws.versions
    logs = ws.logs
    undo: list[Undo] = []
    values: list[Row | None] = []
    try:
        for op in event.ops:
            table = op.table
            key = op.key
            have = rows[table]
            current = have[key]
            deps = [rows[t][k] for t, k in op.reads] if op.reads else ()
            if op.cond is not None and not op.cond(current, *deps):
                raise Aborted(f"condition failed on {table}[{key!r}]")
            kind = op.kind
            if kind == "read":
                values.append(current)
                continue
            new = dict(op.row) if kind == "write" else op.fn(current, *deps)
            written = dirty.get(table)
            if written is None:
                written = dirty[table] = set()
            undo.append((have, key, current, None if key in written else written))
            have[key] = new
            written.add(key)
            versions[table] = versions.get(table, 0) + 1
            log = logs.get(table)
            if log is not None:
                log[1].append(key)
            values.append(new)
    except Exception as e:
        _take_back(undo)
        event.rejected = True
        event.reason = e.message if isinstance(e, Aborted) else f"{type(e).__name__}: {e}"
        event.values = []
        return
    event.values = values
    if ws.undo is not None:
        ws.undo += undo


def _take_back(undo: list[Undo]) -> None:
    """Undoes writes, newest first: each row as it was (gone, if it was not held) and the dirty marks added."""
    for have, key, old, joined in reversed(undo):
        if old is UNHELD:
            have.pop(key, None)
        else:
            have[key] = old
        if joined is not None:
            joined.discard(key)
