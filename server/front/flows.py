"""Flows: a run of batches whose dataflow goes from their keys' partitions to the home partition.

The common shape of a partitioned dataflow (the voter's): a procedure
partitioned by the pushed stream's key (vote, by phone) feeds procedures on
the home partition (leaderboard). Each such batch spans two partitions, so
alone it is a coordinated command (front/coordinator.py): a two-phase
commit and a log flush per batch, with every later batch held at the gate.
A flow takes that batch together with the batches of such streams queued
behind it at the gate, up to `--interval-size`, and runs them all in two
stages and one two-phase commit:

1. *entry*: each partition other than home runs the entry TEs of the batches
   whose keys it owns, in timestamp order, as one punctuation interval, and
   returns what they emitted;
2. *rest*: the home partition runs, in timestamp order, the batches whose
   keys it owns whole, and the rest of every other batch from what its entry
   emitted.

Then every partition commits (or all undo) and logs its stage (FLOW); home
logs the flow done. On every partition each TE runs in exactly the order it
would on one partition: the entry TEs of batch b+1 on another partition
cannot see anything home does for batch b, because a flow stops at the first
batch whose dataflow would reach back (a TE placed beyond home, such as a
procedure that runs everywhere) or whose TE aborts. Then the flow is undone,
the batches before that one run again as a flow, that one runs alone as a
coordinated command, and the rest go on as a flow.

Stages go in steps (`STEP` batches), the entry partitions two steps ahead
of home. Flows follow each other without stopping the gate: the flow batches
that queued meanwhile start the next flow as soon as this one has sent its
decision (the partitions take messages in order, so nothing of the next
flow runs inside this one's transaction), and the next flow's decision waits
until this one's DONE is on its way to home, so DONE records are logged in
flow order and a flow is never recovered without the ones before it.

A batch whose entry procedure is FOR EACH ROW runs row by row, each row
with everything it triggers before the next: in a flow its rows are items
of their own, each on its key's partition, so such a batch may span
partitions; a step never splits a batch, and the batch commits with its flow.

A batch's outcome is the one it would have alone: its entry's outcome (the
entry partition answers DUPLICATE for a re-sent batch, and keeps its mark),
with the TEs and stored streams of its rest added.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from streamtx.server import protocol as pr
from streamtx.server.config import ServerConfig
from streamtx.server.front.coordinator import Coordinator
from streamtx.server.front.gate import Span
from streamtx.server.front.partitions import Partition, Partitions, Restarted, checked
from streamtx.server.front.ports import Finishing
from streamtx.server.front.spans import one_by_one
from streamtx.server.front.supervisor import Supervisor
from streamtx.server.ipc import join_grouped, split_grouped
from streamtx.server.partitioning import HOME
from streamtx.server.protocol import Outcome

STEP = 128
"""Batches per stage message: the entry partitions run step k + 1 while home runs the rest of step k.
Each step loads its keys with one query per table, so a step is worth a few dozen batches at least."""
FIRST_STEP = 32
LOOKAHEAD = 2
"""Entry steps sent ahead of the rest home runs: what a cut at home may have had run for nothing."""
RUN_FLOWS = 4
"""Flows' worth of batches one gate span takes in, at most: its batches stay referenced until it ends."""


@dataclass(frozen=True)
class FlowPush:
    """A batch that may join a flow: its place in the order, its keys' partition, how to run it alone."""

    stream: str
    producer: str
    batch_id: int
    ts: int
    table: pa.Table
    owners: tuple[int, ...]  # one: the partition of all its keys; else each row's (FOR EACH ROW: a row each)
    alone: Callable[[], Awaitable[Outcome]]


@dataclass(frozen=True)
class _Item:
    """What a flow's stages run as one: a batch, or one row of a FOR EACH ROW batch (its rows go one by one)."""

    at: int  # its batch's index in the flow
    owner: int
    table: pa.Table


