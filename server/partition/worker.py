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
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamtx.errors import DataLoss, FailedPrecondition, Internal, StreamTxError
from streamtx.recovery import CorruptCheckpoint, CorruptLog, LogFailed
from streamtx.server.ipc import Frame, SocketFrames, unpack
from streamtx.server.loader import ProcedureLoader
from streamtx.server.partition import checkpoints
from streamtx.server.partition.dataflow import Dataflow, Push
from streamtx.server.partition.engine import Engine
from streamtx.server.partition.exchange import read_owned
from streamtx.server.partition.journal import MODES, Journal
from streamtx.server.partition.state import run_values

PR_SET_PDEATHSIG = 1
WAKE_OP = "__wake__"  # inbox marker: the command log made more records durable
CHECKPOINTED_OP = "__checkpointed__"  # inbox marker: the checkpoint writer finished
WAKE: list[Frame] = [({"op": WAKE_OP}, [])]
KEEP_UNRELEASED = 1_000  # checkpoints written but not yet known complete on every partition
LOGGED_OPS = frozenset({"reject", "call", "install", "decide", "done"})
"""Commands whose effects are logged: answered only once durable (pushes too, via `_pushes`)."""
_fault = os.environ.get("STREAMTX_FAULT_EXIT_BEFORE_ACK", "").split(":", 2)
FAULT_EXIT_BEFORE_ACK = (int(_fault[0]), int(_fault[1]), _fault[2]) if len(_fault) == 3 else None
"""Fault injection for tests (`Worker._maybe_fail_before_acks`)."""
FAIL_STOP_OPS = frozenset({"push", "reject", "fragment", "decide", "span", "state_read", "done"})
"""Commands that take a batch (or are a step of one): a bug in one stops the worker (`Worker._error`)."""


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(1)


