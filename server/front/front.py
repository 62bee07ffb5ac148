"""The front process's core: catalog, sequencer, router and partitions together.

The gRPC service (front/service.py) is a thin translation of protobuf to calls
on `Front`; everything here raises StreamTxError subclasses with precise
messages, and nothing changes state before all checks passed.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from streamtx.errors import (
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    StreamTxError,
    Unavailable,
)
from streamtx.server import log, sqltree
from streamtx.server import protocol as pr
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.physical import create_statements
from streamtx.server.catalog.placement import COORDINATED, EVENT_KEYED, KEYED
from streamtx.server.catalog.placement import HOME as HOME_MODE
from streamtx.server.config import CATALOG_FILE, ServerConfig
from streamtx.server.front import checks, scatter
from streamtx.server.front.admission import Admission
from streamtx.server.front.balance import BinLoad, imbalance, per_partition, proposal
from streamtx.server.front.coordinator import Coordinator
from streamtx.server.front.flows import FlowPush, Flows
from streamtx.server.front.gate import Gate, Span
from streamtx.server.front.metrics import push_latency
from streamtx.server.front.partitions import Partition, Partitions, Reply, checked
from streamtx.server.front.rebalance import BinMove, Rebalancer
from streamtx.server.front.sequencer import Sequencer
from streamtx.server.front.spans import SpanPush, Spans
from streamtx.server.front.supervisor import Supervisor
from streamtx.server.launch import Launch, launch
from streamtx.server.loader import ProcedureLoader
from streamtx.server.partition.migration import unmovable
from streamtx.server.partitioning import HOME, PartitionMap


class Front:
    def __init__(self, config: ServerConfig, launched: Launch | None = None) -> None:
        self.config = config
        self.launched = launched  # started early by `streamtx serve` (launch.py), else at `start`
        self.data_dir = Path(config.data_dir)
        self.loader = ProcedureLoader(config.procedures_path)
        self.catalog = Catalog()
        self.partitions = Partitions(config)
        self.sequencer = Sequencer(order_timeout=config.order_timeout, parks=config.cluster is None)
        self.counters: collections.Counter[str] = collections.Counter()
        self.push_seconds = push_latency()  # admission to outcome, per pushed batch (front/metrics.py)
        self.stream_counters: collections.Counter[tuple[str, str]] = collections.Counter()  # (stream, outcome|rows)
        self.recovery_seconds = 0.0  # the last recovery's, all partitions (start-up or worker restart)
        self.recovered_ts = 0  # the highest timestamp whose effects the last recovery brought back
        self.admission = Admission(config.max_in_flight, config.max_in_flight_bytes)
        self._stream_events: dict[str, asyncio.Event] = {}
        self._deploy_lock = asyncio.Lock()
        self.boundary = asyncio.Lock()
        """Held between two commands' admissions by whoever must not have a checkpoint cut inside its work
        (cluster mode: a log entry, so that a checkpoint's cut falls between two entries, server/cluster/)."""
        self.on_checkpoint: list[Callable[[int, asyncio.Future[bool]], None]] = []
        """Called at a checkpoint's cut with its timestamp and a future: True once every partition has written
        it, False if it failed."""
        self.plans_migrations: Callable[[], bool] = lambda: True
        """Whether this front plans automatic migrations (in cluster mode, one host does, for all)."""
        self._lock_file: Any = None
        self.parser = duckdb.connect(":memory:")  # parses and casts on the front; holds no data
        self.map = PartitionMap.round_robin(config.partitions, max(config.bins, config.partitions))
        self._maps: list[tuple[int, PartitionMap]] = []  # (ts, map routing the commands after ts): recent steps
        self.bin_load = BinLoad(self.map.bins) if config.auto_rebalance > 0 else None  # front/balance.py
        self.keys_per_partition: list[int] = []  # in the last window auto-rebalancing judged (Status)
        self.gate = Gate(None, config.interval_size)
        self._set_span_runner(config.partitions)
        # each helper takes the collaborators it uses, and of the front itself only a narrow port (front/ports.py)
        self.supervisor = Supervisor(self.partitions, self.counters, self.gate, config, self.recover)
        self.coordinator = Coordinator(self, self.partitions, self.counters, self.supervisor, config)
        self.spans = Spans(self, self.partitions, self.counters, self.supervisor, self.coordinator, config)
        self.flows = Flows(self, self.partitions, self.counters, self.supervisor, self.coordinator, config)
        self.rebalancer = Rebalancer(
            self, self.partitions, self.gate, self.sequencer, self.supervisor, self.coordinator, config
        )

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        launched = self.launched or launch(self.config)
        self.launched = None
        self._lock_file = launched.lock
        self.catalog = await asyncio.to_thread(Catalog.load, self.data_dir / CATALOG_FILE, self.loader.resolve)
        self.map = await asyncio.to_thread(
            PartitionMap.load_or_create, self.data_dir, self.config.partitions, self.map.bins
        )
        await self.partitions.attach(launched.workers)
        self.supervisor.watch(await self.recover(startup=True))

    async def recover(self, startup: bool = False) -> set[int]:
        """Brings just started workers to the state the logs hold; returns the coordinated commands done.

        Every partition recovers from the same global checkpoint and the same
        finished-command set. The checkpoint is the newest one every partition
        completed (one interrupted anywhere is never used); coordinated
        commands count as finished only if the home partition logged their
        DONE record, which names them by timestamp: so timestamps continue
        after the highest one any log holds, skipped commands included, and
        are never given twice.
        """
        started = time.perf_counter()
        infos: list[pr.Recoverable] = [r for r, _ in await self.partitions.broadcast(pr.RecoveryInfo())]
        self.sequencer.last_ts = max([self.sequencer.last_ts, *(i.last_ts for i in infos)])
        chosen = common_checkpoint(infos, self.map.born)
        recovered = await asyncio.gather(
            *(
                p.request(pr.Recover(chosen if chosen in info.checkpoints else None, infos[HOME].done))
                for p, info in zip(self.partitions.all, infos, strict=True)
            )
        )
        self.recovered_ts = max((r.last_ts for r, _ in recovered), default=0)
        if startup:  # after a worker restart the front still holds what was in flight (front/supervisor.py)
            self.sequencer.holes = lost_batches([r for r, _ in recovered])
            # a migration step cut short by the crash: kept if DONE made it (front/rebalance.py)
            self.map = await asyncio.to_thread(PartitionMap.settled, self.data_dir, set(infos[HOME].done))
            if len(self.partitions) > self.map.partitions:  # added by a step that did not finish
                await self.partitions.retire(self.map.partitions)
            self._set_span_runner(self.map.partitions)
            self.rebalancer.find_interrupted()
        await self.partitions.broadcast(self.install_command(self.map))
        for marks, _ in await self.partitions.broadcast(pr.ReadMarks()):
            self.sequencer.load_marks(marks.marks, marks.last_ts)
        self.recovery_seconds = time.perf_counter() - started
        return set(infos[HOME].done)

    def install_command(self, partition_map: PartitionMap) -> pr.Install:
        """The catalog for a worker that may not hold it (recovered from an older one, or just added)."""
        ddl = [s.sql for s in create_statements(self.catalog.relations())]
        return pr.Install(self.catalog.to_json(), ddl, partition_map.to_json(), startup=True, analyzed=self.catalog)

    @property
    def deploying(self) -> asyncio.Lock:
        """Held while a deploy installs a catalog on every partition (a partition added meanwhile would miss it)."""
        return self._deploy_lock

    async def stop(self) -> None:
        self.supervisor.unwatch()
        await self.partitions.stop()
        for p in self.partitions.all:
            p.fail_all(Unavailable("the server is shutting down"))
        if self._lock_file is not None:
            self._lock_file.close()
        self.parser.close()

    # ------------------------------------------------------------------ deploy
    async def deploy(self, script: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[pr.StatementPlan]]:
        """Deploys a script; returns what it created and dropped, and how the created SQL runs."""
        sqltree.check_size(script, "deploy")
        async with self._deploy_lock:
            new, created, dropped, ddl = await asyncio.to_thread(self.catalog.deploy, script, self.loader.resolve)
            await self.ask_all(pr.Install(new.to_json(), ddl, analyzed=new))
            await asyncio.to_thread(new.save, self.data_dir / CATALOG_FILE)
            self.catalog = new
            self.sequencer.forget_streams(set(new.streams))
            self.counters["deploys"] += 1
        made, gone = [f"{kind} {name}" for kind, name in created], [f"{kind} {name}" for kind, name in dropped]
        what = f"created {', '.join(made) or 'nothing'}; dropped {', '.join(gone) or 'nothing'}"
        log.event("deploy", f"deployed catalog version {new.version}: {what}", created=made, dropped=gone)
        units = [
            name if kind == "procedure" else f"trigger {name}"
            for kind, name in created
            if kind == "trigger" or (kind == "procedure" and new.procedures[name].python is None)
        ]
        plans = (await self.ask(HOME, pr.Explain(tuple(units))))[0].statements if units else []
        return created, dropped, plans

    async def explain(self, name: str) -> list[pr.StatementPlan]:
        """How each SQL statement of a procedure or EE trigger runs (server/partition/sqlplans.py)."""
        cat = self.catalog
        proc = cat.procedures.get(name)
        if proc is not None and proc.python is not None:
            raise FailedPrecondition(f"explain: procedure {name!r} is Python ({proc.python}): it has no SQL statements")
        if proc is None and name not in cat.triggers:
            known = ", ".join([*cat.names("procedure"), *cat.names("trigger")]) or "none"
            raise NotFound(f"explain: no procedure or trigger {name!r} (known: {known})")
        unit = name if proc is not None else f"trigger {name}"
        return (await self.ask(HOME, pr.Explain((unit,))))[0].statements

    # -------------------------------------------------------------------- push
    def check_push(self, stream: str, producer: str, batch_id: int) -> pa.Schema:
        """Validates a push's addressing; returns the stream's schema."""
        return checks.push_schema(self.catalog, stream, producer, batch_id)

    def check_rows(self, stream: str, rows: int) -> None:
        if rows > self.config.max_batch_rows:
            raise ResourceExhausted(
                f"push to {stream!r}: batch of {rows} rows exceeds the limit of "
                f"{self.config.max_batch_rows} rows per batch (--max-batch-rows)"
            )

    def push(self, stream: str, producer: str, batch_id: int, table: pa.Table) -> asyncio.Future:
        """Submits a validated batch; the future resolves to the partition's outcome header."""

        resend = batch_id <= self.sequencer.dispatched.get((producer, stream), 0)
        if resend and self.sequencer.take_hole(producer, stream, batch_id):
            resend = False  # lost in a crash while a later batch survived (`lost_batches`): taken now
        if not resend:
            self._count_keys(stream, table)

        def dispatch(ts: int) -> asyncio.Future:
            if resend:
                return self._resent(stream, producer, batch_id)
            return self._dispatch_push(stream, producer, batch_id, ts, table)

        started = time.perf_counter()
        out = self.sequencer.submit(producer, stream, batch_id, dispatch)
        out.add_done_callback(lambda f: f.cancelled() or self._pushed(stream, table.num_rows, f, started))
        return out

    def push_run(
        self, stream: str, producer: str, first: int, table: pa.Table, sizes: list[int]
    ) -> list[asyncio.Future] | None:
        """Consecutive validated batches, from batch id `first`, `sizes` rows each of `table`, sequenced
        together when they can go so (`first` next in the producer's order): with one partition as one
        request (`pr.PushRun`), with several as flow batches (front/flows.py) if every batch of the
        stream is one. Each future is its batch's outcome, as `push`'s; None: push them one by one."""
        if len(sizes) < 2:
            return None
        if len(self.partitions) == 1:
            dispatch = self._run_at_home(stream, producer, first, table, sizes)
        elif self._flows_only(stream):
            dispatch = self._flow_run(stream, producer, first, table, sizes)
        else:
            return None
        futures: list[asyncio.Future] = []
        started = time.perf_counter()
        if not self.sequencer.submit_run(producer, stream, first, len(sizes), lambda ts: futures.extend(dispatch(ts))):
            return None
        self.counters["push_runs"] += 1
        self._count_keys(stream, table)
        for rows, fut in zip(sizes, futures, strict=True):
            fut.add_done_callback(lambda f, rows=rows: f.cancelled() or self._pushed(stream, rows, f, started))
        return futures

    def _run_at_home(
        self, stream: str, producer: str, first: int, table: pa.Table, sizes: list[int]
    ) -> Callable[[int], list[asyncio.Future]]:
        def dispatch(ts: int) -> list[asyncio.Future]:
            loop = asyncio.get_running_loop()
            parts = [loop.create_future() for _ in sizes]
            command = pr.PushRun(stream, producer, first, ts, sizes)
            run = self.gate.run(lambda: self.partitions[HOME].send_run(command, table, parts, self._outcome))
            run.add_done_callback(lambda f: _fail_parts(f, parts))
            return parts

        return dispatch

    def _flows_only(self, stream: str) -> bool:
        """Whether every batch of the stream goes as `_dispatch_push` sends a flow batch (or alone, coordinated)."""
        placement = self.catalog.placement
        return (
            self.gate.span_runner is not None
            and stream in placement.flows
            and stream not in placement.stream_keys
            and placement.push_mode.get(stream, COORDINATED) == COORDINATED
        )

    def _flow_run(
        self, stream: str, producer: str, first: int, table: pa.Table, sizes: list[int]
    ) -> Callable[[int], list[asyncio.Future]]:
        """The batches' owners found with one lookup for the message, then each batch as `_dispatch_push`'s."""
        placement = self.catalog.placement
        each_row = placement.flows[stream]

        def dispatch(ts: int) -> list[asyncio.Future]:
            owners = self.map.owners(table.column(placement.streams[stream])).tolist() if table.num_rows else []
            out = []
            at = 0
            for i, n in enumerate(sizes):
                batch = table.slice(at, n)
                joins = _flow_owners(owners[at : at + n], each_row)
                out.append(self._coordinated_push(stream, producer, first + i, ts + i, batch, joins))
                at += n
            return out

        return dispatch

    def _count_keys(self, stream: str, table: pa.Table) -> None:
        """The keys of a batch taken on a partitioned stream, by bin, while auto-rebalancing (`BinLoad`)."""
        if self.bin_load is None or len(self.partitions) < 2:
            return
        key = self.catalog.placement.streams.get(stream)
        if key is not None:
            self.bin_load.count(self.map, table.column(key))

    async def rebalance_automatically(self) -> None:
        """Every `--auto-rebalance` seconds: the window's keys per bin, and the migration they call for
        (front/balance.py), run batched unless a migration is running, interrupted, or workers restart, or
        (in cluster mode) another host plans them."""
        every, load = self.config.auto_rebalance, self.bin_load
        while every > 0 and load is not None:
            await asyncio.sleep(every)
            window = load.take()
            current = self.map
            self.keys_per_partition = [int(k) for k in per_partition(current.owner, current.partitions, window)]
            rebalancer = self.rebalancer
            if rebalancer.running or rebalancer.interrupted or not self.supervisor.serving:
                continue
            if not self.plans_migrations():
                continue
            if unmovable(self.catalog) is not None:  # refused anyway (Status and `rebalance` say why)
                continue
            target = proposal(current, window, self.config.auto_rebalance_tolerance)
            if target is None:
                continue
            moves = [BinMove(b, b, p) for b, p in enumerate(target) if p != current.owner[b]]
            before, after = (
                imbalance(current.owner, current.partitions, window),
                imbalance(target, current.partitions, window),
            )
            log.event(
                "auto_rebalance",
                f"moving {len(moves)} bin(s): the busiest partition had {before:.2f}x the mean of "
                f"{int(window.sum()):,} keys in {every:g} s; {after:.2f}x by the same keys once moved",
                bins=len(moves),
                imbalance=round(before, 3),
                expected=round(after, 3),
            )
            self.counters["auto_rebalances"] += 1
            try:
                async for _ in rebalancer.run(moves, False, strategy="batched"):
                    pass
            except StreamTxError as e:
                log.event("auto_rebalance_failed", f"automatic rebalance failed: {e.message}", level="warning")

    def _pushed(self, stream: str, rows: int, out: asyncio.Future, started: float) -> None:
        """A pushed batch's outcome came: its latency, and its stream's counts."""
        self.push_seconds.observe(time.perf_counter() - started)
        self._count_outcome(stream, rows, out)

    def _count_outcome(self, stream: str, rows: int, out: asyncio.Future) -> None:
        """Counts a batch's outcome (committed, rejected, duplicate) and committed rows per stream (Status)."""
        if out.exception() is not None:
            return
        outcome = getattr(out.result(), "outcome", None)
        if outcome is not None:
            self.stream_counters[(stream, outcome)] += 1
            if outcome == "committed":
                self.stream_counters[(stream, "rows")] += rows

    def _resent(self, stream: str, producer: str, batch_id: int) -> asyncio.Future:
        """A re-sent batch: DUPLICATE with the original outcome, whichever partitions its rows route to now.

        The id was dispatched, so the batch was taken (committed or rejected)
        by whichever partitions its first rows went to; every partition is
        asked, in order behind the original. Nothing runs: the rows of a
        re-send are never looked at.
        """
        out: asyncio.Future = asyncio.get_running_loop().create_future()

        def finish(original: asyncio.Future) -> None:
            if original.exception() is not None:
                out.set_exception(original.exception())
                return
            self.counters["duplicate"] += 1
            out.set_result(original.result())

        self.gate.run(lambda: self.original(stream, producer, batch_id)).add_done_callback(finish)
        return out

    def original(self, stream: str, producer: str, batch_id: int) -> asyncio.Future[pr.Outcome]:
        """The DUPLICATE outcome of a batch taken before, from every partition (sent now, not through the gate).

        The partition that rejected it says so; else it committed, at the
        timestamp the partition that took it knows (the others know none: 0).
        """
        out: asyncio.Future = asyncio.get_running_loop().create_future()

        def finish(replies: asyncio.Future) -> None:
            try:
                known: list[pr.Outcome] = [checked(r)[0] for r in replies.result()]
            except Exception as e:  # the lookup's failure, whatever it is, is the caller's
                out.set_exception(e)
                return
            rejected = [k for k in known if k.original == "rejected"]
            out.set_result((rejected[0] if rejected else max(known, key=lambda k: k.ts)).quiet())

        self._send_all(pr.Original(producer, stream, batch_id)).add_done_callback(finish)
        return out

    async def finished_outcome(self, stream: str, producer: str, batch_id: int, ts: int) -> pr.Outcome:
        """The outcome of a batch whose command finished just before the partitions were restarted."""
        original = await self.original(stream, producer, batch_id)
        for s in self.catalog.streams:  # what it emitted is not known: subscribers look again
            self.notify(s)
        return original.first(ts)

    def reject(self, stream: str, producer: str, batch_id: int, error: StreamTxError) -> asyncio.Future:
        """Takes a well-addressed batch whose rows are bad as rejected, in its place in the order.

        Its batch id is used up like that of a batch a procedure aborted, so a
        pipeline goes on with the next batch; re-sending it gets DUPLICATE with
        the original rejection. No data of it reaches any table.
        """

        def dispatch(ts: int) -> asyncio.Future:
            command = pr.Reject(stream, producer, batch_id, ts, error.code.value[0], error.message)
            return self.gate.run(lambda: self.partitions[HOME].send(command, then=self._outcome))

        out = self.sequencer.submit(producer, stream, batch_id, dispatch)
        out.add_done_callback(lambda f: f.cancelled() or self._count_outcome(stream, 0, f))
        return out

    def _dispatch_push(self, stream: str, producer: str, batch_id: int, ts: int, table: pa.Table) -> asyncio.Future:
        target = self.local_target(stream, table)
        command = pr.Push(stream, producer, batch_id, ts)

        def coordinated() -> Awaitable[pr.Outcome]:
            return self.coordinator.push(stream, producer, batch_id, ts, table)

        def local() -> asyncio.Future:
            assert target is not None
            return self.partitions[target].send(command, [table], then=self._outcome)

        if self.gate.span_runner is not None and stream in self.catalog.placement.stream_keys:
            if target is None:
                involved = (HOME, *self.map.partitions_of(table, self.catalog.placement.stream_keys[stream]))
            else:
                involved = (target,)
            procedure = self.catalog.consumers[stream][0]
            alone = coordinated if target is None else local
            item = SpanPush(stream, producer, batch_id, ts, table, procedure, tuple(sorted(set(involved))), alone)
            return self.gate.run_coordinated(coordinated, item) if target is None else self.gate.run(local, item)
        if target is not None:
            return self.gate.run(local)
        joins = None
        if self.gate.span_runner is not None and stream in self.catalog.placement.flows and table.num_rows:
            keys = table.column(self.catalog.placement.streams[stream])
            joins = _flow_owners(self.map.owners(keys).tolist(), self.catalog.placement.flows[stream])
        return self._coordinated_push(stream, producer, batch_id, ts, table, joins)

    def _coordinated_push(
        self, stream: str, producer: str, batch_id: int, ts: int, table: pa.Table, joins: tuple[int, ...] | None
    ) -> asyncio.Future:
        """A batch that spans partitions: alone as a coordinated command, or in a flow where `joins` says
        its entry runs (`_flow_owners`)."""

        def coordinated() -> Awaitable[pr.Outcome]:
            return self.coordinator.push(stream, producer, batch_id, ts, table)

        item = None if joins is None else FlowPush(stream, producer, batch_id, ts, table, joins, coordinated)
        return self.gate.run_coordinated(coordinated, item)

    async def _run_together(self, span: Span) -> list[pr.Outcome | BaseException]:
        """A run of batches the gate let go together: each stretch of spans' or flows' batches by its kind.

        The last stretch, if flows', goes on with the flow batches that queue up meanwhile.
        """
        out: list[pr.Outcome | BaseException] = []
        groups = [(kind, list(group)) for kind, group in itertools.groupby(list(span), type)]
        for i, (kind, group) in enumerate(groups):
            if kind is FlowPush:
                out += await self.flows.run(group, span if i == len(groups) - 1 else None)
            else:
                out += await self.spans.run(group)
        return out

    def _outcome(self, reply: Reply) -> pr.Outcome:
        """A push's or rejection's outcome from its partition's reply (`Partition.send`'s `then`)."""
        outcome: pr.Outcome = checked(reply)[0]
        for s in outcome.emitted:
            self.notify(s)
        self.counters[outcome.outcome] += 1
        return outcome

    def local_target(self, stream: str, table: pa.Table) -> int | None:
        """The one partition that runs all of a batch's TEs, or None if they span partitions (coordinated)."""
        if len(self.partitions) == 1:
            return HOME
        mode = self.catalog.placement.push_mode.get(stream, COORDINATED)
        if mode == HOME_MODE:
            return HOME
        if mode == KEYED:
            key = self.catalog.placement.streams[stream]
            assert key is not None
            if table.num_rows == 0:
                return HOME
            owner = self.map.sole_owner(table.column(key))
            if owner is not None:
                return owner
        if mode == EVENT_KEYED:
            involved = self.map.partitions_of(table, self.catalog.placement.stream_keys[stream])
            if len(involved) <= 1:
                return involved[0] if involved else HOME
        return None

    def call_owner(self, procedure: str, params: dict[str, Any], ts: int | None = None) -> int:
        """The partition that owns a partitioned procedure's key parameter (under the map of `ts`)."""
        key = self.catalog.placement.keys[procedure]
        type_sql = dict(self.catalog.procedures[procedure].params)[key]
        value = self.parser.execute(f"SELECT CAST($v AS {type_sql})", {"v": params[key]}).fetchall()[0][0]
        pmap = self.map if ts is None else self.map_at(ts)
        return int(pmap.owners(pa.array([value]))[0])

    def switch_map(self, ts: int, new: PartitionMap, added: list[Partition] | None = None) -> None:
        """Commands after `ts` route by `new` (a migration step at `ts`, front/rebalance.py); `added`: the
        partitions a grow step adds, started and recovered, which take every command after `ts`."""
        self._maps = [*self._maps[-2:], (ts, self.map)]
        self.map = new
        if added:
            self.partitions.add(added)
            self.supervisor.adopt(added)
        self._set_span_runner(new.partitions)

    def _set_span_runner(self, partitions: int) -> None:
        """Several partitions run punctuation intervals of the opchain executor as spans (front/spans.py);
        one runs them alone, and the gate is free."""
        together = self.config.executor == "opchain" and partitions > 1
        self.gate.span_runner = self._run_together if together else None

    def map_at(self, ts: int) -> PartitionMap:
        """The map that routes the command at `ts`: the current one, unless a step after it switched.

        A coordinated command places each unit when the gate lets it run, which
        may be after a migration step later in the order switched the map; its
        rows belong where its own time put them. Only the last few steps are
        kept: a step waits for every command before it, so older ones ran.
        """
        for switched, before in self._maps:
            if ts < switched:
                return before
        return self.map

    # -------------------------------------------------------------------- call
    async def call(self, procedure: str, params: dict[str, Any]) -> tuple[int, list[pa.Table]]:
        bound = checks.bind_call(self.catalog, self.parser, procedure, params)
        ts = self.sequencer.next_ts()
        mode = self.catalog.placement.call_mode.get(procedure, COORDINATED) if len(self.partitions) > 1 else HOME_MODE
        if mode == COORDINATED:
            _, results = await self.gate.run_coordinated(lambda: self.coordinator.call(procedure, bound, ts))
            self.counters["calls"] += 1
            return ts, results
        target = HOME if mode == HOME_MODE else self.call_owner(procedure, bound)
        command = pr.Call(procedure, bound, ts)
        outcome, results = checked(await self.gate.run(lambda: self.partitions[target].send(command)))
        for s in outcome.emitted:
            self.notify(s)
        self.counters["calls"] += 1
        return ts, results

    # ------------------------------------------------------------------- query
    async def query(self, sql: str, params: dict[str, Any]) -> pa.Table:
        sqltree.check_size(sql, "query")
        checks.check_read_only(self.parser, sql)
        self.counters["queries"] += 1
        placement = self.catalog.placement
        return await scatter.query(self, placement, len(self.partitions), self.config.query_timeout, sql, params)

    async def ask(self, partition: int, command: pr.Command) -> Reply:
        """A read of one partition, in order with every command (behind a coordinated one)."""
        return checked(await self.gate.run(lambda: self.partitions[partition].send(command)))

    async def ask_all(self, command: pr.Command) -> list[Reply]:
        """A read of every partition at one point of the command order (a consistent cut)."""
        return [checked(r) for r in await self.gate.run(lambda: self._send_all(command))]

    def _send_all(self, command: pr.Command) -> asyncio.Future:
        """Writes `command` to every partition's queue now; the future is their replies."""
        return asyncio.ensure_future(asyncio.gather(*(p.send(command) for p in self.partitions.all)))

    # --------------------------------------------------------------- subscribe
    def check_subscribe(self, stream: str) -> None:
        if stream not in self.catalog.streams:
            raise NotFound(f"subscribe: unknown stream {stream!r}")
        consumers = self.catalog.consumers.get(stream)
        if consumers:
            raise FailedPrecondition(
                f"subscribe: stream {stream!r} is consumed by {', '.join(consumers)}; its tuples "
                "are garbage collected once consumed. Subscribe to a stream no procedure consumes"
            )

    async def read_stream(self, stream: str, from_ts: int, max_batches: int = 64) -> list[tuple[int, pa.Table]]:
        command = pr.ReadStream(stream, from_ts, max_batches)
        if len(self.partitions) == 1:
            reply, tables = await self.ask(HOME, command)
            return list(zip(reply.ts, tables, strict=True))
        return scatter.merge_stream_reads(await self.ask_all(command), max_batches)

    def stream_event(self, stream: str) -> asyncio.Event:
        ev = self._stream_events.get(stream)
        if ev is None:
            ev = self._stream_events[stream] = asyncio.Event()
        return ev

    def notify(self, stream: str) -> None:
        ev = self._stream_events.pop(stream, None)
        if ev is not None:
            ev.set()

    # -------------------------------------------------------------- checkpoint
    async def checkpoint(self) -> tuple[int, list[pr.Checkpointed]]:
        """An online checkpoint of every partition at one point of the command order.

        All partitions pin their snapshot at the same cut (the request passes the
        gate like any command), then write it on a helper thread while they go
        on executing; this returns when every partition has written its own.
        """
        started = time.perf_counter()
        written: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        async with self.boundary:
            ts = self.sequencer.last_ts
            cut = self.gate.run(lambda: self._send_all(pr.Checkpoint(ts)))
            for callback in self.on_checkpoint:
                callback(ts, written)
        ok = False
        try:
            replies = [checked(r) for r in await cut]
            await self.ask_all(pr.Release(ts))
            ok = True
        finally:
            written.set_result(ok)
        self.counters["checkpoints"] += 1
        seconds, size = time.perf_counter() - started, sum(r[0].bytes for r in replies)
        log.event(
            "checkpoint",
            f"checkpoint at timestamp {ts}: {len(replies)} partition(s), {size:,} bytes, {seconds:.3f} s",
            ts=ts,
            seconds=round(seconds, 6),
            bytes=size,
        )
        return ts, [r[0] for r in replies]

    async def checkpoint_periodically(self) -> None:
        every = self.config.checkpoint_every
        while every > 0:
            await asyncio.sleep(every)
            try:
                await self.checkpoint()
            except StreamTxError as e:
                log.event("checkpoint_failed", f"periodic checkpoint failed: {e.message}", level="warning")

    # ------------------------------------------------------------------ status
    async def status(self) -> dict[str, Any]:
        """The front's counters, and each live partition's as `partition<i>.<counter>`.

        While the partitions are being restarted, only the front's (it answers at once).
        """
        counters = dict(self.counters)
        counters["in_flight_batches"] = self.admission.batches
        counters["in_flight_bytes"] = self.admission.bytes
        counters["admission_waiting"] = self.admission.waiting
        live = [p for p in self.partitions.all if p.alive] if self.supervisor.serving else []
        replies = []
        if live:
            replies = await self.gate.run(
                lambda: asyncio.ensure_future(
                    asyncio.gather(*(p.send(pr.Status()) for p in live), return_exceptions=True)
                )
            )
        metrics: dict[int, dict[str, Any]] = {}
        for p, reply in zip(live, replies, strict=True):
            if isinstance(reply, BaseException) or isinstance(reply[0], pr.Failed):
                continue
            for name, n in reply[0]["counters"].items():
                counters[f"partition{p.index}.{name}"] = n
            metrics[p.index] = reply[0]["metrics"]
        parts = []
        for p in self.partitions.all:
            parts.append(
                {
                    "id": p.index,
                    "pid": p.pid,
                    "alive": p.alive,
                    "queued": p.queued,
                    "error": p.error or ("" if self.supervisor.serving else "being restarted"),
                }
            )
            if p.index in metrics:  # protobuf PartitionMetrics (partition/meter.py)
                parts[-1]["metrics"] = metrics[p.index]
        streams: dict[str, dict[str, Any]] = {}
        for (stream, what), n in sorted(self.stream_counters.items()):
            streams.setdefault(stream, {"stream": stream})[what] = n
        return {
            "partitions": parts,
            "bins": self.map.bins,
            "counters": counters,
            "last_timestamp": self.sequencer.last_ts,
            "stream_metrics": list(streams.values()),  # protobuf StreamMetrics
            "recovery_seconds": self.recovery_seconds,
        }


def common_checkpoint(infos: list[pr.Recoverable], born: tuple[int, ...]) -> int | None:
    """The newest checkpoint every partition can start from: one it wrote, or, for a partition added live
    after it (`PartitionMap.born`; one the map does not name yet was added by a step under way), the empty
    state it started with: its log holds everything since."""
    every = set().union(*(info.checkpoints for info in infos))
    usable = [
        {c for c in every if c in info.checkpoints or i >= len(born) or c < born[i]} for i, info in enumerate(infos)
    ]
    common = set.intersection(*usable) if usable else set()
    return max(common) if common else None


def lost_batches(recovered: list[pr.Recovered]) -> dict[tuple[str, str], set[int]]:
    """Batch ids below a producer's latest that no partition's log or checkpoint holds: lost in a crash.

    Each partition makes its log durable on its own, so a crash can lose batch
    k on one partition while k + 1, sent to another, survived. Neither was
    acknowledged (acks leave in batch order): the producer re-sends both, and
    k must be taken then, not answered DUPLICATE. Every id at or below the
    highest one a checkpoint holds was taken (the checkpoint is one cut of
    the command order); above it, the logs name every batch taken.
    """
    checkpointed: dict[tuple[str, str], int] = {}
    taken: dict[tuple[str, str], set[int]] = {}
    for info in recovered:
        for key, batch_id in info.checkpointed.items():
            checkpointed[key] = max(checkpointed.get(key, 0), batch_id)
        for key, ids in info.taken.items():
            taken.setdefault(key, set()).update(ids)
    holes = {}
    for key, ids in taken.items():
        missing = set(range(checkpointed.get(key, 0) + 1, max(ids))) - ids
        if missing:
            holes[key] = missing
    return holes


__all__ = ["Front", "Reply"]


def _fail_parts(run: asyncio.Future, parts: list[asyncio.Future]) -> None:
    """A push run that failed as a whole (its worker gone, say) fails each batch not answered yet."""
    if not run.cancelled() and run.exception() is None:
        return
    for part in parts:
        if part.done():
            continue
        if run.cancelled():
            part.cancel()
        else:
            part.set_exception(run.exception())  # type: ignore[arg-type]


def _flow_owners(rows: list[int], each_row: bool) -> tuple[int, ...] | None:
    """Where a batch's entry runs, if it can join a flow (front/flows.py), from its rows' owners: the one
    partition owning all its keys, or, FOR EACH ROW (its tuples run one at a time, each with all it
    triggers), each row's; None if it cannot (no rows, or keys of several partitions)."""
    if not rows:
        return None
    if len(rows) > 1 and each_row:
        return tuple(rows)
    return (rows[0],) if len(set(rows)) == 1 else None
