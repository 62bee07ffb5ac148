"""How a partition recovers: a checkpoint, then its command log replayed (partition/journal.py writes it).

Weak mode's records re-run each command with PE triggers on, re-deriving
every interior TE; strong mode's re-execute each logged TE alone, PE
triggers off. Consecutive logged batches replay as one interval, as they
ran. A coordinated command's records (and a migration step's) replay only if it finished everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamtx.recovery import LogReader, decode_command, load_checkpoint, restore_into
from streamtx.recovery.checkpoint import checkpoint_name, list_checkpoints
from streamtx.recovery.records import Record
from streamtx.recovery.records import RecordKind as K
from streamtx.server import log
from streamtx.server import protocol as pr
from streamtx.server.catalog.catalog import Catalog
from streamtx.server.catalog.physical import current_ddl
from streamtx.server.ipc import split_grouped
from streamtx.server.partition import migration
from streamtx.server.partition.checkpoints import checkpoint_ts, restore
from streamtx.server.partition.dataflow import Dataflow, Push
from streamtx.server.partition.exchange import Exchange
from streamtx.server.partition.journal import READABLE, Journal
from streamtx.server.protocol import TeSpec

REPLAY_INTERVAL = 500  # logged batches replayed per DuckDB transaction (weak)


def recovery_info(data_dir: Path | None) -> pr.Recoverable:
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
    journal: Journal,
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
    lsn = last_ts = 0
    found = checkpoints / checkpoint_name(checkpoint_ts) if checkpoint_ts is not None else None
    if found is not None:
        ckpt = load_checkpoint(found)
        restore(flow.engine, ckpt, restore_into)
        lsn, last_ts = ckpt.lsn, ckpt.ts
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
            last_ts = max(last_ts, record.ts)
            head, tables = decode_command(record.payload)
            for producer, stream, batch_id in _taken(record.kind, head):
                taken.setdefault((producer, stream), []).append(batch_id)
            if record.kind == K.MIGRATE:  # a retired partition's marks: every id up to them was taken
                for key, mark in migration.handed_marks(head["tables"], tables).items():
                    checkpointed[key] = max(checkpointed.get(key, 0), mark)
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
                _replay(flow, record.kind, record.ts, head, tables, pending)
            if time.monotonic() - last_report > 1.0:
                _say(partition, f"replayed {count}/{total} log records")
                last_report = time.monotonic()
        if pushes:
            flow.run_pushes(pushes)
    journal.undone(sorted(doubt))  # so that the same command run again at `ts` is told apart from these
    seconds = time.monotonic() - started
    flow.engine.counters["recovered_records"] = count
    flow.engine.counters["recovery_ms"] = round(seconds * 1000)
    if found is not None or total:
        name = found.name if found is not None else "none"
        _say(partition, f"recovered: checkpoint {name}, {count} log records, {seconds:.2f} s")
    return pr.Recovered(lsn, count, seconds, checkpointed, taken, last_ts)


def _replay(
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
        eng.install(Catalog.from_json(head["catalog"], eng.loader.resolve), current_ddl(head["ddl"]), head["map"])
    elif kind == K.CALL:
        try:
            flow.run_call(head["procedure"], head["params"], ts)
        except Exception:  # a call that failed changed nothing, then as now
            pass
    elif kind == K.REJECT:
        if not eng.marks.taken(head["producer"], head["stream"], head["batch_id"]):
            eng.record_rejection(head["producer"], head["stream"], head["batch_id"], ts, head["code"], head["reason"])
    elif kind == K.DONE:
        pass
    elif kind == K.SPAN:
        flow.replay_span(pr.Span.from_log(head), tables)
    elif kind == K.FLOW:
        flow.replay_flow(pr.Flow.from_log(head), tables, ts)
    elif kind == K.MIGRATE:
        migration.replay(eng, ts, head, tables)
    elif kind == K.INTERVAL:
        flat = split_grouped(head["order"], head["runs"], tables)
        listed = [TeSpec.from_log(d) for d in head.get("specs", [])]  # format 4: specs by place
        for batch_ts, mark, specs, inputs in head["batches"]:
            relations = [flat[i] if i >= 0 else pa.table({}) for i in inputs]
            tes = [listed[s] if isinstance(s, int) else TeSpec.from_log(s) for s in specs]
            flow.replay_tes(batch_ts, tes, relations, None, mark)
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
        elif record.kind in (K.FRAGMENTS, K.SPAN, K.FLOW, K.MIGRATE):
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
