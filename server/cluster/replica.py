"""A host of a cluster: runs the input log's entries in log order, and answers the ones it appended.

Every host runs every entry of the log (cluster/inputlog.py) through the
same code a standalone server runs a request with, in the same order, so
every host's tables are the same at the same log position: the scheduler is
deterministic, and a re-sent batch is DUPLICATE wherever it is read, because
the dedup marks are part of the state. Timestamps follow the log too: an
entry at position `seq` takes its timestamps from `seq << TS_SHIFT` on.

A host remembers how far it has applied the log (`POSITION_FILE`, written
every `SAVE_EVERY` seconds, only up to entries whose outcomes are durable
here). After a crash it recovers its partitions from its own command log and
reads the log again from that position: a push it had applied since is
DUPLICATE, a call or migration step is skipped (its recovered state reaches
the entry's timestamps), what its crash lost is taken anew. Each checkpoint
is shared and the log trimmed below it (cluster/snapshots.py); a host that
finds the log trimmed past its position while it runs stops and starts
again from the newest snapshot.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamtx.errors import FAULTS, FailedPrecondition, StreamTxError, Unavailable
from streamtx.server import log
from streamtx.server.cluster.digest import differences, digest
from streamtx.server.cluster.inputlog import Entry, Heard, InputLog, LogGap
from streamtx.server.cluster.snapshots import (
    TRIM_DECIDE_S,
    SnapshotInfo,
    newest_of,
    pack,
    save_position,
    saved_position,
    trim_point,
)
from streamtx.server.front.gate import forward
from streamtx.server.partitioning import PartitionMap
from streamtx.v1 import streamtx_pb2 as pb
from streamtx.wire import encode_rowdata, ipc_to_table

TS_SHIFT = 20
"""An entry's timestamps start at its log position << TS_SHIFT: room for 2**20 batches per entry."""
MAX_OUTSTANDING = 1024
"""Entries started and not yet answered; reading the log waits beyond it."""
SAVE_EVERY = 0.5
VERIFY_WAIT = 30.0
"""Seconds a host waits for the others' digests at a `verify` entry before comparing what came."""
ANSWER_TIMEOUT = 30.0
"""Seconds a request waits for its answer (the log taking it, this host running it); past that its caller gets
UNAVAILABLE and may re-send (DUPLICATE if it was taken after all)."""


