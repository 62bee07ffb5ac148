"""What a procedure author imports: `@procedure` and `Tx`, `StateProcedure` and `Event`.

Two kinds of Python procedures live in modules under the server's procedures
path (`--procedures-path`); a deploy script binds one by name, it never
carries code:

    CREATE PROCEDURE enrich ON STREAM counted AS PYTHON 'examples.procs:enrich';

- A function marked `@procedure` receives a `Tx` and works set-based on its
  whole atomic batch, in SQL (`tx.sql`) or Python (`tx.batch`).
- An instance of a `StateProcedure` subclass handles each tuple of its batch
  as one event in TStream's three steps: `pre_process` declares the event's
  keyed state accesses, the executor performs them, `post_process` sees what
  they read and emits. Under `--executor opchain` the accesses of a whole
  punctuation interval of batches share one load and one write-back per table.

Every batch (and every OLTP call) runs at one global timestamp `ts`, which the
server's sequencer gives each command in the order it takes them: it grows
across all producers and streams, it is the `timestamp` of the push's
acknowledgement, `$ts` in a procedure's SQL (`$batch_id` is its older name),
and the `__ts` column of the tuples its TEs emit on a stream no procedure
consumes. It is not the producer's batch id, which names a batch only among
that producer's batches on that stream.

Declaring accesses (nothing runs until the executor applies the event):

>>> ev = Event({"id": 7, "amount": 5}, ts=3)
>>> ref = ev.read_modify("accounts", ev["id"], lambda row: {**row, "balance": row["balance"] - 5})
>>> ev.ts, ev.batch_id, ref, [(op.kind, op.table, op.key) for op in ev.ops]
(3, 3, Ref(index=0), [('read_modify', 'accounts', 7)])

This module imports neither the server nor DuckDB; `streamtx.testing` runs
procedures in-process, under both executors, for unit tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Event", "Key", "Ref", "Row", "StateProcedure", "Tx", "procedure"]

Row = dict[str, Any]
"""A table row or a stream tuple: column name -> value (Python values as DuckDB returns them)."""
Key = Any
"""A value of a table's one-column primary key (an int for BIGINT, a str for VARCHAR, ...)."""


# ------------------------------------------------------------------ @procedure


def procedure(fn: Callable[..., Any] | None = None, *, emits: Iterable[str] = ()) -> Any:
    """Marks a function as a Python procedure, which only marked functions may be bound as.

    `emits` lists the streams the function may `tx.emit` on; an emit on any
    other aborts its TE with INVALID_ARGUMENT. The function receives a `Tx`
    first; an OLTP procedure (no ON STREAM) also receives the call's
    parameters as keyword arguments, as the client sent them once each was
    found to convert to the type the deploy script declares. What it returns
    is the call's result: a pyarrow Table or a dict of column lists (one
    result table), a list of them (one each), or None. Usable bare
    (`@procedure`) or with arguments (`@procedure(emits=["out"])`).
    """

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        f.streamtx_procedure = True  # type: ignore[attr-defined]
        f.emits = tuple(emits)  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