def _items(pushes: list[FlowPush]) -> list[_Item]:
    out: list[_Item] = []
    for i, p in enumerate(pushes):
        if len(p.owners) == 1:
            out.append(_Item(i, p.owners[0], p.table))
        else:
            out += [_Item(i, owner, p.table.slice(r, 1)) for r, owner in enumerate(p.owners)]
    return out


@dataclass(eq=False)
class _Run:
    """One flow's batches on their way: what the next flow waits for before it sends its steps and decision."""

    pushes: list[FlowPush]
    before: _Run | None
    committing: asyncio.Event = field(default_factory=asyncio.Event)  # its last decision is sent (or it ended)
    logged: asyncio.Event = field(default_factory=asyncio.Event)  # its DONE is sent (or it ended)
    task: asyncio.Future | None = None

    async def before_finished(self) -> None:
        """Waits until the flow before this one ended (before anything but the happy path of this one)."""
        if self.before is not None and self.before.task is not None:
            await asyncio.wait([self.before.task])


class Flows:
    def __init__(
        self,
        front: Finishing,
        partitions: Partitions,
        counters: collections.Counter[str],
        supervisor: Supervisor,
        coordinator: Coordinator,
        config: ServerConfig,
    ) -> None:
        self.front = front
        self.partitions = partitions
        self.counters = counters
        self.supervisor = supervisor
        self.coordinator = coordinator
        self.config = config

    async def run(self, pushes: list[FlowPush], span: Span | None = None) -> list[Outcome | BaseException]:
        """Each batch's outcome, in order (an exception for a batch that failed alone).

        The batches go in flows of at most `--interval-size`. With `span`, the
        flow batches that come to the head of the gate's line go on in the
        next flows (`RUN_FLOWS` flows' worth in all), each sent as the one
        before sends its decision, and each batch is answered as its flow
        ends. So the partitions take the next flow's first steps while the
        one before commits, and the gate does not stop between flows.
        """
        limit = self.config.interval_size
        results: dict[int, Outcome | BaseException] = {}
        taken: list[FlowPush] = []
        todo = list(pushes)
        runs: list[_Run] = []
        while True:
            if not todo and span is not None and len(taken) < RUN_FLOWS * limit:
                todo = span.more(limit, FlowPush)
            if not todo:
                break
            run = _Run(todo[:limit], runs[-1] if runs else None)
            todo = todo[limit:]
            taken += run.pushes
            run.task = asyncio.ensure_future(self._run(run, span, results))
            runs.append(run)
            await run.committing.wait()
        await asyncio.gather(*(r.task for r in runs if r.task is not None))
        return [results[id(p)] for p in taken]

    async def _run(self, run: _Run, span: Span | None, results: dict[int, Outcome | BaseException]) -> None:
        try:
            outcomes = await self._cut_where_needed(run)
        except BaseException as e:  # the flow failed as a whole: each of its batches with that error
            outcomes = [e] * len(run.pushes)
        finally:
            run.committing.set()
            run.logged.set()
        for p, o in zip(run.pushes, outcomes, strict=True):
            results[id(p)] = o
            if span is not None:
                span.answer(p, o)

    async def _cut_where_needed(self, run: _Run) -> list[Outcome | BaseException]:
        """The flow's outcomes: the batches before a cut as a flow again, the batch that cut it alone, then on."""
        pushes = run.pushes
        out: list[Outcome | BaseException] = []
        at = 0
        while at < len(pushes):
            outcomes, cut = await self._attempt(run, pushes[at:], last=True)
            if cut is None:
                out += outcomes
                break
            await run.before_finished()
            if cut:
                before, again = await self._attempt(run, pushes[at : at + cut], last=False)
                out += before if again is None else await one_by_one(pushes[at : at + cut])
            out += await one_by_one([pushes[at + cut]])
            at += cut + 1
        return out

    async def _attempt(self, run: _Run, pushes: list[FlowPush], last: bool) -> tuple[list[Outcome], int | None]:
        """The flow committed (its outcomes), or undone everywhere and the index of the batch that cut it.

        `last`: these batches end the run, so the next run may start once their decision is sent.
        """
        last_ts = pushes[-1].ts
        sent: list[bool] = []  # the commit decision went out: nothing may undo it from here
        try:
            return await self._flow(run, pushes, last, sent)
        except Restarted:  # front/supervisor.py: the flow is done everywhere or nowhere
            await run.before_finished()
            await self.supervisor.recovered()
            if last_ts in self.supervisor.done:
                return [await self.front.finished_outcome(p.stream, p.producer, p.batch_id, p.ts) for p in pushes], None
            outcomes, cut = await self._attempt(run, pushes, last)
            return [o.first(p.ts) for o, p in zip(outcomes, pushes, strict=False)], cut
        except BaseException:
            if not sent:  # after the decision a later flow may be open: a worker that failed is restarted
                await run.before_finished()
                await self.coordinator.undo_everywhere(last_ts)
            raise

    async def _flow(
        self, run: _Run, pushes: list[FlowPush], last: bool, sent: list[bool]
    ) -> tuple[list[Outcome], int | None]:
        """Sends the entry steps two ahead of the rest home runs; each step's rest once its entries answered."""
        epoch, last_ts = pushes[0].ts, pushes[-1].ts
        opened: set[int] = set()
        replies: list[asyncio.Future] = []

        def stage(part: int, name: str, items: list[tuple[list[Any], list[pa.Table]]]) -> asyncio.Future:
            first = part not in opened
            opened.add(part)
            replies.append(_stage(self.partitions[part], name, items, epoch, first))
            return replies[-1]

        items = _items(pushes)
        steps = _steps(items)

        def entry(step: range) -> list[tuple[list[int], asyncio.Future]]:
            owners: dict[int, list[int]] = {}
            for j in step:
                if items[j].owner != HOME:
                    owners.setdefault(items[j].owner, []).append(j)
            return [(ix, stage(p, "entry", [_whole(pushes, items[j]) for j in ix])) for p, ix in owners.items()]

        entry_steps = [entry(step) for step in steps[:LOOKAHEAD]]
        entries: dict[int, tuple[Outcome, dict[str, pa.Table]]] = {}
        rests: list[tuple[list[int], asyncio.Future]] = []
        cuts: list[int] = []
        try:
            for k, step in enumerate(steps):
                if any(_cut(r) for _, r in rests):
                    break
                if k + LOOKAHEAD < len(steps):
                    entry_steps.append(entry(steps[k + LOOKAHEAD]))
                for idx, reply in entry_steps[k]:
                    ran, tables = checked(await reply)
                    if ran.cut is not None:
                        cuts.append(items[idx[ran.cut]].at)
                        continue
                    emitted = split_grouped(ran.order, ran.runs, tables)
                    for i, outcome, streams in zip(idx, ran.outcomes, ran.emitted, strict=True):
                        entries[i] = outcome, dict(zip(streams, emitted[: len(streams)], strict=True))
                        emitted = emitted[len(streams) :]
                if cuts:
                    break
                rest, at_home = _rest(pushes, items, step, entries)
                if rest:
                    rests.append((at_home, stage(HOME, "rest", rest)))
            homes: dict[int, Outcome] = {}
            for at_home, reply in rests:
                ran, _ = checked(await reply)
                if ran.cut is not None:
                    cuts.append(items[at_home[ran.cut]].at)
                else:
                    homes.update(zip(at_home, ran.outcomes, strict=True))
        finally:  # every step answered before the decision (a failed one fails the flow)
            await asyncio.gather(*replies, return_exceptions=True)
        if cuts:
            await self.coordinator.decide(opened, False, last_ts)
            self.counters["flows_cut"] += 1
            return [], min(cuts)
        if run.before is not None:  # its DONE goes to home before this flow's decision
            await run.before.logged.wait()
        decisions = [self.partitions[p].send(pr.Decide(True, last_ts)) for p in sorted(opened)]
        sent.append(True)
        if last:
            run.committing.set()
        for decided in await asyncio.gather(*decisions):
            checked(decided)
        done = self.partitions[HOME].send(pr.Done(last_ts)) if self.config.durability != "off" else None
        if last:
            run.logged.set()
        if done is not None:  # durable on the home partition: recovery replays the flow's stages everywhere
            checked(await done)
        parts: list[list[Outcome]] = [[] for _ in pushes]
        for j, item in enumerate(items):
            parts[item.at] += [entries[j][0]] if j in entries else []
            parts[item.at] += [homes[j]] if j in homes else []
        outcomes = [_joined(p) for p in parts]
        self.counters["flows"] += 1
        self.counters["flow_batches"] += len(pushes)
        for o in outcomes:
            self.counters[o.outcome] += 1
            for s in o.emitted:
                self.front.notify(s)
        return outcomes, None


