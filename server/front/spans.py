"""Spans: a punctuation interval of state batches over several partitions, run as one coordinated command.

Under `opchain`, a batch whose state procedure's keys fall on several
partitions cannot run in a partition's local interval. Run alone, it would be
a coordinated command of its own (a round of reads, its fragments, a
two-phase commit and a log flush on every partition involved: tens of
milliseconds), during which the gate holds every later command. A span takes
that batch together with the state batches queued behind it at the gate, up
to `--interval-size`, local or not, and runs them all in three rounds:

1. every partition involved returns the rows it holds of the keys the
   span's events name (front/exchange.py `read_rows`);
2. each of them runs every batch of the span, in timestamp order, over the
   merged rows (partition/exchange.py, replicated execution), writes back
   the rows it holds, stores the outputs if it is home, and answers each
   batch's outcome, leaving its DuckDB transaction open;
3. if every partition answered and they agree on every outcome, all commit
   and log the span (SPAN, with the merged rows, so it replays alone);
   else all undo it and the batches run one by one, as without spans.

A span's outcomes are the ones the batches would have one by one, in order:
each batch sees exactly the writes of the batches before it, an aborted
batch is undone alone and rejected, and ownership is checked per batch
against the partitions that batch involves. Re-sent batches never join a
span: they take the coordinated path, which answers DUPLICATE.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from streamtx.server import protocol as pr
from streamtx.server.config import ServerConfig
from streamtx.server.front.coordinator import Coordinator
from streamtx.server.front.exchange import read_rows
from streamtx.server.front.partitions import Partitions, Restarted, checked
from streamtx.server.front.ports import Finishing
from streamtx.server.front.supervisor import Supervisor
from streamtx.server.ipc import join_runs
from streamtx.server.partition.exchange import Exchange
from streamtx.server.partitioning import HOME
from streamtx.server.protocol import Outcome


@dataclass(frozen=True)
class SpanPush:
    """A state batch that may join a span: its place in the order, and how to run it alone."""

    stream: str
    producer: str
    batch_id: int
    ts: int
    table: pa.Table
    procedure: str
    involved: tuple[int, ...]  # the partitions its TE runs on alone: its keys' owner, or home and the owners
    alone: Callable[[], Awaitable[Outcome]]


class Spans:
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

    async def run(self, pushes: list[SpanPush]) -> list[Outcome | BaseException]:
        """Each batch's outcome, in order (an exception for a batch that failed alone)."""
        last_ts = pushes[-1].ts
        try:
            outcomes = await self._span(pushes)
        except Restarted:  # front/supervisor.py: the span is done everywhere or nowhere
            await self.supervisor.recovered()
            if last_ts in self.supervisor.done:
                return [await self.front.finished_outcome(p.stream, p.producer, p.batch_id, p.ts) for p in pushes]
            again = await self.run(pushes)
            return [o if isinstance(o, BaseException) else o.first(p.ts) for o, p in zip(again, pushes, strict=True)]
        except BaseException:
            await self.coordinator.undo_everywhere(last_ts)
            raise
        if outcomes is None:
            self.counters["spans_split"] += 1
            return await one_by_one(pushes)
        self.counters["spans"] += 1
        self.counters["coordinated"] += 1
        for o in outcomes:
            self.counters[o.outcome] += 1
            for s in o.emitted:
                self.front.notify(s)
        return list(outcomes)

    async def _span(self, pushes: list[SpanPush]) -> list[Outcome] | None:
        """Runs the span's three rounds; None if the partitions did not all take it (it was undone)."""
        parts = sorted(set().union(*(p.involved for p in pushes)))
        last_ts = pushes[-1].ts
        runs, joined = join_runs([p.table for p in pushes])
        merged = await read_rows(self.partitions, parts, [(p.procedure, p.ts) for p in pushes], runs, joined)
        wire = [[p.stream, p.producer, p.batch_id, p.ts, list(p.involved)] for p in pushes]
        sends = []
        for part in parts:
            ex_head, ex_tables = Exchange(merged, frozenset(parts), part == HOME).wire()
            sends.append(self.partitions[part].send(pr.Span(wire, runs, ex_head), joined + ex_tables))
        replies = [ran for ran, _ in await asyncio.gather(*sends)]
        verdicts = [None if isinstance(r, pr.Failed) else _verdicts(r) for r in replies]
        if any(v is None or v != verdicts[0] for v in verdicts):
            await self.coordinator.decide(set(parts), False, last_ts)
            return None
        await self.coordinator.decide(set(parts), True, last_ts)
        if self.config.durability != "off":
            # durable on the home partition: recovery replays the span on every partition
            checked(await self.partitions[HOME].send(pr.Done(last_ts)))
        return replies[parts.index(HOME)].outcomes


def _verdicts(ran: pr.SpanRan) -> list[tuple[str, int, str]]:
    return [(o.outcome, o.code, o.reason) for o in ran.outcomes]


class Alone(Protocol):
    alone: Callable[[], Awaitable[Outcome]]


async def one_by_one(pushes: Sequence[Alone]) -> list[Outcome | BaseException]:
    """Each batch run alone, in order (a span or flow that did not go through as one)."""
    out: list[Outcome | BaseException] = []
    for p in pushes:
        try:
            out.append(await p.alone())
        except Exception as e:  # that batch's answer; the others go on
            out.append(e)
    return out
