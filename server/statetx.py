"""State transactions: TStream's three steps for Python procedures.

A state procedure handles each event (each tuple of its input batch) in three
steps, as in the TStream papers:

1. `pre_process(event)` — plain Python over the event's values; it *declares*
   the event's state accesses: `event.read(table, key)`,
   `event.write(table, key, row, cond=None, reads=())`,
   `event.read_modify(table, key, fn, cond=None, reads=())`.
2. state access — done by the executor, not by the procedure: the keys every
   event declared are loaded with one query per table, the operations are
   applied in timestamp order over that in-memory working set, and the dirty
   rows are written back with one statement per table. A `cond` that returns
   False aborts that event's state transaction only: none of its operations
   take effect, and later events see the state without it.
3. `post_process(event)` — sees what the event read (`event.value(ref)`), and
   whether it was rejected; it may `event.emit(stream, row)`.

Keys are primary-key values of DuckDB tables (one-column primary keys); a row
is a dict of the table's columns. `fn(current_row, *dependency_rows)` returns
the new row; `cond(current_row, *dependency_rows)` returns whether the
operation may apply. `reads` names other (table, key) pairs whose rows, as of
this event, are passed to `fn` and `cond` (TStream's cross-chain dependencies).
A missing key reads as None; writing it inserts the row.

Bind a state procedure in a deploy script like any Python procedure:

    CREATE PROCEDURE transfer ON STREAM transfers AS PYTHON 'tstream.sl:transfer';

where `transfer = Transfer()` is an instance of a `StateProcedure` subclass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamtx.errors import Aborted

Row = dict[str, Any]
Key = Any


@dataclass(frozen=True)
class Ref:
    """A handle on one operation of an event, to fetch its value in post_process."""

    index: int


_CACHED_REFS = 64
_REFS = tuple(Ref(i) for i in range(_CACHED_REFS))  # immutable, so events share them: one per declaration would cost


class Op:
    """One declared state access; slotted and positional, since every event declares several."""

    __slots__ = ("kind", "table", "key", "row", "fn", "cond", "reads")

    def __init__(
        self,
        kind: str,  # read | write | read_modify
        table: str,
        key: Key,
        row: Row | None = None,
        fn: Callable[..., Row] | None = None,
        cond: Callable[..., bool] | None = None,
        reads: tuple[tuple[str, Key], ...] = (),
    ) -> None:
        self.kind = kind
        self.table = table
        self.key = key
        self.row = row
        self.fn = fn
        self.cond = cond
        self.reads = reads


class Event:
    """One event (one tuple of the input batch) and its state transaction."""

    __slots__ = ("row", "batch_id", "ops", "values", "rejected", "reason", "out")

    def __init__(self, row: Row, batch_id: int) -> None:
        self.row = row
        self.batch_id = batch_id
        self.ops: list[Op] = []
        self.values: list[Row | None] = []
        self.rejected = False
        self.reason = ""
        self.out: list[tuple[str, Row]] = []

    def __getitem__(self, column: str) -> Any:
        return self.row[column]

    # -- pre_process: declare operations -------------------------------------------
    def read(self, table: str, key: Key) -> Ref:
        ops = self.ops
        index = len(ops)
        ops.append(Op("read", table, key))
        return _REFS[index] if index < _CACHED_REFS else Ref(index)

    def write(
        self,
        table: str,
        key: Key,
        row: Row,
        cond: Callable[..., bool] | None = None,
        reads: Iterable[tuple[str, Key]] = (),
    ) -> Ref:
        ops = self.ops
        index = len(ops)
        ops.append(Op("write", table, key, row, None, cond, tuple(reads)))
        return _REFS[index] if index < _CACHED_REFS else Ref(index)

    def read_modify(
        self,
        table: str,
        key: Key,
        fn: Callable[..., Row],
        cond: Callable[..., bool] | None = None,
        reads: Iterable[tuple[str, Key]] = (),
    ) -> Ref:
        ops = self.ops
        index = len(ops)
        ops.append(Op("read_modify", table, key, None, fn, cond, tuple(reads)))
        return _REFS[index] if index < _CACHED_REFS else Ref(index)

    def reject(self, reason: str) -> None:
        """Rejects the event in pre_process (before any state access): it declares nothing."""
        self.rejected = True
        self.reason = reason
        self.ops.clear()

    # -- post_process: results and output --------------------------------------------
    def value(self, ref: Ref) -> Row | None:
        """The row an operation saw (read) or left (write, read_modify); None if rejected or missing."""
        if self.rejected:
            return None
        return self.values[ref.index]

    def emit(self, stream: str, row: Row) -> None:
        self.out.append((stream, row))


class StateProcedure:
    """Base class of a state procedure; subclass it and bind an instance.

    `emits` lists the streams post_process may emit on. Each event is one
    state transaction; a batch's events are taken in the batch's row order.
    """

    emits: tuple[str, ...] = ()
    streamtx_procedure = True  # found by the procedure loader like a @procedure function

    def pre_process(self, event: Event) -> None:
        raise NotImplementedError

    def post_process(self, event: Event) -> None:
        """Default: nothing to emit."""


Undo = tuple[dict[Key, Row | None], Key, Row | None, set[Key] | None]
"""How to take one write back: the table's rows, the key, its row before, and the dirty set it joined (if it did)."""
UNHELD: Any = object()
"""The row before a write of a key the working set did not hold (not even as missing): rollback drops the key."""


class WorkingSet:
    """The rows an interval touches, per table, with the keys written since the last write-back.

    `epoch` changes whenever rows are forgotten (`clear`, `forget`, `rollback`), so
    events whose keys were loaded in the same epoch need no second look.
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
        self.epoch = 0
        self.undo: list[Undo] | None = None  # the open transaction's writes, oldest first
        self._begun: tuple[dict[str, dict[Key, Row | None]], dict[str, set[Key]]] | None = None

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

    def clear(self) -> None:
        self.rows = {}
        self.dirty = {}
        self.absent = {}
        self.epoch += 1

    def forget(self, table: str) -> None:
        """Drops one table's rows, written back already (none dirty); not inside a transaction."""
        assert not self.dirty.get(table) and self.undo is None
        self.rows.pop(table, None)
        self.absent.pop(table, None)
        self.epoch += 1

    def written_back(self, tables: set[str] | None = None) -> None:
        """The dirty keys of `tables` (all: None) are in DuckDB now."""
        self.dirty = {t: keys for t, keys in self.dirty.items() if tables is not None and t not in tables}

    def begin(self) -> None:
        self.undo = []
        self._begun = (self.rows, self.dirty)

    def commit(self) -> None:
        self.undo = None
        self._begun = None

    def rollback(self) -> None:
        """Back to the state at `begin`: rows and dirty keys. Known-missing keys are forgotten (DuckDB rolled back)."""
        if self.undo is None or self._begun is None:
            return
        _take_back(self.undo)
        self.rows, self.dirty = self._begun
        self.absent = {}
        self.epoch += 1
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
