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

A batch's outcome is the one it would have alone: its entry's outcome (the
entry partition answers DUPLICATE for a re-sent batch, and keeps its mark),
with the TEs and stored streams of its rest added.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamtx.server import protocol as pr
from streamtx.server.front.partitions import HOME, Restarted, checked
from streamtx.server.front.spans import one_by_one
from streamtx.server.ipc import join_grouped, split_grouped
from streamtx.server.protocol import Outcome

if TYPE_CHECKING:
    from streamtx.server.front.front import Front


STEP = 128
"""Batches per stage message: the entry partitions run step k + 1 while home runs the rest of step k.
Each step loads its keys with one query per table, so a step is worth a few dozen batches at least."""
FIRST_STEP = 32
LOOKAHEAD = 2
"""Entry steps sent ahead of the rest home runs: what a cut at home may have had run for nothing."""


@dataclass(frozen=True)
class FlowPush:
    """A batch that may join a flow: its place in the order, its keys' partition, how to run it alone."""

    stream: str
    producer: str
    batch_id: int
    ts: int
    table: pa.Table
    owner: int
    alone: Callable[[], Awaitable[Outcome]]


class Flows:
    def __init__(self, front: Front) -> None:
        self.front = front

    async def run(self, pushes: list[FlowPush]) -> list[Outcome | BaseException]:
        """Each batch's outcome, in order (an exception for a batch that failed alone)."""
        out: list[Outcome | BaseException] = []
        at = 0
        while at < len(pushes):
            outcomes, cut = await self._attempt(pushes[at:])
            if cut is None:
                out += outcomes
                break
            if cut:
                before, again = await self._attempt(pushes[at : at + cut])
                out += before if again is None else await one_by_one(pushes[at : at + cut])
            out += await one_by_one([pushes[at + cut]])
            at += cut + 1
        return out

    async def _attempt(self, pushes: list[FlowPush]) -> tuple[list[Outcome], int | None]:
        """The flow committed (its outcomes), or undone everywhere and the index of the batch that cut it."""
        front = self.front
        last_ts = pushes[-1].ts
        try:
            return await self._flow(pushes)
        except Restarted:  # front/supervisor.py: the flow is done everywhere or nowhere
            await front.supervisor.recovered()
            if last_ts in front.supervisor.done:
                return [await front.finished_outcome(p.stream, p.producer, p.batch_id, p.ts) for p in pushes], None
            outcomes, cut = await self._attempt(pushes)
            return [o.first(p.ts) for o, p in zip(outcomes, pushes, strict=False)], cut
        except BaseException:
            await front.coordinator.undo_everywhere(last_ts)
            raise

    async def _flow(self, pushes: list[FlowPush]) -> tuple[list[Outcome], int | None]:
        """Sends every step's entry stages at once; each step's rest as soon as its entries answered."""
        front = self.front
        epoch, last_ts = pushes[0].ts, pushes[-1].ts
        opened: set[int] = set()
        sent: list[asyncio.Future] = []

        def stage(part: int, name: str, items: list[tuple[list[Any], list[pa.Table]]]) -> asyncio.Future:
            first = part not in opened
            opened.add(part)
            sent.append(asyncio.ensure_future(_stage(front, part, name, items, epoch, first)))
            return sent[-1]

        steps = _steps(len(pushes))

        def entry(step: range) -> list[tuple[list[int], asyncio.Future]]:
            owners: dict[int, list[int]] = {}
            for i in step:
                if pushes[i].owner != HOME:
                    owners.setdefault(pushes[i].owner, []).append(i)
            return [(ix, stage(p, "entry", [_whole(pushes[i]) for i in ix])) for p, ix in owners.items()]

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
                    ran, tables = await reply
                    if ran.cut is not None:
                        cuts.append(idx[ran.cut])
                        continue
                    emitted = split_grouped(ran.order, ran.runs, tables)
                    for i, outcome, streams in zip(idx, ran.outcomes, ran.emitted, strict=True):
                        entries[i] = outcome, dict(zip(streams, emitted[: len(streams)], strict=True))
                        emitted = emitted[len(streams) :]
                if cuts:
                    break
                rest, at_home = _rest(pushes, step, entries)
                if rest:
                    rests.append((at_home, stage(HOME, "rest", rest)))
            homes: dict[int, Outcome] = {}
            for at_home, reply in rests:
                ran, _ = await reply
                if ran.cut is not None:
                    cuts.append(at_home[ran.cut])
                else:
                    homes.update(zip(at_home, ran.outcomes, strict=True))
        finally:  # every step answered before the decision (a failed one fails the flow)
            await asyncio.gather(*sent, return_exceptions=True)
        if cuts:
            await front.coordinator.decide(opened, False, last_ts)
            front.counters["flows_cut"] += 1
            return [], min(cuts)
        await front.coordinator.decide(opened, True, last_ts)
        if front.config.durability != "off":
            # durable on the home partition: recovery replays the flow's stages on every partition
            checked(await front.partitions[HOME].send(pr.Done(last_ts)))
        outcomes = [_joined(entries[i][0] if i in entries else None, homes.get(i)) for i in range(len(pushes))]
        front.counters["flows"] += 1
        front.counters["flow_batches"] += len(pushes)
        for o in outcomes:
            front.counters[o.outcome] += 1
            for s in o.emitted:
                front.notify(s)
        return outcomes, None


