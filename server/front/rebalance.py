"""Moving bins between partitions while the server runs, Megaphone style.

A migration is a sequence of steps. Each step moves some bins at one
logical time: the sequencer gives it timestamp `ts`, and in the same
instant the front starts routing by the step's new map, so every command
before `ts` ran under the old map and every command after it runs under
the new one. The step itself is a coordinated command (the gate keeps
everything else back while it runs): each partition takes out the rows of
the bins it gives up (partition/migration.py), the front hands them to
their new partitions, and all commit together (two-phase, like a
coordinated TE) or none does. Commands behind the step wait only for that
step, so how long the stream stalls is bounded by what one step moves:

- `all-at-once`: one step moves every bin;
- `fluid`: one bin per step;
- `batched`: `bins_per_step` bins per step.

Growing or shrinking the server (`partitions`) is a migration with one more
step: a first one that adds partitions, owning no bin (their workers were
started and recovered before it, `grow`), or a last one that retires
partitions whose bins all left (`shrink`).

Between two steps the migration waits as long as the last step took, so
the commands that queued behind it run before the next step: the stream
then stalls for one step at a time, at the cost of the migration lasting
about twice as long as its steps.

Durability: the data directory's map file names the step's new map as
pending before the step starts, and as the map once the home partition
logged the step DONE; each partition logs its part (MIGRATE) when it
commits. A crash at any point recovers to a consistent map: the step is
kept everywhere if DONE made it, and dropped everywhere otherwise, so no
row is lost or duplicated. If the workers are restarted under a step (one
died), the step is run again at the same timestamp, or found done.

A migration that stops before its target (the server stopped or crashed, a
step failed, or its caller left) is interrupted: its target and strategy
stay in the data directory (`INTENT_FILE`), Status names it after a restart
too, and `resume` finishes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from streamtx.errors import FailedPrecondition, InvalidArgument
from streamtx.files import atomic_write
from streamtx.server import log
from streamtx.server import protocol as pr
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.config import ServerConfig
from streamtx.server.front.coordinator import Coordinator
from streamtx.server.front.gate import Gate
from streamtx.server.front.partitions import Partition, Partitions, Restarted
from streamtx.server.front.sequencer import Sequencer
from streamtx.server.front.supervisor import Supervisor
from streamtx.server.launch import remove_partitions_from, spawn_worker
from streamtx.server.partition.migration import unmovable
from streamtx.server.partitioning import HOME, PartitionMap

STRATEGIES = ("all-at-once", "fluid", "batched")
DEFAULT_STRATEGY = "all-at-once"
DEFAULT_BINS_PER_STEP = 16
INTENT_FILE = "migration.json"
"""The data directory's record of the migration under way: written before its first step, removed after
its last; found at start-up, it names a migration the server stopped in (`Intent.interrupted`)."""
MAX_PAUSE_S = 1.0
"""Between two steps the migration pauses as long as the last step took (at most this): the commands
that queued behind a step run before the next one stops them again, so a step's stall does not add up."""
_FAULT = os.environ.get("STREAMTX_FAULT_FRONT_EXIT_IN_MIGRATION", "").split(":", 1)
"""Fault injection for tests: `<point>:<path>` kills the front at `point` of a step (`_fault`)."""


class Placing(Protocol):
    """What a migration reads and changes of the front: the map it routes by, and the catalog."""

    @property
    def map(self) -> PartitionMap: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def deploying(self) -> asyncio.Lock: ...

    def switch_map(self, ts: int, new: PartitionMap, added: list[Partition] | None = None) -> None: ...

    def install_command(self, partition_map: PartitionMap) -> pr.Install: ...


@dataclass(frozen=True)
class BinMove:
    """Bins `first`..`last` (inclusive) go to `partition`."""

    first: int
    last: int
    partition: int