def _steps(items: list[_Item]) -> list[range]:
    """The flow's items in steps: a short first one, so that home starts early, then `STEP` each.

    A step ends only between batches, so a FOR EACH ROW batch's rows reach each partition in one message.
    """
    bounds, size = [0], FIRST_STEP
    for j in range(1, len(items)):
        if j - bounds[-1] >= size and items[j].at != items[j - 1].at:
            bounds.append(j)
            size = STEP
    bounds.append(len(items))
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def _cut(reply: asyncio.Future) -> bool:
    """Whether a stage that answered already cut the flow (then no further step is sent)."""
    if not reply.done() or reply.cancelled() or reply.exception() is not None:
        return False
    body = reply.result()[0]
    return isinstance(body, pr.FlowRan) and body.cut is not None


def _rest(
    pushes: list[FlowPush], items: list[_Item], step: range, entries: dict[int, tuple[Outcome, dict[str, pa.Table]]]
) -> tuple[list[tuple[list[Any], list[pa.Table]]], list[int]]:
    """A step's items for home: those it owns whole, and the rest of the others that emitted something."""
    rest: list[tuple[list[Any], list[pa.Table]]] = []
    at_home: list[int] = []
    for j in step:
        item = items[j]
        if item.owner == HOME:
            rest.append(_whole(pushes, item))
        else:
            outcome, streams = entries[j]
            if outcome.outcome != "committed" or not streams:
                continue
            p = pushes[item.at]
            names = sorted(streams)
            rest.append(([p.stream, p.producer, p.batch_id, p.ts, names], [streams[s] for s in names]))
        at_home.append(j)
    return rest, at_home


