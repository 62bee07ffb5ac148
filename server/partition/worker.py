"""A partition worker process: one executing thread over one DuckDB database.

The front starts it with one end of a socket pair. A helper thread only reads
frames off the socket (I/O); the main thread executes commands one at a time,
in the order they arrive, which is timestamp order. The worker exits when the
front closes the socket or dies (PR_SET_PDEATHSIG), so it can never outlive it.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamtx.errors import DataLoss, FailedPrecondition, Internal, StreamTxError
from streamtx.recovery import CorruptCheckpoint, CorruptLog, LogFailed
from streamtx.server import log, pandas_probe
from streamtx.server import protocol as pr
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.collector import Collector
from streamtx.server.config import ServerConfig
from streamtx.server.ipc import Frame, SocketFrames, split_runs, unpack
from streamtx.server.loader import ProcedureLoader
from streamtx.server.partition import checkpoints, replay
from streamtx.server.partition.dataflow import Dataflow, Push
from streamtx.server.partition.engine import Engine
from streamtx.server.partition.exchange import read_owned
from streamtx.server.partition.journal import Journal
from streamtx.server.partition.migration import Migration
from streamtx.server.partition.state import run_values

PR_SET_PDEATHSIG = 1
KEEP_UNRELEASED = 1_000  # checkpoints written but not yet known complete on every partition
LOGGED = frozenset({pr.Reject, pr.Call, pr.Install, pr.Decide, pr.Done})
"""Commands whose effects are logged: answered only once durable (pushes too, via `_pushes`)."""
_fault = os.environ.get("STREAMTX_FAULT_EXIT_BEFORE_ACK", "").split(":", 2)
FAULT_EXIT_BEFORE_ACK = (int(_fault[0]), int(_fault[1]), _fault[2]) if len(_fault) == 3 else None
"""Fault injection for tests (`Worker._maybe_fail_before_acks`)."""
_fault = os.environ.get("STREAMTX_FAULT_EXIT_AFTER_RECOVERY", "").split(":", 1)
FAULT_EXIT_AFTER_RECOVERY = (int(_fault[0]), _fault[1]) if len(_fault) == 2 else None
"""Fault injection for tests (`Worker._read_marks`)."""


@dataclass(frozen=True)
class _Wake:
    """Inbox marker: the command log made more records durable."""


@dataclass(frozen=True)
class _Written:
    """Inbox marker: the checkpoint writer finished request `id` (or failed with `error`)."""

    id: int
    lsn: int
    ts: int
    path: str = ""
    error: str = ""
    bytes: int = 0  # the checkpoint's files, in all


WAKE: list[Frame] = [(_Wake(), [])]


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(1)


@dataclass(slots=True)
class _RunPart:
    """One batch of a `PushRun` (request `id`), taken as a push of its own and answered by its place."""

    id: int
    index: int
    push: Push


def _run_parts(request: pr.Request, tables: list[pa.Table]) -> list[Frame]:
    c = request.command
    batches, _ = split_runs([c.rows], tables)
    return [
        (_RunPart(request.id, i, Push(c.stream, c.producer, c.first_batch_id + i, c.first_ts + i, b)), [])
        for i, b in enumerate(batches)
    ]


def _is_push(header: Any) -> bool:
    return isinstance(header, _RunPart) or (isinstance(header, pr.Request) and isinstance(header.command, pr.Push))


OVER_WORKING_SET = (pr.Fragment, pr.Flow, pr.Decide, pr.Done, pr.Migrate, pr.MigrateIn)


class Worker:
    def __init__(self, partition: int, frames: SocketFrames, config: ServerConfig) -> None:
        self.frames = frames
        self.interval_size = config.interval_size
        self.interval_s = config.interval_ms / 1000
        self.group_s = config.group_commit_ms / 1000
        loader = ProcedureLoader(config.procedures_path)
        self.engine = Engine(
            partition,
            loader,
            executor=config.executor,
            stream_retention=config.stream_retention,
            sql_compiler=config.sql_compiler == "on",
            query_timeout=config.query_timeout,
        )
        self.engine.meter.slow_te_s = config.slow_te_ms / 1000
        self.dataflow = Dataflow(self.engine)
        self.migration = Migration(self.engine)
        self.inbox: queue.Queue[list[Frame] | None] = queue.Queue()  # frames as they came packed; None: the end
        self._backlog: collections.deque[Frame] = collections.deque()  # the rest of the inbox item taken last
        self.data_dir = config.partition_dir(partition)
        self.journal = Journal.open(
            config.durability, self.data_dir, self._wake, config.group_commit_ms, self.engine.meter.log_sync.observe
        )
        # (lsn, request id, place in its PushRun or None, reply, relations), answered once lsn is durable
        self.acks: collections.deque[tuple[int, int, int | None, Any, list[pa.Table]]] = collections.deque()
        self.checkpointing = False
        self.collector = Collector()
        self.checkpoint_started = 0.0  # perf_counter at the cut of the checkpoint being written
        self.acks_sent = 0
        self.written: dict[int, int] = {}  # checkpoint ts -> its lsn, until every partition has written it
        self._current, self._again = 0, False  # the request being handled
        self._handlers: dict[type, Callable[[Any, list[pa.Table]], tuple[Any, list[pa.Table]]]] = {
            pr.Reject: self._reject,
            pr.Fragment: lambda c, t: self.dataflow.run_fragment(c, t),
            pr.StateRead: self._state_read,
            pr.Span: lambda c, t: self.dataflow.run_span(c, t),
            pr.Flow: lambda c, t: self.dataflow.run_flow(c, t),
            pr.Decide: self._decide,
            pr.Migrate: lambda c, _: self.migration.leave(c),
            pr.MigrateIn: self.migration.arrive,
            pr.Call: self._call,
            pr.Query: lambda c, _: (None, [self.engine.query(c.sql, c.params)]),
            pr.Gather: self._gather,
            pr.ReadStream: self._read_stream,
            pr.Install: self._install,
            pr.Checkpoint: self._start_checkpoint,
            pr.Release: self._release,
            pr.RecoveryInfo: lambda c, _: (replay.recovery_info(self.data_dir), []),
            pr.Recover: lambda c, _: (self.recover(c.checkpoint, set(c.done)), []),
            pr.Done: lambda c, _: (self.journal.done(c.ts), []),
            pr.Original: lambda c, _: (self.engine.original_outcome(c.producer, c.stream, c.batch_id), []),
            pr.ReadMarks: self._read_marks,
            pr.Echo: lambda c, t: (None, t),
            pr.Explain: self._explain,
            pr.Status: self._status,
        }

    def recover(self, checkpoint_ts: int | None, done: set[int]) -> pr.Recovered:
        """Rebuilds the partition from the chosen checkpoint and its command log (the front chose both)."""
        part = self.data_dir
        try:
            info = replay.recover(
                self.journal,
                self.dataflow,
                part / "checkpoints",
                checkpoint_ts,
                part / "log",
                done,
                self.engine.partition,
            )
        except (CorruptLog, CorruptCheckpoint) as e:
            log.event("recovery_failed", f"cannot recover: {e}", level="error", partition=self.engine.partition)
            os._exit(2)
        self.dataflow.journal = self.journal
        self.engine.meter.recovery_seconds = info.seconds
        return info

    def _wake(self, _lsn: int) -> None:
        """The command log made more records durable: their acknowledgements can go."""
        self.inbox.put(WAKE)

    def _read_loop(self) -> None:
        while True:
            frame = self.frames.read()
            if frame is None:
                self.inbox.put(None)
                return
            self.inbox.put(unpack(frame))  # one queue operation per message, not per batch

    def serve(self) -> None:
        threading.Thread(target=self._read_loop, name="ipc-reader", daemon=True).start()
        held: Frame | None = None
        while True:
            frame = held if held is not None else self._next()
            held = None
            if frame is None:
                return
            self.collector.between()  # no command half done
            request, tables = frame
            if isinstance(request, _Wake):
                self._flush_acks()
                continue
            if isinstance(request, _Written):
                self._checkpointed(request)
                continue
            if _is_push(request):
                group, held = self._interval(frame)
                self._pushes(group)
                self._await_log()
                self._flush_acks()
                continue
            command = request.command
            if isinstance(command, pr.Shutdown):
                self.journal.log.flush()
                self._flush_acks()
                self.journal.log.close()
                self.frames.write(pr.Response(request.id))
                return
            try:
                reply, out_tables = self.handle(request, tables)
            except Exception as e:
                self._error(request, e)
                continue
            if isinstance(command, pr.Checkpoint):
                continue  # answered when the helper thread has written it
            if type(command) in LOGGED or (isinstance(command, pr.Fragment) and command.autocommit):
                self._ack(request, reply, out_tables)
                self._flush_acks()
            else:
                self._ok(request, reply, out_tables)

    def _next(self) -> Frame | None:
        """The next command; with none queued, acknowledgements waiting on the log are flushed first.

        Group commit waits up to `--group-commit-ms` for more records to share
        an fsync; with nothing left to run no more are coming from here.
        """
        try:
            return self._take(0)
        except queue.Empty:
            if self.acks:
                self.journal.log.flush_soon()
            return self._take(None)

    def _take(self, timeout: float | None) -> Frame | None:
        """The next frame; `timeout` 0: only one queued already (else queue.Empty), None: as long as it takes."""
        if not self._backlog:
            item = self.inbox.get_nowait() if timeout == 0 else self.inbox.get(timeout=timeout)
            if item is None:
                return None
            self._backlog.extend(item)
        frame = self._backlog.popleft()
        header = frame[0]
        if isinstance(header, pr.Request) and isinstance(header.command, pr.PushRun):
            parts = _run_parts(header, frame[1])
            self._backlog.extendleft(reversed(parts[1:]))
            return parts[0]
        return frame

    def _await_log(self) -> None:
        """After an interval: its record is fsynced now, and waited for up to `--group-commit-ms`.

        Its acknowledgements then leave before the next interval runs, not
        after it (the next record comes only when that interval ends, so
        there is nothing to group this one with): producers refill their
        windows while this partition works, instead of after.
        """
        if self.acks and self.journal.log.durable_lsn < self.journal.last_lsn:
            self.journal.log.flush_soon()
            try:
                self.journal.log.wait_durable(self.journal.last_lsn, timeout=self.group_s)
            except LogFailed:
                pass  # _flush_acks reports it and stops the partition

    def _interval(self, first: Frame) -> tuple[list[Frame], Frame | None]:
        """The queued batches to run as one punctuation interval, and the frame that ended it.

        Takes what is queued, up to `interval_size`; waits up to the latency
        budget (`interval_ms`) for more. A frame that is not a push ends the
        interval: commands keep their order.
        """
        group = [first]
        deadline = time.monotonic() + self.interval_s
        while len(group) < self.interval_size:
            try:
                wait = deadline - time.monotonic()
                nxt = self._take(wait if wait > 0 else 0)
            except queue.Empty:
                break
            if nxt is None:  # the front went away: let the main loop see it
                self.inbox.put(None)
                return group, None
            if isinstance(nxt[0], _Wake):
                self._flush_acks()
                continue
            if not _is_push(nxt[0]):
                return group, nxt
            group.append(nxt)
        return group, None

    def _pushes(self, group: list[Frame]) -> None:
        """Queued batches go to the dataflow together: one DuckDB transaction when none aborts."""
        pushes = []
        for r, t in group:
            if isinstance(r, _RunPart):
                pushes.append(r.push)
            else:
                c = r.command
                pushes.append(Push(c.stream, c.producer, c.batch_id, c.ts, t[0]))
        try:
            results: list[Any] = self.dataflow.run_pushes(pushes)
        except Exception as e:
            results = [e] * len(group)
        for (r, _), result in zip(group, results, strict=True):
            if isinstance(result, Exception):
                self._error(r, result)
            else:
                self._ack(r, result, [])

    def _ack(self, request: pr.Request | _RunPart, reply: Any, tables: list[pa.Table]) -> None:
        """Answers a command once the log records of everything committed so far are durable."""
        index = request.index if isinstance(request, _RunPart) else None
        self.acks.append((self.journal.last_lsn, request.id, index, reply, tables))

    def _flush_acks(self) -> None:
        if not self.acks:
            return
        durable = self.journal.log.durable_lsn
        failed = self.journal.log.failed
        if failed is not None:
            log.event("log_failed", f"command log failed: {failed}", level="error", partition=self.engine.partition)
            os._exit(3)  # acknowledging nothing more; the restarted partition recovers
        ready: list[Frame] = []
        run: tuple[int, int, list[Any]] | None = None  # the run reply being filled: request id, first, items
        sent = 0
        while self.acks and self.acks[0][0] <= durable:
            _, rid, index, reply, tables = self.acks.popleft()
            sent += 1
            if index is None:
                ready.append((pr.Response(rid, reply), tables))
                run = None
            elif run is not None and run[0] == rid and run[1] + len(run[2]) == index:
                run[2].append(reply)  # the next batch of the same run: one reply for the batches acked together
            else:
                run = (rid, index, [reply])
                ready.append((pr.Response(rid, pr.RunReplies(index, run[2])), []))
        if ready:
            self._maybe_fail_before_acks(sent)
            self.frames.write_many(ready)

    def _maybe_fail_before_acks(self, n: int) -> None:
        """Fault injection for tests: a worker that dies with acks durable but not sent.

        `STREAMTX_FAULT_EXIT_BEFORE_ACK=<partition>:<count>:<path>`: that
        partition's worker exits when, having sent `count` acks, it is about to
        send more, unless `<path>` exists (it creates it: one death per test).
        """
        fault = FAULT_EXIT_BEFORE_ACK
        if fault is None or fault[0] != self.engine.partition:
            return
        self.acks_sent += n
        if self.acks_sent > fault[1] and not os.path.exists(fault[2]):
            Path(fault[2]).write_text("died\n")
            os._exit(9)

    def _start_checkpoint(self, command: pr.Checkpoint, _: list[pa.Table]) -> tuple[None, list[pa.Table]]:
        if self.checkpointing:
            raise FailedPrecondition(f"checkpoint: partition {self.engine.partition} is still writing the last one")
        self.checkpoint_started = time.perf_counter()
        snap, meta = checkpoints.begin(self.engine, self.journal.last_lsn, command.ts)
        self.checkpointing = True
        target = self.data_dir / "checkpoints"
        rid = self._current

        def write() -> None:
            try:
                # pruned at `release`, not here: the last checkpoint every partition wrote must stay
                path = str(snap.write(target, meta=meta, keep=KEEP_UNRELEASED, log=self.journal.log))
                done = _Written(rid, snap.lsn, snap.ts, path, bytes=_tree_bytes(path))
            except Exception as e:  # reported to the caller; the previous checkpoint stays in use
                done = _Written(rid, snap.lsn, snap.ts, error=f"{type(e).__name__}: {e}")
            self.inbox.put([(done, [])])

        threading.Thread(target=write, name="checkpoint-writer", daemon=True).start()
        return None, []

    def _checkpointed(self, done: _Written) -> None:
        self.checkpointing = False
        request = pr.Request(done.id, pr.Checkpoint(done.ts))
        if done.error:
            self._error(request, Internal(f"checkpoint: {done.error}"))
            return
        self.written[done.ts] = done.lsn
        self.engine.counters["checkpoints"] += 1
        meter = self.engine.meter
        meter.checkpoint.observe(time.perf_counter() - self.checkpoint_started)
        meter.checkpoint_bytes = done.bytes
        self._ok(request, pr.Checkpointed(done.path, done.lsn, done.ts, done.bytes), [])

    def _ok(self, request: pr.Request, reply: Any, tables: list[pa.Table]) -> None:
        self.frames.write(pr.Response(request.id, reply), tables)

    def _error(self, request: pr.Request | _RunPart, e: Exception) -> None:
        """A StreamTxError is the client's answer; anything else is a bug, reported.

        A bug while taking a batch (or a step of a coordinated command) stops
        the worker: the batch's id is spoken for, so answering it with an
        error would lose it. The front restarts the workers, which recover
        and take the batch again (front/supervisor.py); a bug that recurs
        ends in the server stopping, with this traceback in its log. A bug in
        any other command is answered INTERNAL and the worker goes on.
        """
        run_part = isinstance(request, _RunPart)
        if not isinstance(e, StreamTxError):
            fatal = run_part or type(request.command) in pr.TAKES_BATCH
            then = "stopping this worker (the front restarts it)" if fatal else "answered INTERNAL"
            log.event(
                "internal_error",
                f"internal error in {'push' if run_part else request.command.name!r}; {then}",
                level="error",
                partition=self.engine.partition,
                detail="".join(traceback.format_exception(e)),
            )
            if fatal:
                os._exit(4)
            e = Internal(f"partition {self.engine.partition}: {type(e).__name__}: {e}")
        failed = pr.Failed(e.code.value[0], e.message)
        self.frames.write(pr.Response(request.id, pr.RunReplies(request.index, [failed]) if run_part else failed))

    def handle(self, request: pr.Request, tables: list[pa.Table]) -> tuple[Any, list[pa.Table]]:
        """Every command but a push, a coordinated TE's or a migration step's: DuckDB is brought up to date first.

        A coordinated TE's fragment and decision, and a migration step's
        rounds, run over the working set as an interval does (write-behind,
        partition/state.py): their statements that run in DuckDB write back
        what they read first.
        """
        if type(request.command) not in OVER_WORKING_SET:
            self.engine.state.sync()
        handler = self._handlers.get(type(request.command))
        if handler is None:
            raise Internal(f"unknown partition command {type(request.command).__name__}")
        self._current, self._again = request.id, request.again
        return handler(request.command, tables)

    def _decide(self, c: pr.Decide, _: list[pa.Table]) -> tuple[None, list[pa.Table]]:
        if self.migration.open is not None:
            self.migration.decide(c, self.journal)
        else:
            self.dataflow.decide(c)
        return None, []

    def _reject(self, c: pr.Reject, _: list[pa.Table]) -> tuple[pr.Outcome, list[pa.Table]]:
        return self.dataflow.run_reject(c.stream, c.producer, c.batch_id, c.ts, c.code, c.reason), []

    def _state_read(self, c: pr.StateRead, tables: list[pa.Table]) -> tuple[pr.StateRows, list[pa.Table]]:
        """Round 1 of state TEs spanning partitions (partition/exchange.py)."""
        batches, values = run_values(c.runs, tables)
        rows = [
            [dict(zip(b.column_names, v, strict=True)) for v in vals] for b, vals in zip(batches, values, strict=True)
        ]
        return read_owned(self.engine, [(proc, ts, r) for (proc, ts), r in zip(c.items, rows, strict=True)])

    def _call(self, c: pr.Call, _: list[pa.Table]) -> tuple[pr.Outcome, list[pa.Table]]:
        eng = self.engine
        if self._again and c.ts <= eng.marks.last_ts:  # front/supervisor.py: the last worker committed it
            raise DataLoss(
                f"call {c.procedure}: it committed (timestamp {c.ts}) on partition {eng.partition}, "
                "whose worker died before it answered; its result rows are lost, and it was not run again"
            )
        return self.dataflow.run_call(c.procedure, c.params, c.ts)

    def _gather(self, c: pr.Gather, _: list[pa.Table]) -> tuple[pr.Gathered, list[pa.Table]]:
        return pr.Gathered([k for k, _ in c.reads]), [self.engine.query(sql, {}) for _, sql in c.reads]

    def _read_stream(self, c: pr.ReadStream, _: list[pa.Table]) -> tuple[pr.StreamBatches, list[pa.Table]]:
        batches = self.engine.read_stream(c.stream, c.from_ts, c.max_batches)
        return pr.StreamBatches([b for b, _ in batches]), [t for _, t in batches]

    def _install(self, c: pr.Install, _: list[pa.Table]) -> tuple[None, list[pa.Table]]:
        eng = self.engine
        have = eng.catalog.version
        new = c.analyzed.version if c.analyzed is not None else json.loads(c.catalog).get("version", 0)
        if (c.startup or self._again) and (have > new or (have == new and (have or not c.ddl))):
            return None, []  # recovered already, a deploy the front had not finished when a worker died included
        catalog = c.analyzed if c.analyzed is not None else Catalog.from_json(c.catalog, eng.loader.resolve)
        eng.install(catalog, c.ddl, c.map)
        self.journal.install(c.catalog, c.ddl, c.map)
        return None, []

    def _release(self, c: pr.Release, _: list[pa.Table]) -> tuple[None, list[pa.Table]]:
        """Every partition wrote checkpoint `ts`: older log records are not needed."""
        lsn = self.written.pop(c.ts, None)
        if lsn is not None:
            checkpoints.drop_older(self.data_dir / "checkpoints", c.ts)
            self.journal.log.truncate_before(lsn + 1)
        return None, []

    def _explain(self, c: pr.Explain, _: list[pa.Table]) -> tuple[pr.Explained, list[pa.Table]]:
        cat = self.engine.catalog
        out = []
        for unit in c.units:
            plan = cat.trigger_plans[unit[8:]] if unit.startswith("trigger ") else cat.plans[unit]
            out += self.engine.sql_plans.explain(unit, plan.statements)
        return pr.Explained(out), []

    def _status(self, _: pr.Status, __: list[pa.Table]) -> tuple[dict[str, Any], list[pa.Table]]:
        """Counters, table sizes, and what the meter measured (`metrics`: protobuf PartitionMetrics)."""
        eng = self.engine
        out = eng.status()
        dedup = {"marks": eng.marks.count(), **eng.dedup_rows()}
        out["metrics"] = eng.meter.snapshot(log_bytes=self.journal.log.size_bytes(), dedup=dedup)
        return out, []

    def _read_marks(self, _: pr.ReadMarks, __: list[pa.Table]) -> tuple[pr.MarksRead, list[pa.Table]]:
        self.engine.load_marks()
        reply = pr.MarksRead(self.engine.marks.as_dict(), self.engine.marks.last_ts)
        self._maybe_exit_after_recovery(reply)
        return reply, []

    def _maybe_exit_after_recovery(self, reply: pr.MarksRead) -> None:
        """Fault injection for tests: a worker that dies right after its last recovery request, seen by the
        front before the recovery ends.

        `STREAMTX_FAULT_EXIT_AFTER_RECOVERY=<partition>:<path>`: while
        `<path>` exists, the other partitions answer their last recovery
        request (ReadMarks) 0.5 s late, and that partition's worker answers it
        and exits, once (it creates `<path>.fired`).
        """
        fault = FAULT_EXIT_AFTER_RECOVERY
        if fault is None or not os.path.exists(fault[1]):
            return
        if fault[0] != self.engine.partition:
            time.sleep(0.5)
            return
        fired = Path(fault[1] + ".fired")
        if fired.exists():
            return
        fired.write_text("exited after recovery\n")
        self.frames.write_many([(pr.Response(self._current, reply), [])])
        os._exit(9)


def _tree_bytes(path: str) -> int:
    """Bytes of the files under `path` (a checkpoint directory, or one file)."""
    if not os.path.isdir(path):
        return os.path.getsize(path) if os.path.exists(path) else 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The worker's arguments (launch.py): its settings, and process plumbing that is no setting."""
    parser = argparse.ArgumentParser(description="streamtx partition worker (started by the front, launch.py)")
    parser.add_argument("--fd", type=int, required=True, help="this worker's end of the socket pair")
    parser.add_argument("--partition", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True, help="the front's pid: the worker dies with it")
    parser.add_argument("--config", type=ServerConfig.from_json, required=True, help="the server's settings, JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    log.configure(args.config.log_format)
    _die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front decides when we stop
    pandas_probe.skip()
    sock = socket.socket(fileno=args.fd)
    try:
        worker = Worker(args.partition, SocketFrames(sock), args.config)
    except (CorruptLog, CorruptCheckpoint) as e:
        where = args.config.partition_dir(args.partition)
        log.event("recovery_failed", f"cannot recover from {where}: {e}", level="error", partition=args.partition)
        os._exit(2)
    try:
        worker.serve()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        worker.journal.log.close()
        worker.engine.con.close()
        sock.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # closed above; skips interpreter teardown, which the front waits for


if __name__ == "__main__":
    main()