class Tx(Protocol):
    """A `@procedure` function's handle on its transaction execution (TE).

    A TE is atomic and isolated: everything it does through `sql` and `emit`
    commits together with the rest of its batch, or not at all. An exception
    the function raises aborts the TE as `abort` does, with the reason
    "procedure <name>: <type>: <text>".
    """

    batch: pa.Table | None
    """The input stream's tuples this TE takes, in batch order (one tuple per TE under FOR EACH ROW);
    None for an OLTP call."""

    ts: int
    """The global timestamp of the batch or call being run (see the module docstring); `$ts` in SQL."""

    @property
    def batch_id(self) -> int:
        """The old name of `ts`, kept so procedures written against it go on working."""
        return self.ts

    def sql(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Runs one statement in the TE's transaction and returns its result rows (an empty table if none).

        `$name` placeholders take `params[name]` (`$batch_id` is always `ts`);
        a missing one is INVALID_ARGUMENT. Inside a procedure ON
        STREAM s, the relation `s` is `batch`. The statement is checked and
        compiled on first use, then cached. A DuckDB error aborts the TE.
        """
        ...

    def emit(self, stream: str, rows: pa.Table | dict | list) -> None:
        """Appends tuples to `stream`, which the procedure's `emits` must name.

        `rows` is a pyarrow Table, a dict of column lists or a list of row
        dicts; it is cast to the stream's declared columns (by name) or the
        TE aborts with INVALID_ARGUMENT naming the column. The stream's
        consumers run on them after this TE, in the same transaction; a
        stream nothing consumes keeps them for subscribers, under `ts`.
        """
        ...

    def abort(self, reason: str) -> None:
        """Undoes the TE (and its transaction group) and never returns.

        If the TE took the pushed batch, the batch is rejected with ABORTED
        and `reason`; a call fails with ABORTED and `reason`; a TE further
        downstream is left out and reported in the batch's outcome.
        """
        ...


# ------------------------------------------------------------ state procedures


@dataclass(frozen=True)
class Ref:
    """A handle on one declared operation of an event; `Event.value(ref)` is its row in post_process.

    `index` is the operation's position among the event's declarations, so
    `Ref(i)` may be written as a constant when declarations are always made in
    the same order.
    """

    index: int


_CACHED_REFS = 64
_REFS = tuple(Ref(i) for i in range(_CACHED_REFS))  # immutable, so events share them: one per declaration would cost


class Op:
    """One declared state access, as the executor reads it; built by `Event.read`, `write` and `read_modify`.

    Slotted and positional, since every event declares several.
    """

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
    """One tuple of a state procedure's input batch, and its state transaction.

    In `pre_process` the event declares operations on rows named by `table`
    and primary `key` (tables with a one-column PRIMARY KEY). The executor
    then applies them, in declaration order, after every earlier event's
    (earlier batches first, then earlier rows of this batch): each operation
    sees the state those left, and this event's earlier operations. A row
    missing from the table reads as None; writing it inserts it.

    The event's operations are one transaction: if a `cond` returns False, or
    a `cond` or `fn` raises, none of them takes effect, later events see the
    state without them, and the event is `rejected` with `reason`:
    "condition failed on <table>[<key>]", the message of a
    `streamtx.errors.Aborted` raised, or "<type>: <text>" of any other
    exception. A rejected event does not abort its batch.

    `reads` on `write` and `read_modify` names other rows, (table, key)
    pairs, whose values as of this operation are passed to `cond` and `fn`
    after the operation's own row (TStream's cross-chain dependencies).
    `fn` and `cond` may run after `pre_process` returned, and again if the
    batch is re-run: they must depend on their arguments and the event's
    values only. Capture the values they need rather than the event: a
    closure over the event keeps it alive in a reference cycle.

    `ops`, `values` and `out` are kept for the executor.
    """

    __slots__ = ("row", "ts", "ops", "values", "rejected", "reason", "out")

    def __init__(self, row: Row, ts: int) -> None:
        self.row = row
        """The tuple's values by column name."""
        self.ts = ts
        """The global timestamp of the event's batch (see the module docstring)."""
        self.ops: list[Op] = []
        self.values: list[Row | None] = []
        self.rejected = False
        """The event's state transaction did not take effect (a failed condition, or `reject`)."""
        self.reason = ""
        """Why it was rejected."""
        self.out: list[tuple[str, Row]] = []

    @property
    def batch_id(self) -> int:
        """The old name of `ts`, kept so procedures written against it go on working."""
        return self.ts

    def __getitem__(self, column: str) -> Any:
        """The tuple's value in `column`."""
        return self.row[column]

    # -- pre_process: declare operations -------------------------------------------
    def read(self, table: str, key: Key) -> Ref:
        """Declares a read of `table[key]`; its value is the row (None if missing)."""
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
        """Declares that `table[key]` becomes (a copy of) `row`, if `cond(current, *reads rows)` holds.

        `row` must hold every column of the table, its primary key equal to
        `key`. Its value is the row written.
        """
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
        """Declares that `table[key]` becomes `fn(current, *reads rows)`, if `cond(current, *reads rows)` holds.

        `current` is the row as this operation finds it (None if missing).
        `cond` is called first, with the same arguments as `fn`; `fn` only if
        it holds. `fn` returns a new dict holding every column of the table,
        its primary key equal to `key`; it must not change `current`. Its
        value is the row `fn` returned.
        """
        ops = self.ops
        index = len(ops)
        ops.append(Op("read_modify", table, key, None, fn, cond, tuple(reads)))
        return _REFS[index] if index < _CACHED_REFS else Ref(index)

    def reject(self, reason: str) -> None:
        """Rejects the event in pre_process: it accesses no state, not even what it declared already.

        The batch goes on; post_process sees `rejected` and `reason`.
        """
        self.rejected = True
        self.reason = reason
        self.ops.clear()

    # -- post_process: results and output --------------------------------------------
    def value(self, ref: Ref) -> Row | None:
        """In post_process: the row an operation read, wrote or left; None if the event was rejected or
        the row is missing."""
        if self.rejected:
            return None
        return self.values[ref.index]

    def emit(self, stream: str, row: Row) -> None:
        """In post_process: appends one tuple to `stream`, which the procedure's `emits` must name.

        A batch's tuples reach the stream in the order of its events, cast to
        the stream's declared columns as `Tx.emit` casts them.
        """
        self.out.append((stream, row))


class StateProcedure:
    """Base class of a state procedure; subclass it and bind an instance (`name = MyProcedure()`).

    Each event is one state transaction (`Event`); a batch's events are
    applied in the batch's row order. `emits` lists the streams post_process
    may emit on.

    `pre_process(event)` runs for each event of a batch, in row order, before
    any of the batch's state is accessed. Under `opchain` it may run for all
    batches of a punctuation interval before the first of them is applied,
    and it may run again for the same event (the batch re-run alone after its
    interval aborted, or on each partition its keys span): it must depend only
    on the event's values and must have no effect but declaring.

    `post_process(event)` runs for each event of the batch, in row order,
    after all of the batch's events were applied; it too may run again, so its
    only effect must be `event.emit`.

    An exception either step raises (other than through `cond` and `fn`,
    which reject only their event) aborts the whole TE: the batch is rejected
    with ABORTED naming the procedure and the exception.
    """

    emits: tuple[str, ...] = ()
    streamtx_procedure = True  # found by the procedure loader like a @procedure function

    def pre_process(self, event: Event) -> None:
        raise NotImplementedError

    def post_process(self, event: Event) -> None:
        """Default: nothing to emit."""
