"""Supervision of the partition workers: a dead worker comes back by itself.

When a worker dies (killed, out of memory, its command log failed), the front
restarts every worker and recovers them exactly as at start-up: the newest
checkpoint all partitions completed, then each one's command log, with
coordinated commands kept only if the home partition logged them DONE.
Restarting all of them, not only the dead one, keeps the partitions at one
consistent cut of the command order: a coordinated command cut short is
undone everywhere, never half-kept. The live workers are stopped in order
first (their queues run, their logs flushed, their replies read), so little
is left to do again.

What a client sees: nothing fails. Requests already sent wait (the
partitions hold them, front/partitions.py) and are sent again once the new
workers recovered; a worker tells apart what its predecessor applied
durably (answered with the outcome it had then) from what it must run. A
command of several rounds (coordinated, span) in flight starts over, or is
found done. New requests wait at the gate meanwhile. Health says NOT_SERVING
from the death to the end of the replay.

Restarts are limited (`--max-restarts` in `--restart-window`): a worker that
keeps dying stops the server with the reason, as does any death under
`--durability off`, where no log holds the partition's state.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Awaitable, Callable

from streamtx.errors import StreamTxError, Unavailable
from streamtx.server import log
from streamtx.server.config import ServerConfig
from streamtx.server.front.gate import Gate
from streamtx.server.front.partitions import Partition, Partitions
from streamtx.server.launch import spawn_worker


class Supervisor:
    def __init__(
        self,
        partitions: Partitions,
        counters: collections.Counter[str],
        gate: Gate,
        config: ServerConfig,
        recover: Callable[[], Awaitable[set[int]]],
    ) -> None:
        self.partitions = partitions
        self.counters = counters
        self.gate = gate  # held while the workers are restarted: new requests wait there
        self.config = config
        self.recover = recover  # Front.recover: new workers to the logs' state; the commands found done
        self.restarts: list[float] = []  # monotonic times of the restarts in the window
        self.done: set[int] = set()  # coordinated commands the home partition logged DONE, as last recovered
        self.failure: str | None = None  # why the server gave up on its partitions
        self.on_health: Callable[[bool], None] = lambda serving: None
        self.on_fatal: Callable[[str], None] = lambda reason: None
        self._recovered = asyncio.Event()
        self._recovered.set()
        self._task: asyncio.Task | None = None

    @property
    def serving(self) -> bool:
        return self._recovered.is_set() and self.failure is None

    def watch(self, done: set[int]) -> None:
        """From now on a dying worker is restarted (called once the partitions are up)."""
        self.done = done
        for p in self.partitions.all:
            p.hold_on_exit = True
            p.on_death = self._died

    def adopt(self, added: list[Partition]) -> None:
        """Partitions added while the server runs are restarted like the others."""
        for p in added:
            p.hold_on_exit = True
            p.on_death = self._died

    def unwatch(self) -> None:
        """Deaths from now on fail what waits on the partition (the server is stopping)."""
        if self._task is not None:
            self._task.cancel()
        for p in self.partitions.all:
            p.hold_on_exit = False
            p.on_death = None

    async def recovered(self) -> None:
        """Returns once the partitions serve again; raises Unavailable if the server gave up on them."""
        await self._recovered.wait()
        if self.failure is not None:
            raise Unavailable(self.failure)

    def _died(self, dead: Partition) -> None:
        if self._task is not None and not self._task.done():
            return  # a restart is under way: it stops (or restarts) every worker anyway
        self._recovered.clear()
        self.on_health(False)
        self._task = asyncio.create_task(self._restart(dead.error or f"partition {dead.index} died"))

    async def _restart(self, death: str) -> None:
        self.gate.hold()
        cause = death
        try:
            for attempt in itertools.count(1):
                refusal = self._refusal(cause)
                if refusal is not None:
                    self.give_up(refusal)
                    return
                self.restarts.append(time.monotonic())
                self.counters["restarts"] += 1
                log.event("restart", f"{cause}; restarting the partition workers", level="warning", cause=cause)
                try:
                    await self._bring_up()
                except (StreamTxError, OSError) as e:
                    cause = f"{death}; recovery attempt {attempt} failed: {e}"
                    await asyncio.sleep(0.2 * len(self.restarts))
                    continue
                break
            replayed = sum(p.replay() for p in self.partitions.all)
            self.watch(self.done)
            log.event("recovered", f"partitions recovered; {replayed} request(s) sent again", replayed=replayed)
        finally:
            self._recovered.set()
            self.gate.resume()
        if self.failure is None:
            self.on_health(True)

    async def _bring_up(self) -> None:
        """Every worker stopped, started anew and recovered as at start-up."""
        parts = self.partitions.all
        for p in parts:
            p.on_death = None  # a death during recovery fails the recovery (partitions.py `hold`)
        await asyncio.gather(*(p.stop() for p in parts))
        spawned = [spawn_worker(p.index, self.config) for p in parts]
        await self.partitions.attach(spawned)
        self.done = await self.recover()
        # a worker that died after answering its last recovery request failed nothing, and its death,
        # seen while no one watched, restarts nothing: replayed requests would wait on it for ever
        lost = [p.index for p in parts if not p.alive]
        if lost:
            raise Unavailable(f"partition {lost[0]} died during recovery")

    def _refusal(self, cause: str) -> str | None:
        config = self.config
        if config.durability == "off":
            return f"{cause}; with --durability off no log holds its state, so the server stops"
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < config.restart_window]
        if len(self.restarts) >= config.max_restarts:
            return (
                f"{cause}; the partition workers were restarted {len(self.restarts)} times in the last "
                f"{config.restart_window:g} s (--max-restarts {config.max_restarts}), so the server stops"
            )
        return None

    def give_up(self, reason: str) -> None:
        """Stops serving for good: the partitions cannot be kept consistent (the server then exits)."""
        self.failure = reason
        log.event("stopped", reason, level="error")
        error = Unavailable(reason)
        for p in self.partitions.all:
            p.hold_on_exit = False
            p.on_death = None
            p.fail_all(error)
        self.on_health(False)
        self.on_fatal(reason)
