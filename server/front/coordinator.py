"""Coordinated commands: TEs that span partitions, run TE by TE from the front.

A command is coordinated when its TEs do not all run on one partition (a
batch whose keys fall on several partitions, a stream that feeds a procedure
placed elsewhere, a procedure that runs everywhere). The coordinator walks the
command's `Schedule` (server/schedule.py), the one a partition walks, so the
TEs run in the same order as on one partition; it sends each unit's fragments (its input rows
routed by key, or all of them to every partition) to the partitions it runs
on, and, once every fragment answered, commits it on all of them or, if one
aborted, undoes it on all of them (two-phase commit; the partitions wait with
the transaction open, and the gate keeps everything else away meanwhile).
Output tuples come back here and are routed to the consumers' partitions,
so the TEs of batch b downstream start only after all of b's upstream
fragments committed. Outcomes are the ones one partition would give.

A command that reaches a FOR EACH ROW procedure runs its TEs tuple by tuple,
depth first (the schedule's order), and keeps
one transaction open on every partition it touches until its end (one
two-phase commit): the batch is atomic, and the TE of its 5th tuple may
abort after the 4th tuple's committed nothing yet. An interior TE that
aborts is undone as the partition's isolated path undoes it: everything is
rolled back and the command runs again without it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from streamtx.errors import DataLoss, error_for
from streamtx.server import protocol as pr
from streamtx.server.catalog.placement import EVENT_KEYED, EVERYWHERE, PARTITIONED, SINGLE
from streamtx.server.config import ServerConfig
from streamtx.server.front import exchange
from streamtx.server.front.partitions import Partitions, Restarted, checked
from streamtx.server.front.ports import Routing
from streamtx.server.front.supervisor import Supervisor
from streamtx.server.partitioning import HOME
from streamtx.server.protocol import Mark, Outcome, TeSpec
from streamtx.server.schedule import Key, Schedule, Unit, skips
from streamtx.server.schedule import reason as undone_reason


@dataclass
class _State:
    outcome: Outcome
    schedule: Schedule
    error: tuple[int, str] | None = None  # a call's own TE aborted: its code and reason
    group: str | None = None  # the open transaction group, committed when the next unit is not in it
    group_parts: set[int] = field(default_factory=set)
    group_mark: Mark | None = None
    emitted: set[str] = field(default_factory=set)
    results: list[pa.Table] = field(default_factory=list)
    one_transaction: bool = False
    """The command reaches a FOR EACH ROW procedure: nothing commits before its end."""
    parts: set[int] = field(default_factory=set)  # partitions holding the open transaction (one_transaction)
    stopped: bool = False  # a duplicate, a rejection or a failed call ended the command


class _Rerun(Exception):
    """An interior unit of a one-transaction command aborted: run the command again without it."""

    def __init__(self, skip: dict[Key, str | None]) -> None:
        self.skip = skip


class Coordinator:
    def __init__(
        self,
        front: Routing,
        partitions: Partitions,
        counters: collections.Counter[str],
        supervisor: Supervisor,
        config: ServerConfig,
    ) -> None:
        self.front = front
        self.partitions = partitions
        self.counters = counters
        self.supervisor = supervisor
        self.config = config

    # ------------------------------------------------------------ commands
    async def push(self, stream: str, producer: str, batch_id: int, ts: int, table: pa.Table) -> Outcome:
        mark = [producer, stream, batch_id]
        one = self.front.catalog.reaches_each_row([stream])

        async def finished() -> Outcome:
            return await self.front.finished_outcome(stream, producer, batch_id, ts)

        def start(st: _State) -> Awaitable[None]:
            st.schedule.push(stream, table)
            return self._execute(st, ts, mark, None)

        st = await self._attempts(one, start, ts, finished)
        self.counters[st.outcome.outcome] += 1
        self.counters["coordinated"] += 1
        for s in st.emitted:
            self.front.notify(s)
        return st.outcome

    async def call(self, procedure: str, params: dict[str, Any], ts: int) -> tuple[Outcome, list[pa.Table]]:
        cat = self.front.catalog
        one = cat.reaches_each_row(sorted(cat.emitted_by(procedure)))

        async def finished() -> Outcome:
            raise DataLoss(
                f"call {procedure}: it committed (timestamp {ts}), but a partition worker died before the "
                "result came back; its result rows are lost, and it was not run again"
            )

        def start(st: _State) -> Awaitable[None]:
            st.schedule.call(procedure)
            return self._execute(st, ts, None, params)

        st = await self._attempts(one, start, ts, finished)
        if st.error is not None:
            raise error_for(*st.error)
        self.counters["coordinated"] += 1
        for s in st.emitted:
            self.front.notify(s)
        return st.outcome, st.results

    # ----------------------------------------------------------- execution
    async def _attempts(
        self,
        one_transaction: bool,
        execute: Callable[[_State], Awaitable[None]],
        ts: int,
        finished: Callable[[], Awaitable[Outcome]],
    ) -> _State:
        """Runs the command, again without each interior unit that aborted (one-transaction commands).

        If the partitions were restarted under it (front/supervisor.py), it is
        either done (its DONE record made it: `finished` says how it ended) or
        undone everywhere, and runs again from the start.
        """
        skip: dict[Key, str | None] = {}
        restarted = False
        while True:
            st = _State(Outcome("committed", ts), Schedule(self.front.catalog, skip), one_transaction=one_transaction)
            try:
                await execute(st)
            except _Rerun as again:
                skip = {**skip, **again.skip}
                continue
            except Restarted:
                await self.supervisor.recovered()
                if ts in self.supervisor.done:
                    return _State(await finished(), st.schedule)
                restarted = True
                continue
            if restarted:
                st.outcome = st.outcome.first(ts)
            return st

    async def _execute(
        self,
        st: _State,
        ts: int,
        push: Mark | None,
        params: dict[str, Any] | None,
    ) -> None:
        """Runs the command's units; `push`: the batch a push command takes (its mark), None for a call."""
        try:
            await self._run_units(st, ts, push, params)
        except (_Rerun, Restarted):
            raise  # every partition undid its part already (or was restarted without it)
        except BaseException:
            await self.undo_everywhere(ts)
            raise
        st.outcome.emitted = set(st.emitted)
        if self.config.durability != "off":
            # durable on the home partition: recovery replays this command's fragments on every partition
            checked(await self.partitions[HOME].send(pr.Done(ts)))

    async def undo_everywhere(self, ts: int) -> None:
        """After a failure mid-command (a partition died): no partition may keep a transaction open."""
        command = pr.Decide(False, ts)
        live = [p for p in self.partitions.all if p.alive]
        await asyncio.gather(*(p.send(command) for p in live), return_exceptions=True)

    async def _run_units(self, st: _State, ts: int, push: Mark | None, params: dict[str, Any] | None) -> None:
        for _, unit in st.schedule:
            await self._unit(st, unit, ts, push, params)
            if st.stopped:
                return
        if st.schedule.aborted:
            self.counters["tes_aborted"] += len(st.schedule.aborted)
            st.outcome.aborted_tes += st.schedule.aborted
        if st.group is not None:
            await self.decide(st.group_parts, True, ts, st.group_mark)
            st.group = None
        if st.one_transaction and st.parts:
            await self.decide(st.parts, True, ts, push)

    async def _unit(
        self,
        st: _State,
        unit: Unit,
        ts: int,
        push: Mark | None,
        params: dict[str, Any] | None,
    ) -> None:
        if not st.one_transaction and st.group is not None and unit.group != st.group:
            await self.decide(st.group_parts, True, ts, st.group_mark)
            st.group, st.group_parts, st.group_mark = None, set(), None
        rows = st.schedule.input(unit)
        fragments = self._place(unit, rows, ts, push if unit.entry else None, params if unit.stream is None else None)
        keyed = [p for p in unit.procedures if self.front.catalog.placement.procedures.get(p) == EVENT_KEYED]
        if keyed:  # its events' state rows, merged from the partitions it involves (front/exchange.py)
            assert rows is not None and len(unit.procedures) == 1
            await exchange.attach_rows(self.partitions, keyed[0], rows, ts, fragments)
        unit_mark = push if unit.entry else None
        alone = len(fragments) == 1 and unit.group is None and st.group is None and not st.one_transaction
        if alone:  # one partition: it commits at once if the TE succeeds (no second round trip)
            p, (fragment, tables) = next(iter(fragments.items()))
            fragments[p] = (replace(fragment, autocommit=True, mark=unit_mark), tables)
        replies = await asyncio.gather(*(self.partitions[p].request(f, t) for p, (f, t) in fragments.items()))
        parts = set(fragments)
        duplicates = [r[0] for r in replies if isinstance(r[0], Outcome)]
        if duplicates:
            await self.decide(parts | st.group_parts | st.parts, False, ts)
            st.outcome = _duplicate(duplicates)
            st.stopped = True
            return
        aborted = [r[0] for r in replies if isinstance(r[0], pr.FragmentAborted)]
        if aborted:
            first = aborted[0]
            if st.one_transaction:
                await self._abort_one(st, unit, parts, ts, first.code, first.reason, push)
                return
            await self._abort(st, unit, parts, ts, first.code, first.reason, push)
            return
        if st.one_transaction:
            st.parts |= parts
        elif unit.group is not None:
            st.group = unit.group
            st.group_parts |= parts
            st.group_mark = st.group_mark or unit_mark
        elif not alone:
            await self.decide(parts, True, ts, unit_mark)
        self._collect(st, unit, replies)

    async def _abort_one(
        self,
        st: _State,
        unit: Unit,
        parts: set[int],
        ts: int,
        code: int,
        reason: str,
        push: Mark | None,
    ) -> None:
        """A unit of a one-transaction command aborted: undo everything; reject, fail the call, or run again."""
        instance = st.schedule.instance
        undone = [u for _, u in instance]
        reason, rejection = _undone(st.schedule.group, code, reason, push if any(u.entry for u in undone) else None)
        await self.decide(parts | st.parts, False, ts, rejection=rejection)
        st.stopped = True
        if rejection is not None:
            st.outcome = Outcome("rejected", ts, code, reason)
            st.emitted = set()
            return
        if any(u.stream is None for u in undone):
            st.error = (code, reason)
            return
        raise _Rerun(skips(instance, f"{unit.procedures[0]}: {reason}"))

    def _collect(self, st: _State, unit: Unit, replies: list[tuple[pr.FragmentRan, list[pa.Table]]]) -> None:
        """A unit committed (or joined the open group): its outputs become the next units' inputs."""
        outputs: dict[str, list[pa.Table]] = {}
        results: dict[int, list[pa.Table]] = {}
        for ran, tables in replies:
            streams = ran.emitted
            for s, t in zip(streams, tables[: len(streams)], strict=True):
                outputs.setdefault(s, []).append(t)
            st.emitted |= set(ran.stored)
            if unit.stream is None:
                for i, t in zip(ran.result_ids, tables[len(streams) :], strict=True):
                    results.setdefault(i, []).append(t)
        st.results += [_merge(results[i]) for i in sorted(results)]
        st.outcome.tes += len(unit.procedures) or 1
        for stream in sorted(outputs):
            st.schedule.emitted(unit, stream, _merge(outputs[stream]))

    async def _abort(
        self,
        st: _State,
        unit: Unit,
        parts: set[int],
        ts: int,
        code: int,
        reason: str,
        push: Mark | None,
    ) -> None:
        group = st.group if st.group is not None else unit.group
        undone_entry = unit.entry or (st.group is not None and st.group_mark is not None)
        reason, rejection = _undone(group, code, reason, push if undone_entry else None)
        await self.decide(parts | st.group_parts, False, ts, rejection=rejection)
        st.group, st.group_parts, st.group_mark = None, set(), None
        if group is not None:
            st.schedule.undone(group)
        if rejection is not None:
            st.outcome = Outcome("rejected", ts, code, reason)
            st.emitted = set()
            st.stopped = True
            return
        if unit.stream is None:
            st.error = (code, reason)
            st.stopped = True
            return
        self.counters["tes_aborted"] += 1
        st.outcome.aborted_tes.append(f"{unit.procedures[0]}: {reason}")

    async def decide(
        self,
        parts: set[int],
        commit: bool,
        ts: int,
        mark: Mark | None = None,
        rejection: list[Any] | None = None,
    ) -> None:
        command = pr.Decide(commit, ts, mark, rejection)
        replies = await asyncio.gather(*(self.partitions[p].send(command) for p in sorted(parts)))
        for r in replies:
            checked(r)

    # ------------------------------------------------------------- routing
    def _place(
        self,
        unit: Unit,
        rows: pa.Table | None,
        ts: int,
        push: Mark | None,
        params: dict[str, Any] | None,
    ) -> exchange.Fragments:
        """Each partition's fragment of the unit: its TE specs and their input rows."""
        front = self.front
        pl = front.catalog.placement
        pmap = front.map_at(ts)
        every = range(len(self.partitions))
        specs: dict[int, list[tuple[TeSpec, pa.Table | None]]] = {}

        def add(p: int, procedure: str | None, rows: pa.Table | None, border: bool) -> None:
            specs.setdefault(p, []).append((TeSpec(procedure, unit.stream, border, unit.entry), rows))

        if unit.stream is not None:
            assert rows is not None
            key = pl.streams.get(unit.stream)
            by_key = pmap.split(rows, key) if key is not None and rows.num_rows else {HOME: rows}
            if unit.entry:
                for p, part in by_key.items():
                    add(p, None, part, True)
            for proc in unit.procedures:
                kind = pl.procedures[proc]
                if kind == PARTITIONED:
                    for p, part in by_key.items():
                        add(p, proc, part, False)
                elif kind == EVERYWHERE:
                    for p in every:
                        add(p, proc, rows, False)
                elif kind == EVENT_KEYED:
                    for p in exchange.involved(pmap, pl.event_keys[proc], rows):
                        add(p, proc, rows, False)
                else:
                    add(HOME, proc, rows, False)
        else:
            proc = unit.procedures[0]
            kind = pl.procedures[proc]
            if kind == PARTITIONED:
                targets = [front.call_owner(proc, params or {}, ts)]
            elif kind == SINGLE:
                targets = [HOME]
            else:
                targets = list(every)
            for p in targets:
                add(p, proc, None, False)
        out = {}
        for p, items in sorted(specs.items()):
            tables = [t if t is not None else pa.table({}) for _, t in items]
            out[p] = (pr.Fragment(ts, tuple(s for s, _ in items), params, push), tables)
        return out


def _merge(parts: list[pa.Table]) -> pa.Table:
    """Rows of one batch (or one statement's result) from several partitions, in a deterministic order.

    Tuples of one batch form a set; on one partition they keep the order they
    were emitted in, and across partitions the order of their columns (first
    to last) is the one that makes the result independent of the partition
    count, e.g. for a ROWS window, which takes tuples in order.
    """
    if len(parts) == 1:
        return parts[0]
    rows = pa.concat_tables(parts)
    return rows.sort_by([(c, "ascending") for c in rows.column_names])


def _undone(group: str | None, code: int, reason: str, push: Mark | None) -> tuple[str, list[Any] | None]:
    """An abort's reason as reported (naming the undone group) and, if `push`'s batch is undone with it,
    the rejection the partitions record for its id."""
    reason = undone_reason(group, reason)
    return reason, None if push is None else [*push, code, reason]


def _duplicate(originals: list[Outcome]) -> Outcome:
    """A re-sent batch: the original's outcome (rejected if any partition recorded it rejected)."""
    rejected = [o for o in originals if o.original == "rejected"]
    return (rejected or originals)[0]
