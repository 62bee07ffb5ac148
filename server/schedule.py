"""The order in which the TEs of one command run: one scheduler for a partition and for the front.

A command (an atomic batch, or an OLTP call) starts with its entry unit: every
procedure ON STREAM of the batch's stream, taken or refused together (or the
called procedure). Each unit that commits output on a stream makes that
stream's consumers ready (PE triggers). Of the ready units, the next to run is

1. a member of the transaction group that is running, if any: a group's
   members run back to back (S-Store's nested transactions);
2. else the entry unit, else the lowest topological rank (ties: by name).

Hence, per command, the TEs run in a topological order of the dataflow graph;
every producer of a stream runs before the stream's consumers, which read
everything it got in this command as one batch. A FOR EACH ROW procedure's
unit runs once per tuple of its input, in order, and everything that tuple's
TE triggers runs before the next tuple's (depth first), so the command ends
as if its tuples had arrived one at a time.

The partition's dataflow (partition/dataflow.py) runs a command alone; the
front's coordinator (front/coordinator.py) runs the same units across
partitions. Both walk a `Schedule`, which knows nothing of how a unit runs:
its driver runs each unit it yields and reports what the unit emitted.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from streamtx.server.tuples import Batch, concat

if TYPE_CHECKING:
    from streamtx.server.catalog.catalog import Catalog

Key = tuple[tuple[int, ...], tuple[str, ...], bool]
"""A unit's place in its command, the same on every attempt: (its FOR EACH ROW tuple positions,
its procedures, entry)."""


@dataclass(frozen=True)
class Unit:
    """TEs taken together: the entry TEs of a batch (every consumer of its stream; none: the batch
    is only appended), a called procedure, or one procedure triggered downstream."""

    procedures: tuple[str, ...]
    stream: str | None  # the input stream (None: an OLTP call)
    group: str | None = None  # its transaction group
    entry: bool = False  # takes the pushed batch: its abort rejects the batch

    @property
    def border(self) -> bool:
        """It appends the pushed batch (and fires the stream's EE triggers) before its procedures run."""
        return self.entry and self.stream is not None


@dataclass
class _Level:
    """The ready units and the streams' batches of one depth: the command, or one tuple of a FOR EACH ROW unit."""

    pending: list[Unit]
    inputs: dict[str, list[tuple[str | None, Batch]]] = field(default_factory=dict)  # stream -> (origin, rows)
    rows: tuple[int, ...] = ()


class Schedule:
    """The units of one command in the order they run; see the module docstring.

    `skip` names units an earlier attempt saw abort (with the report to give,
    or None if undone only with their group): they are passed over, and
    `aborted` collects the reports. `instance` lists the running group's
    units so far, for a driver that must undo the group.
    """

    def __init__(self, catalog: Catalog, skip: dict[Key, str | None] | None = None) -> None:
        self.catalog = catalog
        self.skip = skip or {}
        self.aborted: list[str] = []
        self.group: str | None = None
        self.instance: list[tuple[Key, Unit]] = []
        self._levels: list[_Level] = []
        self._first: _Level | None = None

    # ---------------------------------------------------------------- start
    def push(self, stream: str, rows: pa.Table) -> Unit:
        """A pushed batch: its entry unit."""
        unit = _units(self.catalog).entry(self.catalog, stream)
        self._first = _Level([unit], {stream: [(None, rows)]})
        return unit

    def resume(self, streams: dict[str, pa.Table]) -> None:
        """A batch whose entry TEs ran elsewhere (front/flows.py): its consumers of what they emitted."""
        cat = self.catalog
        level = _Level([])
        for stream, rows in streams.items():
            level.inputs[stream] = [(None, rows)]
            level.pending += [Unit((p,), stream, cat.group_of(p)) for p in cat.consumers.get(stream, [])]
        self._first = level

    def call(self, procedure: str) -> Unit:
        """An OLTP call: its unit."""
        unit = Unit((procedure,), None, self.catalog.group_of(procedure))
        self._first = _Level([unit])
        return unit

    # ------------------------------------------------------------------ walk
    def __iter__(self) -> Iterator[tuple[Key, Unit]]:
        """The units to run, in order; each is run (and its output reported) before the next is asked for."""
        assert self._first is not None, "push() or call() first"
        yield from self._walk(self._first)
        self.group = None

    def _walk(self, level: _Level) -> Iterator[tuple[Key, Unit]]:
        self._levels.append(level)
        try:
            while level.pending:
                unit = self._next(level.pending)
                rows = self._each_row(unit, level)
                if rows is not None:
                    for i, row in enumerate(rows):
                        yield from self._walk(_Level([unit], {unit.stream: [(None, row)]}, (*level.rows, i)))  # type: ignore[dict-item]
                    continue
                key: Key = (level.rows, unit.procedures, unit.entry)
                if unit.group is None or unit.group != self.group:
                    self.instance = []
                self.group = unit.group
                if key in self.skip:
                    report = self.skip[key]
                    if report is not None:
                        self.aborted.append(report)
                    continue
                self.instance.append((key, unit))
                yield key, unit
        finally:
            self._levels.pop()

    def _next(self, pending: list[Unit]) -> Unit:
        if len(pending) > 1:
            rank = self.catalog.topo_rank
            pool = [u for u in pending if self.group is not None and u.group == self.group] or pending
            best = min(pool, key=lambda u: (not u.entry, _rank(rank, u), u.procedures))
            pending.remove(best)
            return best
        return pending.pop()

    def _each_row(self, unit: Unit, level: _Level) -> list[Batch] | None:
        """The tuples a FOR EACH ROW unit takes one at a time (None: it takes its batch at once)."""
        if unit.stream is None or not _units(self.catalog).each_row(self.catalog, unit):
            return None
        batch = self._input(level, unit.stream)
        if batch is None or batch.num_rows < 2:
            return None
        return [batch.slice(i, 1) for i in range(batch.num_rows)]

    # ------------------------------------------------------- what units did
    def input(self, unit: Unit) -> Batch | None:
        """The batch `unit` takes: everything its stream got in this command (at this depth)."""
        return None if unit.stream is None else self._input(self._levels[-1], unit.stream)

    @staticmethod
    def _input(level: _Level, stream: str) -> Batch | None:
        parts = level.inputs.get(stream)
        if not parts:
            return None
        return concat([rows for _, rows in parts])

    def emitted(self, unit: Unit, stream: str, rows: Batch) -> None:
        """`unit` committed `rows` on `stream` (or joined its open group with them): its consumers are ready.

        They are made ready once per stream: later output on it joins the
        batch they will read (its producers all run before them).
        """
        level = self._levels[-1]
        parts = level.inputs.get(stream)
        if parts:
            parts.append((unit.group, rows))
            return
        level.inputs[stream] = [(unit.group, rows)]
        level.pending += _units(self.catalog).consumers(self.catalog, stream)

    def undone(self, group: str) -> None:
        """A transaction group was undone (the front's coordinator): what its members emitted is gone."""
        level = self._levels[-1]
        for stream in list(level.inputs):
            parts = [p for p in level.inputs[stream] if p[0] != group]
            if parts:
                level.inputs[stream] = parts
            else:
                del level.inputs[stream]
                level.pending = [u for u in level.pending if u.stream != stream]
        self.group = None
        self.instance = []


class _Units:
    """A catalog's units, made once: a partition asks for them for every batch (a catalog never changes).

    It holds no reference to its catalog, which keys it weakly (`_units`): a deploy's old catalog goes.
    """

    def __init__(self) -> None:
        self._entry: dict[str, Unit] = {}
        self._consumers: dict[str, tuple[Unit, ...]] = {}
        self._each_row: dict[tuple[str, ...], bool] = {}

    def entry(self, cat: Catalog, stream: str) -> Unit:
        unit = self._entry.get(stream)
        if unit is None:
            consumers = tuple(cat.consumers.get(stream, []))
            groups = {g for g in map(cat.group_of, consumers) if g is not None}
            unit = self._entry[stream] = Unit(consumers, stream, groups.pop() if groups else None, entry=True)
        return unit

    def consumers(self, cat: Catalog, stream: str) -> tuple[Unit, ...]:
        """The units a stream's output makes ready: one per consumer."""
        units = self._consumers.get(stream)
        if units is None:
            units = self._consumers[stream] = tuple(
                Unit((p,), stream, cat.group_of(p)) for p in cat.consumers.get(stream, [])
            )
        return units

    def each_row(self, cat: Catalog, unit: Unit) -> bool:
        """Whether a procedure of the unit runs FOR EACH ROW."""
        known = self._each_row.get(unit.procedures)
        if known is None:
            procedures = cat.procedures
            known = self._each_row[unit.procedures] = any(procedures[p].each_row for p in unit.procedures)
        return known


_UNITS: weakref.WeakKeyDictionary[Catalog, _Units] = weakref.WeakKeyDictionary()


def _units(catalog: Catalog) -> _Units:
    units = _UNITS.get(catalog)
    if units is None:
        units = _UNITS[catalog] = _Units()
    return units


def skips(instance: list[tuple[Key, Unit]], report: str) -> dict[Key, str | None]:
    """Units to leave out on the next attempt after the running group aborted: all of it, the first
    (the one an attempt reaches for sure) carrying the report of the abort."""
    out: dict[Key, str | None] = {key: None for key, _ in instance}
    out[instance[0][0]] = report
    return out


def reason(group: str | None, message: str) -> str:
    """An abort's reason as reported: naming the transaction group it undid."""
    return message if group is None else f"transaction group {group} undone: {message}"


def _rank(rank: dict[str, int], unit: Unit) -> int:
    return min((rank.get(p, -1) for p in unit.procedures), default=-1)