class Replica:
    """The log reader of one host, and the requests of this host's clients that wait for it."""

    def __init__(self, service: Any, inputlog: InputLog, host: str, data_dir: Path) -> None:
        self.service = service  # server/front/service.py StreamTxService: runs an entry as a request
        self.front = service.front
        self.log = inputlog
        self.host = host
        self.data_dir = Path(data_dir)
        self.applied = saved_position(self.data_dir, inputlog.stream_name, inputlog.created)
        self._saved = self.applied  # as on disk
        self._saving = threading.Lock()
        self.read = self.applied  # the last entry started
        self.started_at = time.time()
        self._incarnation = secrets.token_hex(4)
        self._numbers = itertools.count(1)
        self._waiting: dict[str, asyncio.Future] = {}
        self._started: collections.deque[tuple[int, asyncio.Future]] = collections.deque()
        self._fault: BaseException | None = None
        self._checking: set[asyncio.Task] = set()
        self._sharing: asyncio.Task | None = None
        self._covered = 0  # the position of the newest snapshot known to hold what this host applied up to it
        self._cut = 0  # the position of this host's last checkpoint cut
        self.failure: str | None = None  # why this host cannot go on with the log
        self.behind = False  # the log was trimmed past it: it can go on only from a snapshot
        self.heard = Heard()  # fed by `InputLog.hear_hosts`, run beside `run`
        self.on_fatal: Callable[[], None] = lambda: None
        inputlog.on_disconnect.append(self._appends_lost)
        self.front.on_checkpoint.append(self._checkpointed)
        self.front.rebalancer.stepper = self.submit_step
        self.front.plans_migrations = self.plans

    # ------------------------------------------------------------ requests
    async def submit(self, kind: str, request: Any) -> asyncio.Future:
        """Appends a request to the log; the future is its answer once this host has run it."""
        return await self._submit(kind, request.SerializeToString())

    async def _submit(self, kind: str, body: bytes) -> asyncio.Future:
        origin = f"{self.host}:{self._incarnation}:{next(self._numbers)}"
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()
        self._waiting[origin] = answer
        try:
            taken = await self.log.append(kind, body, origin)
        except BaseException:
            self._waiting.pop(origin, None)
            raise
        timer = loop.call_later(ANSWER_TIMEOUT, self._give_up, origin)
        answer.add_done_callback(lambda _: timer.cancel())
        taken.add_done_callback(lambda t: self._refused(origin, t))
        return answer

    async def submit_push(self, request: pb.PushRequest) -> asyncio.Future:
        """A push message through the log, in as many consecutive entries as NATS's max_payload needs (split
        between its batches); the future is every batch's ack, in order."""
        body = request.SerializeToString()
        if len(body) <= self.log.max_entry_bytes:
            return await self._submit("push", body)
        answers = [await self.submit("push", part) for part in _fitting(request, self.log.max_entry_bytes)]

        async def joined() -> list[pb.PushAck]:
            return [ack for acks in await asyncio.gather(*answers) for ack in acks]

        return asyncio.ensure_future(joined())

    def plans(self) -> bool:
        """Whether this host plans the cluster's automatic migrations: the first by name of the hosts it has
        heard lately. Every host measures the same load (it runs every entry); should two plan at once, as
        they may while hosts come and go, the step planned on a map the other's changed is refused on every
        host alike."""
        live = self.heard.live()
        return self.host in live and self.host == min(live)

    async def submit_step(self, before: PartitionMap, change: PartitionMap | int) -> tuple[int, int, float]:
        """A migration step through the log: every host moves the same bins (or grows or shrinks to the same
        partition count) at the same position. Returns, once this host ran it, the rows it moved, its timestamp
        and how long it held the commands behind it."""
        to = {"partitions": change} if isinstance(change, int) else {"to": change.to_json()}
        body = json.dumps({"from": before.to_json(), **to}).encode()
        return await (await self._submit("migrate", body))

    def _refused(self, origin: str, taken: asyncio.Future) -> None:
        error = None if taken.cancelled() else taken.exception()
        if error is None and not taken.cancelled():
            return
        answer = self._waiting.pop(origin, None)
        if answer is not None and not answer.done():
            answer.set_exception(Unavailable(f"cluster log {self.log.stream_name}: the append failed: {error}"))

    def _appends_lost(self) -> None:
        """The connection broke: appends written to it may never reach the log, while later ones will.

        Every request still waiting is answered UNAVAILABLE now, so that no
        client hears of a later batch of its own first: one that lands behind
        a lost one is refused there as early (its id left free), and the
        client, told UNAVAILABLE, re-sends both in order (a batch that did land
        is DUPLICATE then).
        """
        waiting, self._waiting = self._waiting, {}
        for answer in waiting.values():
            if not answer.done():
                answer.set_exception(
                    Unavailable(
                        f"cluster log {self.log.stream_name}: the connection to NATS broke before the log took "
                        "this; re-send with the same batch ids"
                    )
                )

    def _give_up(self, origin: str) -> None:
        answer = self._waiting.pop(origin, None)
        if answer is not None and not answer.done():
            answer.set_exception(
                Unavailable(
                    f"cluster log {self.log.stream_name}: no answer within {ANSWER_TIMEOUT:g} s (host {self.host} "
                    f"has applied the log to {self.applied}); re-send with the same batch id: a batch the log "
                    "took meanwhile is answered DUPLICATE"
                )
            )

    # ---------------------------------------------------------------- reading
    async def run(self) -> None:
        """Reads and runs the log for as long as the server serves; after a fault, again from `applied`."""
        while True:
            try:
                async for entry in self.log.entries(self.applied + 1):
                    async with self.front.boundary:  # a checkpoint's cut falls between two entries
                        await self._apply(entry)
                    if self._fault is not None:
                        break
            except asyncio.CancelledError:
                raise
            except LogGap as e:
                self._fall_behind(str(e))
                return
            except Exception as e:  # the connection to NATS, which reconnects by itself
                log.event("cluster_read_failed", f"reading the cluster log failed: {e}", level="warning")
                await asyncio.sleep(1.0)
            await self._drain()
            if self._fault is not None:
                log.event(
                    "cluster_resume",
                    f"an entry failed on this host ({self._fault}); running the log again from {self.applied + 1} "
                    "once the partitions serve",
                    level="warning",
                )
                while not self.front.supervisor.serving:
                    await asyncio.sleep(0.1)
                self._fault = None
                self.read = self.applied

    async def _apply(self, entry: Entry) -> None:
        if entry.seq <= self.read:  # the ordered consumer restarted behind us
            return
        if entry.seq > self.read + 1:
            raise LogGap(
                f"the cluster log no longer holds entries {self.read + 1} to {entry.seq - 1} (trimmed while this "
                "host was not heard from); it starts again from the newest snapshot"
            )
        self.read = entry.seq
        self.front.sequencer.skip_to(entry.seq << TS_SHIFT)
        if entry.kind == "push":
            outcome = self._push(pb.PushRequest.FromString(entry.body))
        elif entry.kind == "verify":
            await self._drain()
            outcome = asyncio.ensure_future(self._verify(entry.seq))
            await asyncio.wait([outcome])
        elif entry.kind in ("call", "migrate") and self._ran_before(entry.seq):
            outcome = asyncio.get_running_loop().create_future()  # nothing deduplicates these: not run twice
            outcome.set_result(None)
        elif entry.kind == "migrate":
            await self._drain()  # it runs alone, at the same timestamp everywhere
            outcome = asyncio.ensure_future(self._step(entry.seq, entry.body))
            await asyncio.wait([outcome])
        elif entry.kind in ("call", "deploy"):
            await self._drain()  # every entry before it has its outcome: it runs alone, at the same point everywhere
            request = (pb.CallRequest if entry.kind == "call" else pb.DeployRequest).FromString(entry.body)
            outcome = asyncio.ensure_future(self.service.run_logged(entry.kind, request))
            await asyncio.wait([outcome])
        else:
            outcome = asyncio.get_running_loop().create_future()
            outcome.set_exception(FailedPrecondition(f"cluster log entry {entry.seq}: unknown kind {entry.kind!r}"))
            log.event("cluster_entry_unknown", f"entry {entry.seq} of kind {entry.kind!r} skipped", level="error")
        self._started.append((entry.seq, outcome))
        outcome.add_done_callback(lambda _: self._settle())
        answer = self._waiting.pop(entry.origin, None)
        if answer is not None:
            forward(outcome, answer)
        if len(self._started) > MAX_OUTSTANDING:
            await asyncio.wait([self._started[0][1]])

    def _ran_before(self, seq: int) -> bool:
        """Whether the entry at `seq`, read again after a restart or a worker's fault, ran here before: the
        recovered state reaches its timestamps. A call or a migration step runs alone, and the entry after it
        starts once it is durable; recovery keeps a coordinated one only if it finished on every partition.
        Pushes need no such test: their dedup marks are part of the state."""
        return self.front.recovered_ts >= seq << TS_SHIFT

    async def _step(self, seq: int, body: bytes) -> tuple[int, int, float]:
        """A migration step at the entry's position. A step planned on another map than the one it finds
        (another migration's step came first) changes nothing, on every host alike."""
        step = json.loads(body)
        before = PartitionMap.from_json(step["from"])
        change = step["partitions"] if "partitions" in step else PartitionMap.from_json(step["to"])
        if self.front.map != before:
            raise FailedPrecondition(
                f"rebalance: cluster log entry {seq}: the partition map changed since this step was planned (another "
                "migration's step came first); run the rebalance again"
            )
        return await self.front.rebalancer.resize_or_step(change)

    async def _verify(self, seq: int) -> dict[str, Any]:
        """This host's state digest at a `verify` entry, put where every host and `cluster verify` read it."""
        record = {**await digest(self.front), "host": self.host, "time": time.time()}
        await self.log.report(seq, self.host, record)
        self._checking.add(asyncio.get_running_loop().create_task(self._compare(seq, record)))
        return record

    async def _compare(self, seq: int, own: dict[str, Any]) -> None:
        """Waits for the other hosts' digests at `seq` (those heard from lately) and says loudly if any differ."""
        try:
            reports = await self.log.reports(seq, VERIFY_WAIT)
            different = differences({**reports, self.host: own})
            if different:
                log.event(
                    "cluster_diverged",
                    f"hosts hold different states at log position {seq}: " + "; ".join(different),
                    level="error",
                    position=seq,
                )
            else:
                log.event("cluster_verified", f"{len(reports)} host(s) hold the same state at log position {seq}")
        except Exception as e:  # NATS away: `streamtx cluster verify` reads the digests later
            log.event("cluster_verify_failed", f"comparing states at {seq}: {e}", level="warning")
        finally:
            self._checking.discard(asyncio.current_task())  # type: ignore[arg-type]

    def _push(self, request: pb.PushRequest) -> asyncio.Future:
        try:
            message = self.service.start_message(request)
        except Exception as e:  # the request's mistake (or a bug): the same answer on every host, which go on
            if not isinstance(e, StreamTxError):
                log.event("cluster_entry_failed", f"a push from the log failed: {type(e).__name__}: {e}", level="error")
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(e)
            return failed
        return asyncio.ensure_future(_acks(message))

    def _settle(self) -> None:
        """Moves `applied` over the entries answered without a fault; a fault stops it there."""
        started = self._started
        while started and started[0][1].done() and self._fault is None:
            seq, outcome = started[0]
            error = None if outcome.cancelled() else outcome.exception()
            if isinstance(error, FAULTS) or outcome.cancelled():
                self._fault = error or Unavailable("cancelled")
                return
            started.popleft()
            self.applied = seq
            self.front.counters["cluster_applied"] = seq  # Status and metrics: how far this host has run the log

    async def _drain(self) -> None:
        """Waits until every entry started has its outcome (or one failed)."""
        pending = [o for _, o in self._started if not o.done()]
        if pending:
            await asyncio.wait(pending)
        if self._fault is not None:
            self._started.clear()

    # ---------------------------------------------------------------- position
    def save(self) -> None:
        """Writes `applied` (durably: a crash leaves the old or the new one); from any thread."""
        with self._saving:
            applied = self.applied
            if applied == self._saved:
                return
            save_position(self.data_dir, self.log.stream_name, self.log.created, self.host, applied)
            self._saved = applied

    # ---------------------------------------------------------------- snapshots
    def _checkpointed(self, ts: int, written: asyncio.Future[bool]) -> None:
        """At a checkpoint's cut, between two entries: once written, share it and trim the log (one share at a
        time; a checkpoint cut while one is shared, or holding no entry past the newest snapshot, is not)."""
        if self._sharing is None or self._sharing.done():
            before, self._cut = self._cut, self.read
            if self.read > self._covered:
                self._sharing = asyncio.get_running_loop().create_task(self._share(ts, self.read, written, before))
            elif self._covered:  # nothing new to share: the last trim may have been skipped
                self._sharing = asyncio.get_running_loop().create_task(self._trim(self._covered))

    async def _share(self, ts: int, position: int, written: asyncio.Future[bool], before: int) -> None:
        """`position`: the last entry admitted at the cut. After a restart it is not `ts >> TS_SHIFT`: an entry
        past the saved position may be in the state only in part, until it is run again.

        One copy of the state in NATS is enough: if another host shared a snapshot since this host's previous
        cut (`before`), this one is not shared, and the log is trimmed below that one."""
        partitions = len(self.front.partitions)
        try:
            newest = newest_of(await self.log.snapshots(), self.log.created)
        except Exception:  # NATS away: sharing fails too, and is tried again at the next checkpoint
            newest = None
        if newest is not None and newest.host != self.host and newest.partitions == partitions:
            if newest.position > before:
                self._covered = max(self._covered, min(newest.position, self.applied))
                self.front.counters["cluster_snapshots_left_to_others"] += 1
                await self._trim(newest.position)
                return
        if not await written:
            return
        try:
            path = await asyncio.to_thread(pack, self.data_dir, ts, partitions)
        except FileNotFoundError:  # a newer checkpoint replaced it already: that one is shared next
            return
        try:
            info = SnapshotInfo(self.host, position, ts, partitions, self.log.created, time.time(), path.stat().st_size)
            await self.log.put_snapshot(info, path)
            self._covered = position
            self.front.counters["cluster_snapshots"] += 1
            log.event(
                "cluster_snapshot_shared",
                f"checkpoint at log position {position} shared ({info.bytes:,} bytes)",
                position=position,
            )
        except Exception as e:  # NATS away: the next checkpoint tries again
            log.event("cluster_snapshot_failed", f"sharing the checkpoint at {position}: {e}", level="warning")
            return
        finally:
            path.unlink(missing_ok=True)
        await self._trim(position)

    async def _trim(self, position: int) -> None:
        """Drops the log up to what the snapshot at `position` holds and every live host applied; skipped (and
        tried again at the next checkpoint) if reading the hosts' positions took TRIM_DECIDE_S or more, or this
        host has not heard its own announcements lately."""
        try:
            first = await self.log.first()
            asked = time.monotonic()
            hosts, live = await self.log.hosts(), self.heard.live()
            if self.host not in live:  # its own announcements do not reach it: what it heard of the others is stale
                return
            through = trim_point(min(position, self.applied), hosts, live)
            if through >= first and time.monotonic() - asked < TRIM_DECIDE_S:
                await self.log.trim(through)
                log.event("cluster_log_trimmed", f"cluster log entries up to {through} dropped", position=through)
        except Exception as e:  # NATS away: the next checkpoint tries again
            log.event("cluster_trim_failed", f"trimming the cluster log up to {position}: {e}", level="warning")

    async def keep_position(self, address: str) -> None:
        """Saves the position and tells the cluster (`streamtx cluster status`) where this host is; and finds out
        when the log was trimmed past it, even if no entry comes to show the gap."""
        announced = 0.0
        while True:
            await asyncio.sleep(SAVE_EVERY)
            await asyncio.to_thread(self.save)
            if time.monotonic() - announced >= 1.0:
                announced = time.monotonic()
                try:
                    await self.log.announce(self.host, self.record(address))
                    first = await self.log.first()
                except Exception as e:  # NATS away: the log reader says so too
                    log.event("cluster_announce_failed", f"cannot announce host {self.host}: {e}", level="warning")
                    continue
                if first > self.read + 1:  # a live host's position holds trimming back: this one was not live
                    self._fall_behind(
                        f"the cluster log starts at {first}: entries {self.read + 1} to {first - 1}, not applied "
                        "here, were trimmed while this host was not heard from; it starts again from the newest "
                        "snapshot"
                    )
                    return

    def _fall_behind(self, why: str) -> None:
        if self.behind:
            return
        self.failure, self.behind = why, True
        log.event("cluster_log_gap", why, level="error")
        self.on_fatal()

    def record(self, address: str) -> dict[str, Any]:
        return {
            "host": self.host,
            "address": address,
            "machine": socket.gethostname(),
            "applied": self.applied,
            "partitions": len(self.front.partitions),
            "serving": self.front.supervisor.serving,
            "started": self.started_at,
            "time": time.time(),
        }


