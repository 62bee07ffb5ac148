"""What a partition writes to its command log, and how it recovers from it.

Modes (`--durability`):

- `weak`: the commands a partition takes from outside are logged: each atomic
  batch (PUSH: its stream, producer, batch id, timestamp and tuples; the
  batches one interval committed together are one PUSHES record), OLTP call
  (CALL), front-side rejection (REJECT), deploy (INSTALL), and the fragments of
  coordinated commands it committed (FRAGMENTS: their inputs came from other
  partitions, so they cannot be re-derived here; a state TE's fragment keeps
  the rows the partitions merged for it, partition/exchange.py), and spans
  (SPAN: a punctuation interval of state batches over several partitions,
  with the rows they merged; both modes log it whole), and flow stages (FLOW:
  the batches of a flow's step as this partition ran them, front/flows.py;
  both modes log it whole). Replay re-runs each command
  with PE triggers on, which re-derives every interior TE (upstream backup).
- `strong`: every committed TE is logged, border and interior alike (TE: the
  procedure, its input tuples or parameters, its timestamp, the batch's dedup
  id on the border TE), as consecutive records `i of n` per command; the
  batches one interval committed together are one record (INTERVAL: every
  batch's TEs, their input tuples joined per schema). Replay re-executes each
  TE alone, PE triggers off. A command whose last records are missing (the
  torn tail of a crash) was never acknowledged and is dropped.
- `off`: nothing is logged; acknowledgements do not wait.

Records are appended after the DuckDB commit, in commit order; the worker
acknowledges a command only once its last record is durable (group commit).
The in-memory database itself is never durable: a crash loses exactly the
unacknowledged commands, which producers re-send (deduplication makes that
safe, since marks are rebuilt by replay too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamtx.recovery import (
    CommandLog,
    LogReader,
    NullLog,
    decode_command,
    encode_command,
    load_checkpoint,
    restore_into,
)
from streamtx.recovery.checkpoint import checkpoint_name, list_checkpoints
from streamtx.recovery.log import Log
from streamtx.recovery.records import Record
from streamtx.recovery.records import RecordKind as K
from streamtx.server import log
from streamtx.server import protocol as pr
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.ipc import join_grouped, split_grouped
from streamtx.server.partition.checkpoints import checkpoint_ts, restore
from streamtx.server.partition.exchange import Exchange
from streamtx.server.protocol import TeSpec
from streamtx.server.tuples import Batch, arrow

if TYPE_CHECKING:
    from streamtx.server.partition.dataflow import Dataflow, Push, _Run

COMMAND_FORMAT = 1
"""The form of the records' payloads (their JSON headers and relations), written in every log segment.