@dataclass
class Progress:
    """Where a migration is: after `step` of `steps` (0: planned, none run yet)."""

    step: int
    steps: int
    bins_total: int
    bins_moved: int = 0
    rows_moved: int = 0
    ts: int = 0
    started: float = field(default_factory=time.monotonic)
    strategy: str = DEFAULT_STRATEGY
    step_seconds: float = 0.0
    """How long the last step held the commands behind it: from its timestamp to every partition committing."""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class Intent:
    """A migration's target map and how it moves there."""

    target: tuple[int, ...]
    strategy: str
    bins_per_step: int
    partitions: int
    """How many partitions there are once it is done (only `to_partitions` changes it)."""

    def bins_left(self, current: PartitionMap) -> int:
        return bins_apart(current.owner, self.target)

    def unfinished(self, current: PartitionMap) -> bool:
        return bool(self.bins_left(current)) or self.partitions != current.partitions

    def save(self, data_dir: Path) -> None:
        record = {
            "target": list(self.target),
            "strategy": self.strategy,
            "bins_per_step": self.bins_per_step,
            "partitions": self.partitions,
        }
        atomic_write(data_dir / INTENT_FILE, json.dumps(record))

    @staticmethod
    def clear(data_dir: Path) -> None:
        (data_dir / INTENT_FILE).unlink(missing_ok=True)

    @classmethod
    def interrupted(cls, data_dir: Path, current: PartitionMap) -> Intent | None:
        """The migration the server stopped in, if it had bins left to move (else its record goes)."""
        path = data_dir / INTENT_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        found = cls(
            tuple(int(o) for o in data["target"]),
            str(data["strategy"]),
            int(data["bins_per_step"]),
            int(data.get("partitions", current.partitions)),
        )
        if len(found.target) != current.bins or not found.unfinished(current):
            cls.clear(data_dir)  # it finished; the crash came before its record went
            return None
        return found


def target_owner(
    current: PartitionMap, moves: list[BinMove], even: bool, partitions: int | None = None
) -> tuple[int, ...]:
    """The owner of every bin once the migration is done; bad bins or partitions are InvalidArgument."""
    if bool(moves) + even + (partitions is not None) != 1:
        raise InvalidArgument("rebalance: give one of bin moves, even or a partition count")
    if partitions is not None:
        if not 1 <= partitions <= current.bins:
            raise InvalidArgument(
                f"rebalance: {partitions} partitions: must be 1..{current.bins} (every partition owns a bin)"
            )
        return even_owner(current, partitions)
    if even:
        return even_owner(current)
    owner = list(current.owner)
    for m in moves:
        if not 0 <= m.first <= m.last < current.bins:
            raise InvalidArgument(f"rebalance: bins {m.first}..{m.last}: bins are 0..{current.bins - 1}")
        if not 0 <= m.partition < current.partitions:
            raise InvalidArgument(
                f"rebalance: partition {m.partition}: the server has partitions 0..{current.partitions - 1}"
            )
        owner[m.first : m.last + 1] = [m.partition] * (m.last - m.first + 1)
    return tuple(owner)