class StartingHost:
    """A host between opening the log and running it (installing a snapshot, recovering its partitions): it says
    every second how far it has applied the log, so that the log is not trimmed past it meanwhile."""

    def __init__(self, inputlog: InputLog, host: str) -> None:
        self.log = inputlog
        self.host = host
        self.applied = 0
        self._task: asyncio.Task | None = None

    async def announce(self, applied: int) -> None:
        self.applied = applied
        await self.log.announce(self.host, self._record())
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.log.announce(self.host, self._record())
            except Exception as e:  # NATS away: the log reader will say so too
                log.event("cluster_announce_failed", f"cannot announce host {self.host}: {e}", level="warning")

    def _record(self) -> dict[str, Any]:
        machine = socket.gethostname()
        return {"host": self.host, "machine": machine, "applied": self.applied, "serving": False, "time": time.time()}

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _fitting(request: pb.PushRequest, limit: int) -> list[pb.PushRequest]:
    """`request` as messages of at most `limit` bytes, split between its batches (halves, recursively); a
    single batch too large, or rows not in Arrow, stay whole (their entry's body goes beside the log)."""
    sizes = list(request.batch_rows)
    if request.ByteSize() <= limit or len(sizes) < 2 or request.data.WhichOneof("format") != "arrow_ipc":
        return [request]
    try:
        table = ipc_to_table(request.data.arrow_ipc)
    except StreamTxError:  # malformed: goes whole, and is refused when read
        return [request]
    half = len(sizes) // 2
    first_rows = sum(sizes[:half])
    out = []
    for first, part_sizes, rows in (
        (request.batch_id, sizes[:half], table.slice(0, first_rows)),
        (request.batch_id + half, sizes[half:], table.slice(first_rows)),
    ):
        part = pb.PushRequest(
            stream=request.stream,
            producer_id=request.producer_id,
            batch_id=first,
            data=encode_rowdata(rows, True),
            batch_rows=part_sizes if len(part_sizes) > 1 else [],
        )
        out += _fitting(part, limit)
    return out


async def _acks(message: Any) -> list[pb.PushAck]:
    """Every ack of a push message, in order, as its runs come (service.py `_Message`)."""
    return [ack async for run in message.runs() for ack in run]