A release that changes it bumps it and lists in `READABLE` the formats it
still replays; recovery refuses any other, naming the segment. 0 is a log
from before the format was written down, identical to 1.
"""
READABLE = (0, 1)
REPLAY_INTERVAL = 500  # logged batches replayed per DuckDB transaction (weak)


class Journal:
    def __init__(self, mode: str, log: Log, sync: bool = False) -> None:
        """`mode`: one of config.DURABILITIES, checked with the server's settings."""
        self.mode = mode
        self.log = log
        self.sync = sync

    @classmethod
    def open(
        cls,
        mode: str,
        directory: Path | None,
        wake: Callable[[int], None],
        group_ms: float,
        on_synced: Callable[[float], None] | None = None,
    ) -> Journal:
        """`group_ms` 0 turns group commit off: each record is fsynced alone before the partition goes on.

        `on_synced` gets the seconds each group of records took to write and sync (the partition's meter).

        That is H-Store's command log without group commit, the setting of
        S-Store's logging experiment (§4.2.3); it costs an fsync per record.
        """
        if mode == "off" or directory is None:
            return cls("off", NullLog())
        LogReader(directory / "log", READABLE)  # a log of another release is refused before anything is written
        log = CommandLog(
            directory / "log",
            group_ms=group_ms,
            on_durable=wake,
            on_failure=lambda _error: wake(-1),  # a partition idle with acks waiting must see the failure too
            payload_format=COMMAND_FORMAT,
            on_synced=on_synced,
        )
        return cls(mode, log, sync=group_ms <= 0)

    @property
    def last_lsn(self) -> int:
        return self.log.last_lsn

    def _append(self, kind: K, ts: int, header: dict[str, Any], tables: list[pa.Table]) -> None:
        if self.mode != "off":
            self.log.append(kind, encode_command(header, tables), ts)
            if self.sync:
                self.log.flush()

    # ------------------------------------------------------------- writing
    def push(self, p: Push, run: _Run, rejected: bool, outcome: pr.Outcome | None = None) -> None:
        if self.mode == "weak":
            head = {"stream": p.stream, "producer": p.producer, "batch_id": p.batch_id}
            self._append(K.PUSH, p.ts, head, [p.batch])
            return
        self._tes(p.ts, run.logged, None, [p.producer, p.stream, p.batch_id])
        if rejected and outcome is not None:
            self.reject(p.producer, p.stream, p.batch_id, p.ts, outcome.code, outcome.reason)

    def interval(self, committed: list[tuple[Push, _Run]]) -> None:
        """The batches one DuckDB transaction committed, as one record: INTERVAL (strong) or PUSHES (weak).

        One record instead of one per TE or batch: on 1-tuple batches, encoding
        a record each cost more than running the batch's state operations.
        """
        if self.mode == "off":
            return
        if len(committed) == 1:
            self.push(*committed[0], rejected=False)
            return
        last_ts = committed[-1][0].ts
        if self.mode == "weak":
            order, runs, joined = join_grouped([p.batch for p, _ in committed], [p.stream for p, _ in committed])
            pushes = [[p.stream, p.producer, p.batch_id, p.ts] for p, _ in committed]
            self._append(K.PUSHES, last_ts, {"pushes": pushes, "order": order, "runs": runs}, joined)
            return
        batches: list[list[Any]] = []
        flat: list[Batch] = []
        streams: list[str] = []
        for p, run in committed:
            specs, inputs = [], []
            for spec, table in run.logged:
                specs.append(spec.to_log())
                inputs.append(-1 if table is None else len(flat))
                if table is not None:
                    flat.append(table)
                    streams.append(spec.stream)
            mark = [p.producer, p.stream, p.batch_id] if any(s.border for s, _ in run.logged) else None
            batches.append([p.ts, mark, specs, inputs])
        order, runs, joined = join_grouped(flat, streams)
        self._append(K.INTERVAL, last_ts, {"batches": batches, "order": order, "runs": runs}, joined)

    def call(self, procedure: str, params: dict[str, Any], ts: int, run: _Run) -> None:
        if self.mode == "weak":
            self._append(K.CALL, ts, {"procedure": procedure, "params": params}, [])
        else:
            self._tes(ts, run.logged, params, None)

    def reject(self, producer: str, stream: str, batch_id: int, ts: int, code: int, reason: str) -> None:
        head = {"producer": producer, "stream": stream, "batch_id": batch_id, "code": code, "reason": reason}
        self._append(K.REJECT, ts, head, [])

    def install(self, catalog: str, ddl: list[str], partition_map: str | None) -> None:
        self._append(K.INSTALL, 0, {"catalog": catalog, "ddl": ddl, "map": partition_map}, [])

    def done(self, ts: int) -> None:
        self._append(K.DONE, ts, {}, [])

    def fragments(
        self,
        ts: int,
        specs: list[tuple[TeSpec, pa.Table]],
        params: dict[str, Any] | None,
        mark: Any,
        exchange: Exchange | None = None,
    ) -> None:
        """A coordinated command's fragments committed here, with the merged state rows a state TE used."""
        head = {"specs": [s.to_log() for s, _ in specs], "params": params, "mark": mark}
        extra: list[pa.Table] = []
        if exchange is not None:
            head["exchange"], extra = exchange.wire()
        self._append(K.FRAGMENTS, ts, head, [t for _, t in specs] + extra)

    def span(self, ts: int, span: pr.Span, tables: list[pa.Table]) -> None:
        """A span committed here, as the front sent it (its batches and the merged rows); `ts` is its last batch's."""
        self._append(K.SPAN, ts, span.to_log(), tables)

    def flow(self, ts: int, flow: pr.Flow, tables: list[pa.Table]) -> None:
        """A flow stage committed here, as the front sent it; `ts` is the flow's last batch's."""
        self._append(K.FLOW, ts, flow.to_log(), tables)

    def _tes(
        self,
        ts: int,
        logged: list[tuple[TeSpec, Batch | None]],
        params: dict[str, Any] | None,
        mark: list[Any] | None,
    ) -> None:
        n = len(logged)
        for i, (spec, table) in enumerate(logged):
            head = {"i": i, "n": n, "spec": spec.to_log(), "params": params, "mark": mark if spec.border else None}
            self._append(K.TE, ts, head, [arrow(table)] if table is not None else [])

    # ------------------------------------------------------------ recovery
    def recovery_info(self, data_dir: Path | None) -> pr.Recoverable:
        """What the front needs to choose a consistent recovery: complete checkpoints, finished commands."""
        if data_dir is None:
            return pr.Recoverable([], [], 0)
        ckpts = [checkpoint_ts(p) for p in list_checkpoints(data_dir / "checkpoints")]
        done = []
        last_ts = max(ckpts, default=0)
        log_dir = data_dir / "log"
        if log_dir.exists():
            for r in LogReader(log_dir, READABLE).records():
                last_ts = max(last_ts, r.ts)
                if r.kind == K.DONE:
                    done.append(r.ts)
        return pr.Recoverable(ckpts, done, last_ts)

    def recover(
        self,
        flow: Dataflow,
        checkpoints: Path,
        checkpoint_ts: int | None,
        log_dir: Path,
        done: set[int],
        partition: int,
    ) -> pr.Recovered:
        """Loads the chosen checkpoint, then replays the log after it; reports progress on stderr.

        Fragments of a coordinated command (and spans and flows) are replayed only if the command
        finished everywhere (`done`, from the home partition's log): one that a
        crash cut short was never acknowledged, and its producer re-sends it.
        Such records are then marked UNDONE in the log: after a worker restart
        the front runs the command again with the same timestamp, and only
        that run's records may be replayed once it is DONE (`_settled`).
        """
        from streamtx.server.partition.dataflow import Push

        started = time.monotonic()
        lsn = 0
        found = checkpoints / checkpoint_name(checkpoint_ts) if checkpoint_ts is not None else None
        if found is not None:
            ckpt = load_checkpoint(found)
            restore(flow.engine, ckpt, restore_into)
            lsn = ckpt.lsn
        reader = LogReader(log_dir, READABLE) if log_dir.exists() else None
        total = reader.total(lsn + 1) if reader is not None else 0
        count = 0
        doubt: set[int] = set()
        checkpointed = flow.engine.marks.as_dict()
        taken: dict[tuple[str, str], list[int]] = {}
        if reader is not None and total:
            _say(partition, f"replaying {total} log records after checkpoint lsn {lsn}")
            pending: list[tuple[dict[str, Any], list[pa.Table], int]] = []
            pushes: list[Push] = []  # consecutive batches (weak) replay as one interval, as they ran
            last_report = time.monotonic()
            for count, _, record in _settled(reader.replay(lsn + 1), done, doubt):
                head, tables = decode_command(record.payload)
                for producer, stream, batch_id in _taken(record.kind, head):
                    taken.setdefault((producer, stream), []).append(batch_id)
                if record.kind == K.PUSH:
                    pushes.append(Push(head["stream"], head["producer"], head["batch_id"], record.ts, tables[0]))
                elif record.kind == K.PUSHES:
                    batches = split_grouped(head["order"], head["runs"], tables)
                    pushes += [Push(s, p, b, ts, t) for (s, p, b, ts), t in zip(head["pushes"], batches, strict=True)]
                if record.kind in (K.PUSH, K.PUSHES) and len(pushes) < REPLAY_INTERVAL:
                    continue
                if pushes:
                    flow.run_pushes(pushes)
                    pushes = []
                if record.kind not in (K.PUSH, K.PUSHES):
                    self._replay(flow, record.kind, record.ts, head, tables, pending)
                if time.monotonic() - last_report > 1.0:
                    _say(partition, f"replayed {count}/{total} log records")
                    last_report = time.monotonic()
            if pushes:
                flow.run_pushes(pushes)
        for ts in sorted(doubt):  # so that the same command run again at `ts` is told apart from these
            self._append(K.UNDONE, ts, {}, [])
        if doubt:
            self.log.flush()
        seconds = time.monotonic() - started
        flow.engine.counters["recovered_records"] = count
        flow.engine.counters["recovery_ms"] = round(seconds * 1000)
        if found is not None or total:
            name = found.name if found is not None else "none"
            _say(partition, f"recovered: checkpoint {name}, {count} log records, {seconds:.2f} s")
        return pr.Recovered(lsn, count, seconds, checkpointed, taken)

    def _replay(
        self,
        flow: Dataflow,
        kind: int,
        ts: int,
        head: dict[str, Any],
        tables: list[pa.Table],
        pending: list[tuple[dict[str, Any], list[pa.Table], int]],
    ) -> None:
        eng = flow.engine
        eng.state.sync()  # as before any command but a push (Worker.handle)
        if kind == K.INSTALL:
            eng.install(Catalog.from_json(head["catalog"], eng.loader.resolve), head["ddl"], head["map"])
        elif kind == K.CALL:
            try:
                flow.run_call(head["procedure"], head["params"], ts)
            except Exception:  # a call that failed changed nothing, then as now
                pass
        elif kind == K.REJECT:
            if not eng.marks.taken(head["producer"], head["stream"], head["batch_id"]):
                eng.record_rejection(
                    head["producer"], head["stream"], head["batch_id"], ts, head["code"], head["reason"]
                )
        elif kind == K.DONE:
            pass
        elif kind == K.SPAN:
            flow.replay_span(pr.Span.from_log(head), tables)
        elif kind == K.FLOW:
            flow.replay_flow(pr.Flow.from_log(head), tables, ts)
        elif kind == K.INTERVAL:
            flat = split_grouped(head["order"], head["runs"], tables)
            for batch_ts, mark, specs, inputs in head["batches"]:
                relations = [flat[i] if i >= 0 else pa.table({}) for i in inputs]
                flow.replay_tes(batch_ts, [TeSpec.from_log(d) for d in specs], relations, None, mark)
        elif kind == K.FRAGMENTS:
            n = len(head["specs"])
            exchange = Exchange.from_wire(head.get("exchange"), tables[n:])
            specs = [TeSpec.from_log(d) for d in head["specs"]]
            flow.replay_tes(ts, specs, tables[:n], head["params"], head["mark"], exchange)
        elif kind == K.TE:
            if head["i"] == 0:
                pending.clear()
            pending.append((head, tables, ts))
            if head["i"] == head["n"] - 1 and len(pending) == head["n"]:
                specs = [TeSpec.from_log(h["spec"]) for h, _, _ in pending]
                inputs = [t[0] if t else pa.table({}) for _, t, _ in pending]
                marks = [h["mark"] for h, _, _ in pending if h["mark"] is not None]
                flow.replay_tes(ts, specs, inputs, head["params"], marks[0] if marks else None)
                pending.clear()