def _whole(pushes: list[FlowPush], item: _Item) -> tuple[list[Any], list[pa.Table]]:
    p = pushes[item.at]
    return [p.stream, p.producer, p.batch_id, p.ts, None], [item.table]


def _stage(
    partition: Partition, stage: str, items: list[tuple[list[Any], list[pa.Table]]], epoch: int, first: bool
) -> asyncio.Future:
    """Sends one stage's items (each batch's header and relations) to a partition now; the reply's future."""
    tables = [t for _, relations in items for t in relations]
    keys = [name for item, _ in items for name in (item[4] if item[4] is not None else [item[0]])]
    order, runs, joined = join_grouped(tables, keys)
    command = pr.Flow(stage, [i for i, _ in items], order, runs, epoch, first)
    return partition.send(command, joined)


def _joined(parts: list[Outcome]) -> Outcome:
    """A batch's outcome from its items' stages: a DUPLICATE as its entry found it, else all they ran."""
    unlike = [o for o in parts if o.outcome != "committed"]  # every partition holds a batch's mark: all or none
    if len(parts) == 1 or unlike:
        return (unlike or parts)[0]
    return Outcome(
        "committed",
        parts[0].ts,
        tes=sum(o.tes for o in parts),
        emitted=set().union(*(o.emitted for o in parts)),
        aborted_tes=[a for o in parts for a in o.aborted_tes],
    )