class Worker:
    def __init__(
        self,
        partition: int,
        frames: SocketFrames,
        procedures: Path,
        retention: int,
        executor: str,
        interval_size: int = 500,
        interval_ms: float = 0.0,
        durability: str = "off",
        data_dir: Path | None = None,
        group_commit_ms: float = 2.0,
    ) -> None:
        self.frames = frames
        self.interval_size = interval_size
        self.interval_s = interval_ms / 1000
        self.group_s = group_commit_ms / 1000
        self.engine = Engine(partition, ProcedureLoader(procedures), retention, executor)
        self.dataflow = Dataflow(self.engine)
        self.inbox: queue.Queue[list[Frame] | None] = queue.Queue()  # frames as they came packed; None: the end
        self._backlog: collections.deque[Frame] = collections.deque()  # the rest of the inbox item taken last
        self.data_dir = data_dir
        self.journal = Journal.open(durability, data_dir, lambda _: self.inbox.put(WAKE), group_commit_ms)
        self.acks: collections.deque[tuple[int, dict[str, Any], list[pa.Table]]] = collections.deque()
        self.checkpointing = False
        self.acks_sent = 0
        self.written: dict[int, int] = {}  # checkpoint ts -> its lsn, until every partition has written it

    def recover(self, checkpoint_ts: int | None, done: set[int]) -> dict[str, Any]:
        """Rebuilds the partition from the chosen checkpoint and its command log (the front chose both)."""
        info: dict[str, Any] = {}
        if self.data_dir is not None:
            part = self.data_dir
            try:
                info = self.journal.recover(
                    self.dataflow, part / "checkpoints", checkpoint_ts, part / "log", done, self.engine.partition
                )
            except (CorruptLog, CorruptCheckpoint) as e:
                print(f"streamtx: partition {self.engine.partition}: cannot recover: {e}", file=sys.stderr, flush=True)
                os._exit(2)
        self.dataflow.journal = self.journal
        return info

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
            header, tables = frame
            op = header.get("op")
            if op == WAKE_OP:
                self._flush_acks()
                continue
            if op == CHECKPOINTED_OP:
                self._checkpointed(header)
                continue
            if op == "shutdown":
                self.journal.log.flush()
                self._flush_acks()
                self.journal.log.close()
                self.frames.write({"id": header["id"], "ok": True})
                return
            if op == "push":
                group, held = self._interval(frame)
                self._pushes(group)
                self._await_log()
                self._flush_acks()
                continue
            try:
                reply, out_tables = self.handle(header, tables)
            except Exception as e:
                self._error(header, e)
                continue
            if op == "checkpoint":
                continue  # answered when the helper thread has written it
            if op in LOGGED_OPS or (op == "fragment" and "autocommit" in header):
                self._ack(header, reply, out_tables)
                self._flush_acks()
            else:
                self._ok(header, reply, out_tables)

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
        if self._backlog:
            return self._backlog.popleft()
        item = self.inbox.get_nowait() if timeout == 0 else self.inbox.get(timeout=timeout)
        if item is None:
            return None
        self._backlog.extend(item)
        return self._backlog.popleft()

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
            if nxt[0].get("op") == WAKE_OP:
                self._flush_acks()
                continue
            if nxt[0].get("op") != "push":
                return group, nxt
            group.append(nxt)
        return group, None

    def _pushes(self, group: list[Frame]) -> None:
        """Queued batches go to the dataflow together: one DuckDB transaction when none aborts."""
        pushes = [Push(h["stream"], h["producer"], h["batch_id"], h["ts"], t[0]) for h, t in group]
        try:
            results: list[Any] = self.dataflow.run_pushes(pushes)
        except Exception as e:
            results = [e] * len(group)
        for (h, _), result in zip(group, results, strict=True):
            if isinstance(result, Exception):
                self._error(h, result)
            else:
                self._ack(h, result.header(), [])

    def _ack(self, header: dict[str, Any], reply: dict[str, Any], tables: list[pa.Table]) -> None:
        """Answers a command once the log records of everything committed so far are durable."""
        reply.update(id=header["id"], ok=True)
        self.acks.append((self.journal.last_lsn, reply, tables))

    def _flush_acks(self) -> None:
        if not self.acks:
            return
        durable = self.journal.log.durable_lsn
        failed = self.journal.log.failed
        if failed is not None:
            print(f"streamtx: partition {self.engine.partition}: command log failed: {failed}", file=sys.stderr)
            os._exit(3)  # acknowledging nothing more; the restarted partition recovers
        ready: list[Frame] = []
        while self.acks and self.acks[0][0] <= durable:
            _, reply, tables = self.acks.popleft()
            ready.append((reply, tables))
        if ready:
            self._maybe_fail_before_acks(len(ready))
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

    def _start_checkpoint(self, header: dict[str, Any]) -> None:
        if self.data_dir is None:
            raise FailedPrecondition("checkpoint: this server has no data directory for partition state")
        if self.checkpointing:
            raise FailedPrecondition(f"checkpoint: partition {self.engine.partition} is still writing the last one")
        snap, meta = checkpoints.begin(self.engine, self.journal.last_lsn, header["ts"])
        self.checkpointing = True
        target = self.data_dir / "checkpoints"

        def write() -> None:
            done: dict[str, Any] = {"op": CHECKPOINTED_OP, "request": header["id"], "lsn": snap.lsn, "ts": snap.ts}
            try:
                # pruned at `release`, not here: the last checkpoint every partition wrote must stay
                done["path"] = str(snap.write(target, meta=meta, keep=KEEP_UNRELEASED, log=self.journal.log))
            except Exception as e:  # reported to the caller; the previous checkpoint stays in use
                done["error"] = f"{type(e).__name__}: {e}"
            self.inbox.put([(done, [])])

        threading.Thread(target=write, name="checkpoint-writer", daemon=True).start()

    def _checkpointed(self, done: dict[str, Any]) -> None:
        self.checkpointing = False
        if "error" in done:
            self._error({"id": done["request"]}, Internal(f"checkpoint: {done['error']}"))
            return
        self.written[done["ts"]] = done["lsn"]
        self.engine.counters["checkpoints"] += 1
        self._ok({"id": done["request"]}, {"path": done["path"], "lsn": done["lsn"], "ts": done["ts"]}, [])

    def _ok(self, header: dict[str, Any], reply: dict[str, Any], tables: list[pa.Table]) -> None:
        reply.update(id=header["id"], ok=True)
        self.frames.write(reply, tables)

    def _error(self, header: dict[str, Any], e: Exception) -> None:
        """A StreamTxError is the client's answer; anything else is a bug, reported.

        A bug while taking a batch (or a step of a coordinated command) stops
        the worker: the batch's id is spoken for, so answering it with an
        error would lose it. The front restarts the workers, which recover
        and take the batch again (front/supervisor.py); a bug that recurs
        ends in the server stopping, with this traceback in its log. A bug in
        any other command is answered INTERNAL and the worker goes on.
        """
        if not isinstance(e, StreamTxError):
            traceback.print_exception(e, file=sys.stderr)
            if header.get("op") in FAIL_STOP_OPS:
                print(
                    f"streamtx: partition {self.engine.partition}: internal error in {header['op']!r}; "
                    "stopping this worker (the front restarts it)",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(4)
            e = Internal(f"partition {self.engine.partition}: {type(e).__name__}: {e}")
        self.frames.write({"id": header["id"], "ok": False, "code": e.code.value[0], "message": e.message})

    def handle(self, h: dict[str, Any], tables: list[pa.Table]) -> tuple[dict[str, Any], list[pa.Table]]:
        """Every command but a push: DuckDB is brought up to date first (write-behind, partition/state.py)."""
        op = h["op"]
        eng = self.engine
        eng.state.sync()
        if op == "reject":
            out = self.dataflow.run_reject(h["stream"], h["producer"], h["batch_id"], h["ts"], h["code"], h["reason"])
            return out.header(), []
        if op == "fragment":
            return self.dataflow.run_fragment(h, tables)
        if op == "state_read":  # round 1 of state TEs spanning partitions (partition/exchange.py)
            batches, values = run_values(h["runs"], tables)
            rows = [
                [dict(zip(b.column_names, v, strict=True)) for v in vals]
                for b, vals in zip(batches, values, strict=True)
            ]
            return read_owned(eng, [(proc, ts, r) for (proc, ts), r in zip(h["items"], rows, strict=True)])
        if op == "span":  # round 2 of a span: state batches of an interval over several partitions
            return self.dataflow.run_span(h, tables)
        if op == "decide":
            return self.dataflow.decide(h), []
        if op == "call":
            if h.get("again") and h["ts"] <= eng.last_ts:  # front/supervisor.py: the last worker committed it
                raise DataLoss(
                    f"call {h['procedure']}: it committed (timestamp {h['ts']}) on partition {eng.partition}, "
                    "whose worker died before it answered; its result rows are lost, and it was not run again"
                )
            out, results = self.dataflow.run_call(h["procedure"], h["params"], h["ts"])
            return out.header(), results
        if op == "query":
            return {}, [eng.query(h["sql"], h["params"])]
        if op == "gather":
            return {"keys": [k for k, _ in h["reads"]]}, [eng.query(sql, {}) for _, sql in h["reads"]]
        if op == "read_stream":
            batches = eng.read_stream(h["stream"], h["from_batch"], h["max_batches"])
            return {"batch_ids": [b for b, _ in batches]}, [t for _, t in batches]
        if op == "install":
            have, new = eng.catalog.version, json.loads(h["catalog"]).get("version", 0)
            if (h.get("startup") or h.get("again")) and (have > new or (have == new and (have or not h["ddl"]))):
                # recovered already, a deploy the front had not finished when a worker died included
                return {}, []
            eng.install(h["catalog"], h["ddl"], h.get("map"))
            self.journal.install(h["catalog"], h["ddl"], h.get("map"))
            return {}, []
        if op == "checkpoint":
            self._start_checkpoint(h)
            return {}, []
        if op == "release":  # every partition wrote checkpoint ts: older log records are not needed
            lsn = self.written.pop(h["ts"], None)
            if lsn is not None:
                checkpoints.drop_older(self.data_dir / "checkpoints", h["ts"])
                self.journal.log.truncate_before(lsn + 1)
            return {}, []
        if op == "recovery_info":
            return self.journal.recovery_info(self.data_dir), []
        if op == "recover":
            return self.recover(h["checkpoint"], set(h["done"])), []
        if op == "done":
            self.journal.done(h["ts"])
            return {}, []
        if op == "original":  # a re-send: what this partition knows of the batch (front.py `_resent`)
            return eng.original_outcome(h["producer"], h["stream"], h["batch_id"]), []
        if op == "marks":
            eng.load_marks()
            return {"marks": eng.marks, "last_ts": eng.last_ts}, []
        if op == "echo":  # bench ipc: the message path alone
            return {}, tables
        if op == "status":
            return eng.status(), []
        raise Internal(f"unknown partition op {op!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="streamtx partition worker (started by the front)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--partition", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--procedures-path", type=Path, required=True)
    parser.add_argument("--retention", type=int, default=10_000)
    parser.add_argument("--executor", default="opchain")
    parser.add_argument("--interval-size", type=int, default=500)
    parser.add_argument("--interval-ms", type=float, default=0.0)
    parser.add_argument("--durability", choices=MODES, default="off")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--group-commit-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front decides when we stop
    sock = socket.socket(fileno=args.fd)
    try:
        worker = Worker(
            args.partition,
            SocketFrames(sock),
            args.procedures_path,
            args.retention,
            args.executor,
            args.interval_size,
            args.interval_ms,
            args.durability,
            args.data_dir,
            args.group_commit_ms,
        )
    except (CorruptLog, CorruptCheckpoint) as e:
        print(
            f"streamtx: partition {args.partition}: cannot recover from {args.data_dir}: {e}",
            file=sys.stderr,
            flush=True,
        )
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