def _settled(
    records: Iterator[tuple[int, int, Record]], done: set[int], doubt: set[int]
) -> Iterator[tuple[int, int, Record]]:
    """The records to replay: a coordinated command's only if it is DONE and they were not UNDONE since.

    A command's records are the last in the log when it is cut short (the
    front sends nothing else meanwhile), so its UNDONE follows them; they are
    held until the next record shows whether it does. `doubt` gets the
    timestamps of records skipped and not yet marked UNDONE.
    """
    held: list[tuple[int, int, Record]] = []
    for item in records:
        record = item[2]
        if record.kind == K.UNDONE:
            held = [h for h in held if h[2].ts != record.ts]
            doubt.discard(record.ts)
        elif record.kind in (K.FRAGMENTS, K.SPAN, K.FLOW):
            if record.ts in done:
                held.append(item)
            else:
                doubt.add(record.ts)
        else:
            yield from held
            held = []
            yield item
    yield from held


def _taken(kind: int, head: dict[str, Any]) -> Iterator[tuple[str, str, int]]:
    """The batches a record shows taken (committed or rejected): (producer, stream, batch id)."""
    if kind in (K.PUSH, K.REJECT):
        yield head["producer"], head["stream"], head["batch_id"]
    elif kind in (K.PUSHES, K.SPAN):  # [stream, producer, batch id, ts, ...] per batch
        for stream, producer, batch_id, *_ in head["pushes"]:
            yield producer, stream, batch_id
    elif kind == K.FLOW:  # [stream, producer, batch id, ts, streams] per batch; None: taken here
        for stream, producer, batch_id, _, streams in head["items"]:
            if streams is None:
                yield producer, stream, batch_id
    elif kind == K.INTERVAL:
        for _, mark, _, _ in head["batches"]:
            if mark:
                yield mark[0], mark[1], mark[2]
    elif kind in (K.TE, K.FRAGMENTS) and head.get("mark"):
        yield head["mark"][0], head["mark"][1], head["mark"][2]


def _say(partition: int, message: str) -> None:
    log.event("recovery", message, partition=partition)