def _steps(n: int) -> list[range]:
    """The flow's batches in steps: a short first one, so that home starts early, then `STEP` each."""
    bounds = [0, *range(min(FIRST_STEP, n), n, STEP), n]
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def _cut(reply: asyncio.Future) -> bool:
    """Whether a stage that answered already cut the flow (then no further step is sent)."""
    return reply.done() and not reply.exception() and reply.result()[0].cut is not None


def _rest(
    pushes: list[FlowPush], step: range, entries: dict[int, tuple[Outcome, dict[str, pa.Table]]]
) -> tuple[list[tuple[list[Any], list[pa.Table]]], list[int]]:
    """A step's items for home: the batches it owns whole, and the rest of the others that emitted something."""
    rest: list[tuple[list[Any], list[pa.Table]]] = []
    at_home: list[int] = []
    for i in step:
        p = pushes[i]
        if p.owner == HOME:
            rest.append(_whole(p))
        else:
            outcome, streams = entries[i]
            if outcome.outcome != "committed" or not streams:
                continue
            names = sorted(streams)
            rest.append(([p.stream, p.producer, p.batch_id, p.ts, names], [streams[s] for s in names]))
        at_home.append(i)
    return rest, at_home


def _whole(p: FlowPush) -> tuple[list[Any], list[pa.Table]]:
    return [p.stream, p.producer, p.batch_id, p.ts, None], [p.table]


async def _stage(
    front: Front, part: int, stage: str, items: list[tuple[list[Any], list[pa.Table]]], epoch: int, first: bool
) -> tuple[pr.FlowRan, list[pa.Table]]:
    """Sends one stage's items (each batch's header and relations) to a partition; its reply."""
    tables = [t for _, relations in items for t in relations]
    keys = [name for item, _ in items for name in (item[4] if item[4] is not None else [item[0]])]
    order, runs, joined = join_grouped(tables, keys)
    command = pr.Flow(stage, [i for i, _ in items], order, runs, epoch, first)
    return checked(await front.partitions[part].send(command, joined))


def _joined(entry: Outcome | None, rest: Outcome | None) -> Outcome:
    """A batch's outcome from its two stages (one of them alone if it ran on home, or went no further)."""
    if entry is None or rest is None:
        outcome = entry or rest
        assert outcome is not None
        return outcome
    return Outcome(
        "committed",
        entry.ts,
        tes=entry.tes + rest.tes,
        emitted=entry.emitted | rest.emitted,
        aborted_tes=entry.aborted_tes + rest.aborted_tes,
    )