def even_owner(current: PartitionMap, partitions: int | None = None) -> tuple[int, ...]:
    """As many bins on every partition as can be (they differ by one at most), moving as few as possible;
    over `partitions` partitions if given (the bins of those past it move too)."""
    parts, bins = partitions or current.partitions, current.bins
    owner = list(current.owner)
    held = {p: [b for b in range(bins) if owner[b] == p] for p in range(parts)}
    by_size = sorted(range(parts), key=lambda p: (-len(held[p]), p))
    quota = {p: bins // parts + (1 if i < bins % parts else 0) for i, p in enumerate(by_size)}
    spare = [b for p in range(parts) for b in held[p][quota[p] :]] + [b for b in range(bins) if owner[b] >= parts]
    for p in range(parts):
        while len(held[p]) < quota[p]:
            b = spare.pop(0)
            owner[b] = p
            held[p].append(b)
    return tuple(owner)


def plan(current: PartitionMap, target: tuple[int, ...], strategy: str, bins_per_step: int) -> list[PartitionMap]:
    """The maps the steps move to, in order; the last is `target`."""
    if strategy not in STRATEGIES:
        raise InvalidArgument(f"rebalance: strategy {strategy!r}: must be one of {', '.join(STRATEGIES)}")
    if bins_per_step < 1:
        raise InvalidArgument(f"rebalance: bins per step {bins_per_step}: must be at least 1")
    moving = [b for b in range(current.bins) if current.owner[b] != target[b]]
    size = {"all-at-once": max(len(moving), 1), "fluid": 1, "batched": bins_per_step}[strategy]
    maps = []
    owner = list(current.owner)
    for i in range(0, len(moving), size):
        for b in moving[i : i + size]:
            owner[b] = target[b]
        maps.append(PartitionMap(current.bins, tuple(owner)))
    return maps


class Rebalancer:
    def __init__(
        self,
        front: Placing,
        partitions: Partitions,
        gate: Gate,
        sequencer: Sequencer,
        supervisor: Supervisor,
        coordinator: Coordinator,
        config: ServerConfig,
    ) -> None:
        self.front = front
        self.partitions = partitions
        self.gate = gate
        self.sequencer = sequencer
        self.supervisor = supervisor
        self.coordinator = coordinator
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.durable = config.durability != "off"
        self.running: Progress | None = None  # the migration in flight (Status shows it)
        self.stepper: Callable[[PartitionMap, PartitionMap | int], Awaitable[tuple[int, int, float]]] = (
            lambda _before, change: self.resize_or_step(change)
        )
        """How a step from the map `before` runs: here; in cluster mode through the log, on every host
        (cluster/replica.py)."""
        self.interrupted: Intent | None = None  # the one that stopped before its target (Status shows it)
        self._lock = asyncio.Lock()

    def find_interrupted(self) -> None:
        """At start-up: the migration the server stopped in, if any, is reported and can be resumed."""
        self.interrupted = Intent.interrupted(self.data_dir, self.front.map)
        if self.interrupted is not None:
            left = self.interrupted.bins_left(self.front.map)
            log.event(
                "rebalance_interrupted",
                f"a migration ({self.interrupted.strategy}) stopped with {left} bin(s) still to move; "
                "`streamtx rebalance --resume` finishes it",
                level="warning",
                bins_left=left,
            )

    def intent(
        self,
        moves: list[BinMove],
        even: bool,
        partitions: int | None,
        strategy: str | None,
        bins_per_step: int | None,
        resume: bool,
    ) -> Intent:
        """Where a request moves the bins to, and how; its mistakes are InvalidArgument or FailedPrecondition."""
        if not resume:
            target = target_owner(self.front.map, moves, even, partitions)
            count = self.front.map.partitions if partitions is None else partitions
            return Intent(target, strategy or DEFAULT_STRATEGY, bins_per_step or DEFAULT_BINS_PER_STEP, count)
        if moves or even or partitions is not None:
            raise InvalidArgument(
                "rebalance: resume takes no bin moves, even or partition count: it finishes the interrupted one"
            )
        found = self.interrupted
        if found is None:
            raise FailedPrecondition("rebalance: no migration was interrupted; there is nothing to resume")
        return Intent(found.target, strategy or found.strategy, bins_per_step or found.bins_per_step, found.partitions)

    async def run(
        self,
        moves: list[BinMove],
        even: bool,
        strategy: str | None = None,
        bins_per_step: int | None = None,
        resume: bool = False,
        partitions: int | None = None,
    ) -> AsyncIterator[Progress]:
        """Runs a migration step by step; yields its progress before the first step and after each.

        `partitions`: grow or shrink to that many, bins spread evenly. A grow
        adds the partitions (owning no bin) in a first step, a shrink retires
        them (owning none any more) in a last one. `strategy` and
        `bins_per_step` default to all-at-once and 16, or to the interrupted
        migration's when resuming.
        """
        current = self.front.map
        intent = self.intent(moves, even, partitions, strategy, bins_per_step, resume)
        maps = plan(current, intent.target, intent.strategy, intent.bins_per_step)
        grow, shrink = intent.partitions > current.partitions, intent.partitions < current.partitions
        steps: list[PartitionMap | int] = [
            *([intent.partitions] if grow else []),
            *maps,
            *([intent.partitions] if shrink else []),
        ]
        reason = unmovable(self.front.catalog)
        if reason is not None and steps:
            raise FailedPrecondition(f"rebalance: {reason}")
        if self._lock.locked():
            raise FailedPrecondition("rebalance: a migration is running already; wait for it to end")
        async with self._lock:
            total = intent.bins_left(current)
            progress = Progress(0, len(steps), total, strategy=intent.strategy)
            self.running = progress
            finished = not steps
            if steps:  # it replaces an interrupted one
                await asyncio.to_thread(intent.save, self.data_dir)
                self.interrupted = None
            try:
                yield progress
                for i, new in enumerate(steps):
                    before = self.front.map
                    change = new if isinstance(new, int) else before.moved(new.owner)
                    done = await self.stepper(before, change)
                    rows, ts, progress.step_seconds = done
                    if i + 1 < len(steps):  # what queued behind the step runs before the next one
                        await asyncio.sleep(min(progress.step_seconds, MAX_PAUSE_S))
                    progress.step += 1
                    progress.bins_moved += bins_apart(before.owner, self.front.map.owner)
                    progress.rows_moved += rows
                    progress.ts = ts
                    finished = i + 1 == len(steps)
                    if finished:
                        await asyncio.to_thread(Intent.clear, self.data_dir)
                    yield progress
            finally:
                self.running = None
                if not finished:
                    self.interrupted = intent

    async def resize_or_step(self, change: PartitionMap | int) -> tuple[int, int, float]:
        """One step of a migration: to another partition count (`grow`, `shrink`), or to a new map (`step`)."""
        if isinstance(change, int):
            return await (self.grow(change) if change > self.front.map.partitions else self.shrink(change))
        return await self.step(change)

    async def grow(self, partitions: int) -> tuple[int, int, float]:
        """Adds partitions up to `partitions`, owning no bin yet, in one step; returns `step`'s result.

        Their workers start (in directories emptied first: one a step that
        did not finish left), recover, empty, and install the catalog before
        the step (a deploy waits until it is done); the step gives them the
        replicated tables' rows, and from its timestamp on they take every
        command sent to all partitions.
        """
        first = self.front.map.partitions
        await asyncio.to_thread(remove_partitions_from, self.config, first)
        added = [Partition(i) for i in range(first, partitions)]
        async with self.front.deploying:
            try:
                install = self.front.install_command(self.front.map.resized(partitions))
                for p in added:
                    await p.attach(await asyncio.to_thread(spawn_worker, p.index, self.config))
                    await p.request(pr.RecoveryInfo())
                    await p.request(pr.Recover(None, []))
                    await p.request(install)
            except BaseException:
                await asyncio.gather(*(p.stop() for p in added), return_exceptions=True)
                raise
            await self._serving()
            return await self.step(self.front.map, added)

    async def shrink(self, partitions: int) -> tuple[int, int, float]:
        """Retires the partitions from `partitions` on, which own no bin any more, in one step; returns
        `step`'s result.

        Their exactly-once marks, taken batch ids, rejections and retained
        stream tuples go to the home partition in the step (a batch they
        took stays a re-send, subscribers still read what they stored); once
        it is done their workers stop and their directories go.
        """
        return await self.step(self.front.map.resized(partitions))

    async def step(self, new: PartitionMap, added: list[Partition] | None = None) -> tuple[int, int, float]:
        """One step at the next timestamp (adding the `added` partitions); returns the rows it moved, its
        timestamp, and how long it held the commands behind it (from its timestamp to its end)."""
        # from here until the gate takes the step, nothing awaits: commands after `ts` route by `new`, and
        # every partition gets the step after the commands before it (an fsync of a small file meanwhile)
        ts = self.sequencer.next_ts()
        started = time.monotonic()
        if added:
            new = new.resized(new.partitions + len(added), ts)
        self.front.map.save(self.data_dir, (ts, new))
        _fault("pending")
        self.front.switch_map(ts, new, added)
        rows = await self.gate.run_coordinated(lambda: self._attempts(ts, new))
        return rows, ts, time.monotonic() - started

    async def _attempts(self, ts: int, new: PartitionMap) -> int:
        """The step, run again at the same timestamp if the workers were restarted under it (unless DONE)."""
        while True:
            try:
                rows = await self._run(ts, new)
            except Restarted:
                await self.supervisor.recovered()
                if ts not in self.supervisor.done:
                    continue
                await asyncio.to_thread(new.save, self.data_dir)
                rows = 0
            if len(self.partitions) > new.partitions:  # retired: nothing after the step reaches them
                await self._serving()
                await self.partitions.retire(new.partitions)
            return rows

    async def _serving(self) -> None:
        """Returns once no worker restart is under way: a restart starts every worker the front lists,
        which must not change meanwhile (the caller then adds or retires some before it next awaits)."""
        while not self.supervisor.serving:
            await self.supervisor.recovered()

    async def _run(self, ts: int, new: PartitionMap) -> int:
        every = self.partitions.all
        try:
            replies = await asyncio.gather(*(p.request(pr.Migrate(ts, new.to_json())) for p in every))
            arriving: dict[int, tuple[list[str], list[pa.Table]]] = {}
            moved = 0
            for leaving, tables in replies:
                for (dest, table), rows in zip(leaving.parts, tables, strict=True):
                    names, relations = arriving.setdefault(dest, ([], []))
                    names.append(table)
                    relations.append(rows)
                    moved += rows.num_rows
            await asyncio.gather(
                *(
                    self.partitions[p].request(pr.MigrateIn(ts, tuple(names)), relations)
                    for p, (names, relations) in sorted(arriving.items())
                )
            )
            _fault("prepared")
            await self.coordinator.decide({p.index for p in every}, True, ts)
        except Restarted:
            raise
        except BaseException as e:
            # commands after `ts` wait at the gate routed by the new map, which no partition took: only a
            # recovery (the step not DONE, so dropped everywhere) brings partitions and map together again
            await self.coordinator.undo_everywhere(ts)
            self.supervisor.give_up(f"migration step at timestamp {ts} failed: {e}")
            raise
        _fault("decided")
        if self.durable:
            await self.partitions[HOME].request(pr.Done(ts))
        _fault("done")
        await asyncio.to_thread(new.save, self.data_dir)
        return moved


def bins_apart(owner: tuple[int, ...], other: tuple[int, ...]) -> int:
    """How many bins the two maps give to different partitions."""
    return sum(a != b for a, b in zip(owner, other, strict=True))


def bins_per_partition(current: PartitionMap) -> list[int]:
    """How many bins each partition owns (Status)."""
    counts = [0] * current.partitions
    for p in current.owner:
        counts[p] += 1
    return counts


def _fault(point: str) -> None:
    """The front dies here (SIGKILL-like) if told to by `STREAMTX_FAULT_FRONT_EXIT_IN_MIGRATION`, once:
    it creates the named file, and does nothing while it exists."""
    if len(_FAULT) == 2 and _FAULT[0] == point and not os.path.exists(_FAULT[1]):
        Path(_FAULT[1]).write_text(f"front died at {point}\n")
        os._exit(9)
